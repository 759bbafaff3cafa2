"""One recompile vocabulary: provoked recompiles (common/provoke.py) named by cause on every
backend."""

import json

import numpy as np
import pytest

from analysis.recompile import classify_graph_change, classify_jax
from common.data import Batch
from common.provoke import parse_provocation, provoked_batch, python_value, with_python_value
from common.spec import SpecError
from common.vocab import RecompileCause
from tests.helpers import run_cli

# JAX 0.10's own explanations, as logged in a provoked run
JAX_SHAPE = (
    "TRACING CACHE MISS at loop.py:75 (timed_step):\n  for _train_step defined at loop.py:48\n"
    "  all previously seen cache keys differ. For the closest previous key:\n  different input "
    "types:\n"
    "  * at batch.inputs, now i32[8,64] and before i32[16,64]\n"
    "  * at batch.targets, now i32[8,64] and before i32[16,64]"
)
JAX_DTYPE = JAX_SHAPE.replace(
    "now i32[8,64] and before i32[16,64]\n  * at batch.targets, now i32[8,64] and before "
    "i32[16,64]",
    "now i16[8,64] and before i32[8,64]",
)
JAX_STATIC = (
    "  for _train_step defined at loop.py:48\n  different input pytree:\n"
    "  * at input path [1]['python_value'], now <class 'jax._src.tree_util.Static'> with pytree "
    "metadata "
    "Static(val=8.0) and before <class "
    "'jax._src.tree_util.Static'> with pytree metadata Static(val=1.0), so the pytree node "
    "metadata does "
    "not match"
)


def test_jax_explanations_in_the_shared_vocabulary():
    assert classify_jax(JAX_SHAPE) == (
        RecompileCause.INPUT_SHAPE,
        "batch.inputs i32[16,64] -> i32[8,64]; batch.targets i32[16,64] -> i32[8,64]",
    )
    assert classify_jax(JAX_DTYPE) == (
        RecompileCause.INPUT_DTYPE,
        "batch.inputs i32[8,64] -> i16[8,64]",
    )
    assert classify_jax(JAX_STATIC) == (
        RecompileCause.PYTHON_VALUE,
        "static argument [1]['python_value'] 1.0 -> 8.0",
    )
    assert classify_jax("nothing we know")[0] == RecompileCause.UNKNOWN


GRAPH = """HloModule g
ENTRY %g (p0: f32[4], p1: f32[]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  %c = f32[] constant(7)
  %b = f32[4]{0} broadcast(%c), dimensions={}
  ROOT %m = f32[4]{0} multiply(%p0, %b)
}
"""


def test_graph_changes_in_the_shared_vocabulary():
    fed = ((16, 64), "int32")
    assert classify_graph_change(GRAPH, GRAPH, fed, ((8, 64), "int32")) == (
        RecompileCause.INPUT_SHAPE,
        "batch inputs (16, 64) -> (8, 64)",
    )
    assert (
        classify_graph_change(GRAPH, GRAPH, fed, ((16, 64), "int64"))[0]
        == RecompileCause.INPUT_DTYPE
    )
    assert classify_graph_change(GRAPH, GRAPH.replace("constant(7)", "constant(9)"), fed, fed) == (
        RecompileCause.PYTHON_VALUE,
        "graph constants 7 -> 9",
    )
    added = GRAPH.replace(
        "ROOT %m = f32[4]{0} multiply(%p0, %b)",
        "%m = f32[4]{0} multiply(%p0, %b)\n  ROOT %t = f32[4]{0} tanh(%m)",
    )
    assert classify_graph_change(GRAPH, added, fed, fed) == (
        RecompileCause.NEW_PROGRAM,
        "ops added: tanh; removed: none",
    )
    assert classify_graph_change(GRAPH, GRAPH, fed, fed)[0] == RecompileCause.UNKNOWN


def test_provocations_change_only_what_they_say():
    shape, dtype, value = (
        parse_provocation(t) for t in ("input-shape@3", "input-dtype@5", "python-value@7")
    )
    batch = Batch(np.arange(32, dtype=np.int32).reshape(4, 8), np.zeros((4, 8), np.int32))
    assert provoked_batch(batch, 2, [shape, dtype], np.int16).inputs.shape == (4, 8)
    late = provoked_batch(batch, 5, [shape, dtype], np.int16)
    assert (
        late.inputs.shape == (2, 8)
        and late.inputs.dtype == np.int16
        and late.targets.shape == (2, 8)
    )
    assert (late.inputs == batch.inputs[:2]).all()
    assert [python_value(s, [value], 9) for s in (0, 6, 7, 8, 12)] == [1.0, 1.0, 8.0, 9.0, 9.0]
    assert python_value(7, [shape], 9) is None
    loss = np.float32(2.3456789)
    assert with_python_value(loss, 8.0) == loss and with_python_value(loss, None) is loss
    for bad in ("input-shape", "shape@3", "input-dtype@0", "python-value@x"):
        with pytest.raises(
            SpecError,
            match="expected CAUSE@STEP with CAUSE one of input-shape, input-dtype, "
            "python-value and STEP >= 1",
        ):
            parse_provocation(bad)


@pytest.mark.slow
@pytest.mark.error_case("provoke-syntax", "provoke-spec-cannot")
def test_provocations_a_spec_cannot_take_are_refused_in_one_line():
    proc = run_cli("jax_impl", "--spec", "mlp-tiny", "--provoke-recompile", "input-dtype@2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: --provoke-recompile input-dtype@2: input-dtype changes integer token ids; "
        "mlp-tiny takes float inputs (use a language model such as gpt-tiny)"
    )
    proc = run_cli("compare", "--steps", "4", "--provoke-recompile", "input-shape@4")
    assert proc.returncode == 2 and "step 4 is not before train.steps=4" in proc.stderr


@pytest.mark.slow
def test_three_provoked_causes_are_named_alike_on_every_compiling_backend(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--out",
        str(out),
        "--quiet",
        "--backend",
        "all",
        "--spec",
        "gpt-tiny",
        "--steps",
        "9",
        "--set",
        "model.n_layers=1",  # one block: the same causes, quicker compiles
        "--provoke-recompile",
        "input-shape@3",
        "--provoke-recompile",
        "input-dtype@5",
        "--provoke-recompile",
        "python-value@7",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    expected = [(3, "input-shape"), (5, "input-dtype"), (7, "python-value"), (8, "python-value")]
    for name in ("jax", "torch_xla", "torchax"):
        compiles = report["backends"][name]["compiles"]
        assert compiles["steady_state"] == 4, name
        assert [(c["step"], c["kind"]) for c in compiles["causes"]] == expected, (
            name,
            compiles["causes"],
        )
    jax_causes = report["backends"]["jax"]["compiles"]["causes"]
    assert "batch.inputs i32[16,64] -> i32[8,64]" in jax_causes[0]["cause"]
    assert "batch.inputs i32[8,64] -> i16[8,64]" in jax_causes[1]["cause"]
    assert "Static(val=8.0)" in jax_causes[2]["framework"]
    xla_causes = report["backends"]["torch_xla"]["compiles"]["causes"]
    assert "batch inputs (16, 64) -> (8, 64)" in xla_causes[0]["cause"]
    assert "batch inputs int32 -> int64" in xla_causes[1]["cause"]
    # its frame
    assert all(
        "Graph Hash" in c["framework"] and "timed_step" in c["framework"] for c in xla_causes
    )
    assert report["backends"]["torch"]["compiles"]["causes"] == []  # eager: nothing compiles
    # the provocations change no number: every backend still matches the reference
    assert report["verdict"] == "pass" and max(report["pairwise_loss"].values()) < 1e-5
    md = (out / "report.md").read_text()
    assert (
        "## Steady-state recompiles and their causes" in md
        and "| torch_xla | 5 | input-dtype |" in md
    )
