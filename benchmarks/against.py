"""python -m benchmarks.against REV: is the default `python -m compare --backend both` slower than
at REV?

Checks REV out into a temporary git worktree and runs the default command from
it and from this working tree, interleaved (old, new, old, new, ...), so machine
drift falls on both alike. This tree's runs start from an empty compile cache
(what a first run pays). Prints each run's wall time and the ratio of the
medians (new / old); writes the JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.runs import REPO, timed
from benchmarks.timing import spread


def default_compare(tree: Path, out: Path, extra: list[str]) -> float:
    cmd = [
        sys.executable,
        "-m",
        "compare",
        "--backend",
        "both",
        "--quiet",
        "--out",
        str(out),
        *extra,
    ]
    return timed(cmd, f"compare in {tree}", cwd=tree)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.against", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("rev", help="the git revision to compare against, e.g. c89ddbb or main~3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="against-") as tmp:
        old_tree = Path(tmp) / "old"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(old_tree), args.rev],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        try:
            walls = {"old": [], "new": []}
            for i in range(args.repeats):
                walls["old"].append(default_compare(old_tree, Path(tmp) / f"old-{i}", []))
                walls["new"].append(
                    default_compare(
                        REPO,
                        Path(tmp) / f"new-{i}",
                        ["--compile-cache", str(Path(tmp) / f"cache-{i}")],
                    )
                )
                print(
                    f"repeat {i + 1}: old {walls['old'][-1]:.2f} s, new {walls['new'][-1]:.2f} s",
                    flush=True,
                )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(old_tree)],
                cwd=REPO,
                capture_output=True,
            )
    result = {
        "rev": args.rev,
        "wall_s": {k: spread(v) for k, v in walls.items()},
        "new_over_old": statistics.median(walls["new"]) / statistics.median(walls["old"]),
    }
    print(
        f"default compare: new / old ({args.rev}) = {result['new_over_old']:.3f} "
        f"(medians {result['wall_s']['new']['median']:.2f} / "
        f"{result['wall_s']['old']['median']:.2f} s)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
