"""`--checkpoint FORMAT:PATH`, parsed once per process into one type (stdlib only, below
common.weights)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.vocab import CheckpointFormat, values


class CheckpointError(ValueError):
    """A checkpoint that does not fit the spec; the message names the tensor."""


@dataclass(frozen=True)
class CheckpointRef:
    """Which format a checkpoint is in and where it lies, and the reference as it was given (`str`
    gives it back: what a backend is passed and what messages name)."""

    format: CheckpointFormat
    path: Path
    text: str

    @classmethod
    def parse(cls, ref: str | Path) -> CheckpointRef:
        """'hf:DIR', 'torch:model.pt', 'canonical:x.safetensors', 'orbax:DIR', or a bare path
        (canonical)."""
        text = str(ref)
        fmt, sep, path = text.partition(":")
        if not sep or fmt not in values(CheckpointFormat):
            # 'xyz:path' with an unknown format (not C:\\...)
            if sep and "/" not in fmt and len(fmt) > 1:
                raise CheckpointError(
                    f"--checkpoint {text!r}: unknown format {fmt!r}; use "
                    f"{' | '.join(values(CheckpointFormat))}:PATH"
                )
            return cls(CheckpointFormat.CANONICAL, Path(text), text)
        if not path:
            raise CheckpointError(f"--checkpoint {text!r} names no path after {fmt}:")
        return cls(CheckpointFormat(fmt), Path(path), text)

    @classmethod
    def of(cls, ref: CheckpointRef | str | Path | None) -> CheckpointRef | None:
        """A reference as it is (parsed already), or parsed (a caller that holds only the text: a
        test, a tool)."""
        return ref if isinstance(ref, CheckpointRef) or ref is None else cls.parse(ref)

    def __str__(self) -> str:
        return self.text

    @property
    def canonical_path(self) -> Path | None:
        """The file, where the checkpoint is canonical safetensors (every backend reads it as it
        is)."""
        return self.path if self.format == CheckpointFormat.CANONICAL else None
