"""python -m driver.describe_sides MODULE ARGS... [--then MODULE ARGS...]: the describe steps of a twin's
sides run one after the other in one interpreter.

compare describes each side of a twin in the interpreter of the backends that run it (compare/runs/prepare.py).
Where both sides have the same one (the CPU default, a GPU machine), one process describes both: a twin file
imports both frameworks, so two processes paid both imports twice (~2 CPU-s a twin compare). Each MODULE's
`main(argv)` runs in turn (`torch_impl.describe`, `jax_impl.describe`); the first that fails ends the process
with its exit code, and compare tells which side it was from the files each side writes. This module imports
no framework itself: the modules it is given do.
"""
from __future__ import annotations

import importlib
import sys

from common.protocol import THEN
from driver.process import exit_process


def steps(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[(module, its argv)] from `MODULE ARGS... --then MODULE ARGS...`."""
    out, current = [], []
    for arg in [*argv, THEN]:
        if arg != THEN:
            current.append(arg)
        elif current:
            out.append((current[0], current[1:]))
            current = []
    return out


def main(argv: list[str]) -> int:
    for module, args in steps(argv):
        code = importlib.import_module(module).main(args)
        if code:
            return code
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
