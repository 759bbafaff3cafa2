"""Real text as token data, with nothing downloaded: the Python language reference that every
CPython ships (`pydoc_data.topics`: ~470 kB of English prose and code), byte-level encoded
(vocabulary 256, one token per UTF-8 byte), written as nanoGPT's `train.bin` (a flat uint16 stream)
for `data.dataset=tokens-file`. The built-in gpt twins' vocabulary is 256: they learn it as it is.

    python -m common.data.text runs/pydoc.bin
    python -m compare --set data.dataset=tokens-file --set data.path=runs/pydoc.bin
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

from common.files.fsutil import atomic_path

VOCAB_SIZE = 256  # byte-level


def pydoc_text() -> str:
    """The reference's topics in a fixed (sorted) order; the text is the running Python's own."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def write_tokens(path: str | Path, text: str) -> dict:
    """The UTF-8 bytes of `text` as uint16 tokens in `path` (atomically); returns what was
    written."""
    tokens = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    with atomic_path(path) as tmp:
        tokens.tofile(tmp)
    return {
        "path": str(path),
        "tokens": int(tokens.size),
        "vocab_size": VOCAB_SIZE,
        "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()[:16],
        "source": f"pydoc_data.topics of Python {sys.version.split()[0]}",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m common.data.text", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out", type=Path, help="the .bin to write, e.g. runs/pydoc.bin")
    args = parser.parse_args(argv)
    info = write_tokens(args.out, pydoc_text())
    print(
        f"{info['path']}: {info['tokens']} byte tokens (vocabulary {VOCAB_SIZE}) from "
        f"{info['source']}, "
        f"sha256 {info['sha256']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
