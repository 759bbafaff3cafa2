"""The pytest plugin (registered as a `pytest11` entry point): a parity test of your own port is two
lines.

    def test_my_port(twin_parity):
        twin_parity("my_twin.py:my_model", steps=10)

`twin_parity(ref, **options)` runs `compare.check_twin` (options as there; a relative twin file is
found beside the test file), writes the run under pytest's tmp_path, returns the Report when parity
holds and fails the test with compare's parity message (first divergent step and module, worst
tensor, report path) when it does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compare.api import CompareError, Report, check_twin


def _beside(ref: str, test_dir: Path) -> str:
    target, sep, name = ref.rpartition(":")
    if sep and target.endswith(".py") and not Path(target).is_absolute():
        return f"{test_dir / target}:{name}"
    return ref


@pytest.fixture
def twin_parity(request, tmp_path):
    def check(ref: str, **options) -> Report:
        options.setdefault("out", tmp_path / "compare")
        try:
            report = check_twin(_beside(ref, request.path.parent), **options)
        except CompareError as e:
            pytest.fail(f"compare refused {ref}: {e}", pytrace=False)
        if not report.passed:
            pytest.fail(f"twin {ref} fails parity: {report.message}", pytrace=False)
        return report

    return check
