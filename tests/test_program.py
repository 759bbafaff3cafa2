"""The compiled step summarised per backend (report.json `backends.<name>.hlo`, report.md) and
`python -m compare.hlo`, checked against counts taken another way from the same HLO text."""

import json
import re

import pytest

from analysis.hlo import buffer_assignment_memory, program_summary
from tests.helpers import run_cli, train

SMALL_MODULE = """HloModule m, entry_computation_layout={(f32[8,4]{1,0}, f32[4,4]{1,0})->(f32[8,4]{1,0})}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused (p0: f32[8,4], p1: f32[4,4]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[4,4]{1,0} parameter(1)
  %d = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[8,4]{1,0} tanh(%d)
}

ENTRY %main (x: f32[8,4], w: f32[4,4]) -> (f32[8,4], f32[4,4]) {
  %x = f32[8,4]{1,0} parameter(0)
  %w = f32[4,4]{1,0} parameter(1)
  %f = f32[8,4]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused
  %c = f32[8,4]{0,1} copy(%f)
  %ar = (f32[8,4]{1,0}, /*index=1*/bf16[4,4]{1,0}) all-reduce(%c, %w), replica_groups={}, to_apply=%add
  %g0 = f32[8,4]{1,0} get-tuple-element(%ar), index=0
  %m = f32[8,4]{1,0} multiply(%g0, %g0)
  %cc = f32[8,4]{1,0} custom-call(%m), custom_call_target="Sharding"
  ROOT %out = (f32[8,4]{1,0}, f32[4,4]{1,0}) tuple(%cc, %w)
}
"""  # noqa: E501 (HLO text as XLA writes it)

BUFFER_ASSIGNMENT = """BufferAssignment:
allocation 0: size 128, parameter 0, shape |f32[8,4]| at ShapeIndex {}:
allocation 1: size 128, maybe-live-out:
allocation 2: size 4, constant:
allocation 3: size 4, thread-local:
allocation 4: size 256, preallocated-temp:
Total bytes used: 516 (516B)
"""


def test_summary_counts_of_a_known_module():
    s = program_summary(SMALL_MODULE)
    # kernels: fusion, copy, all-reduce, multiply, custom-call (the reducer's add and the fused dot
    # run inside other kernels; parameters, get-tuple-element and tuple launch nothing)
    assert s["kernels"] == 5
    assert s["fusions"] == {"kOutput": 1}
    assert (s["dot"], s["unfused_dot_or_convolution"], s["unfused_elementwise"], s["copies"]) == (
        1,
        0,
        1,
        1,
    )
    assert s["collectives"] == {
        "all-reduce": {"count": 1, "elements": 48, "bytes": 8 * 4 * 4 + 4 * 4 * 2}
    }
    assert s["custom_calls"] == {"Sharding": 1}
    assert s["largest_buffers"][0]["name"] == "ar" and s["largest_buffers"][0]["bytes"] == 160


def test_buffer_assignment_memory():
    assert buffer_assignment_memory(BUFFER_ASSIGNMENT) == {
        "argument_size_in_bytes": 128,
        "output_size_in_bytes": 128,
        "constant_size_in_bytes": 4,
        "temp_size_in_bytes": 256,
        "total_bytes_used": 516,
    }


def _entry(text: str) -> str:
    """Each module's ENTRY computation and the computations it `call`s (XLA:CPU wraps a kernel it
    splits across threads in one), cut out by brace position rather than by parsing instructions."""
    blocks = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^(?:ENTRY )?%(\S+) .*?^}", text, re.MULTILINE | re.DOTALL)
    }
    entries = [b for b in blocks.values() if b.startswith("ENTRY")]
    called = [
        blocks[name] for b in entries for name in re.findall(r" call\(.*to_apply=%([\w.\-]+)", b)
    ]
    return "\n".join(entries + called)


def _independent_all_reduce(text: str) -> tuple[int, int]:
    count, nbytes = 0, 0
    for line in _entry(text).splitlines():
        line = re.sub(r"/\*.*?\*/", "", line)
        if " all-reduce(" in line or " all-reduce-start(" in line:
            count += 1
            result_type = line.split("=", 1)[1].split("all-reduce")[0]
            for dtype, dims in re.findall(r"(f32|bf16|s32)\[([\d,]*)\]", result_type):
                n = 1
                for d in filter(None, dims.split(",")):
                    n *= int(d)
                nbytes += n * {"f32": 4, "bf16": 2, "s32": 4}[dtype]
    return count, nbytes


@pytest.mark.slow
@pytest.mark.error_case("hlo-torch-xla-bytes")
def test_report_sets_both_compiled_programs_side_by_side_under_data_parallelism(
    jax_single, tmp_path
):
    out = tmp_path / "dp2"
    proc = run_cli(
        "compare",
        "--out",
        str(out),
        "--quiet",
        "--spec",
        "gpt-tiny",
        "--steps",
        "3",
        "--mesh",
        "data=2",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    for name in ("jax", "torch_xla"):
        program = report["backends"][name]["hlo"]
        text = (out / program["hlo_file"]).read_text()
        count, nbytes = _independent_all_reduce(text)
        assert count >= 1 and program["collectives"]["all-reduce"] == {
            "count": count,
            "bytes": nbytes,
            "elements": program["collectives"]["all-reduce"]["elements"],
        }
        # every gradient is all-reduced: at least the parameters' bytes (gpt-tiny: 136,896 floats)
        assert nbytes >= 136_896 * 4, (name, nbytes)
        entry = _entry(text)
        for kind, n in program["fusions"].items():
            assert n == len(re.findall(rf"\bfusion\(.*kind={kind.split('(')[0]}\b", entry)), (
                name,
                kind,
            )
        assert program["memory"]["peak_bytes"] > program["memory"]["argument_size_in_bytes"] > 0
    assert report["backends"]["jax"]["hlo"]["memory_source"] == "compiled.memory_analysis()"
    assert report["backends"]["torch_xla"]["hlo"]["memory_source"] == "XLA buffer-assignment dump"
    assert "bytes_accessed" in report["backends"]["torch_xla"]["hlo"]["not_available"]
    md = (out / "report.md").read_text()
    assert (
        "## Compiled step, per settled step (most different first)" in md
        and "| all-reduce count |" in md
    )

    diff = run_cli("compare.hlo", str(jax_single("gpt-tiny")), str(out), "--backend", "jax")
    assert diff.returncode == 0, diff.stderr
    assert (
        re.search(r"ops only in B: .*all-reduce", diff.stdout)
        and "ops only in A: none" in diff.stdout
    )
    assert re.search(r"all-reduce count\s+│\s+-\s+│\s+1\s+│", diff.stdout)


@pytest.mark.slow
@pytest.mark.error_case(
    "hlo-cli-missing",
    "hlo-cli-no-backend",
    "hlo-cli-no-program",
    "hlo-cli-corrupt-record",
    "profile-eager-torch",
)
def test_hlo_diff_refuses_what_has_no_program(tmp_path):
    def refused(a, *more) -> str:
        proc = run_cli("compare.hlo", str(a), *more)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        return proc.stderr.strip()

    assert (
        refused(tmp_path / "missing", tmp_path)
        == f"error: {tmp_path / 'missing'}: no such file or directory (give an HLO text file or a "
        "run directory)"
    )
    eager = train(
        "torch_impl", tmp_path / "torch", "--spec", "mlp-tiny", "--steps", "2", "--profile", "2"
    )
    # --profile is ignored, said why
    assert eager.profile["why"].startswith("eager torch writes no XProf trace")
    assert (
        refused(tmp_path / "torch", tmp_path / "torch")
        == f"error: {tmp_path / 'torch'} (torch) has no compiled program: eager: runs op by op, "
        "no compiled program"
    )
    (tmp_path / "report.json").write_text(
        json.dumps({"backend_names": ["torch"], "reference": "torch"})
    )
    assert (
        refused(tmp_path, tmp_path, "--backend", "torchax")
        == f"error: {tmp_path} has no backend 'torchax' (it ran torch); pick one with --backend"
    )
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "record.json").write_text('{"backend": "ja')
    assert refused(tmp_path / "bad", tmp_path / "torch").startswith(
        f"error: run record {tmp_path / 'bad' / 'record.json'} is not valid JSON (truncated or "
        "corrupt)"
    )
