"""A twin's own batches (task custom, common/data/batches.py): a numpy function or an .npz of named
arrays, fed to the forward by name; a source that breaks its contract is one line and exit 2 before
any backend trains."""

import json

import numpy as np
import pytest

from tests.helpers import run_cli

TWINS = "tests/data/batch_sources/twins.py"


def compare(out, twin: str, *args, backends: str = "jax,torch"):
    return run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--twin",
        f"{TWINS}:{twin}",
        "--backend",
        backends,
        *args,
    )


@pytest.mark.slow
@pytest.mark.error_case("data-file-bad")
@pytest.mark.parametrize(
    "twin, message",
    [
        (
            "shape_changes",
            r"batches.py:shape_changes: step 2: 'x' is float32 \(8, 9\), at step 0 float32 \(8, "
            r"8\); a "
            "batch keeps its shapes and dtypes from step to step",
        ),
        (
            "nonfinite",
            "batches.py:nonfinite: step 1: 'target' holds a NaN or Inf; every float array must be "
            "finite",
        ),
        (
            "out_of_range",
            r"batches.py:out_of_range: step 0: 'c' spans 0..4, outside its declared range \[0, 4\)",
        ),
        (
            "extra_key",
            "batches.py:extra_key: the forward of the torch side takes no argument 'weights' .*; "
            "name the "
            "keys only the loss reads in the twin's loss_keys",
        ),
        (
            "ignores_seed",
            "batches.py:ignores_seed: step 0 drawn twice differs in 'x'; a batch source gives the "
            "same "
            "arrays for the same seed and step",
        ),
        (
            "float_ids",
            "batches.py:float_ids: step 0: 'c' is float64, and its declared range .* makes it "
            "ids: give it "
            "as an integer array",
        ),
        (
            "beyond_int32",
            r"batches.py:beyond_int32: step 0: 'ids' spans 1099511627776..1099511627776, beyond "
            r"int32 "
            r"\(JAX computes in int32 and would wrap them\); give integers within int32",
        ),
        (
            "raises_at_step_3",
            "batches.py:raises_at_step_3: step 3 raised ValueError: "
            "the shard for step 3 is missing",
        ),
        (
            "exits_at_step_2",
            r"batches.py:exits_at_step_2: step 2 called sys.exit\('no more data'\); a batch "
            r"source returns its arrays",
        ),
        (
            "loss_key_missing",
            "batches.py:good: the twin's loss_keys name 'noise', which it does not give "
            r"\(it gives c, target, x\); name in loss_keys only keys of its batches",
        ),
    ],
)
def test_a_batch_source_that_breaks_its_contract_is_one_line_before_anything_trains(
    tmp_path, twin, message
):
    out = tmp_path / "run"
    proc = compare(out, twin)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, (
        proc.stderr[-2000:]
    )
    assert __import__("re").search(message, errors[0]), errors[0]
    assert not out.exists()  # refused in the describe step: no backend started, no run directory


@pytest.mark.slow
def test_named_arrays_from_a_function_or_an_npz_feed_the_forward_by_name(tmp_path):
    proc = compare(tmp_path / "function", "good")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "function" / "report.json").read_text())
    losses = report["backends"]["jax"]["losses"]
    assert len(losses) == 4 and losses == pytest.approx(
        report["backends"]["torch"]["losses"], abs=1e-6
    )
    record = json.loads((tmp_path / "function" / "jax" / "record.json").read_text())
    assert record["extra"]["batch_arrays"] == {
        "x": {"shape": [8, 8], "dtype": "float32", "to": "forward"},
        "c": {"shape": [8], "dtype": "int32", "to": "forward"},
        "target": {"shape": [8, 8], "dtype": "float32", "to": "loss"},
    }
    assert record["extra"]["loss"] == {"torch": "models.py:torch_loss", "nnx": "models.py:nnx_loss"}
    # on a data-parallel mesh each backend slices the named arrays over its devices, as its own data
    proc = compare(tmp_path / "mesh", "good", "--mesh", "data=2", backends="jax,torch_xla,torchax")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name, backend in json.loads((tmp_path / "mesh" / "report.json").read_text())[
        "backends"
    ].items():
        assert backend["losses"] == pytest.approx(losses, abs=1e-6), name
        # a 1-D array (c) reaches torch_xla's loader as (B, 1): reshaped in the step, the timed
        # steps after the loop recompile nothing (they did, when it was reshaped as the loader
        # fetched it)
        assert backend["compiles"]["steady_state"] == 0, (name, backend["compiles"]["causes"])
    # the same kind of batch from an .npz: 20 examples visited in a seeded order, every array by the
    # same rows
    rng = np.random.default_rng(0)
    arrays = {
        "x": rng.standard_normal((20, 8)).astype(np.float32),
        "c": rng.integers(0, 4, 20).astype(np.int32),
        "target": rng.standard_normal((20, 8)).astype(np.float32),
    }
    np.savez(tmp_path / "named.npz", **arrays)
    users = (tmp_path / "named.npz").read_bytes()
    proc = compare(
        tmp_path / "npz",
        "good",
        "--set",
        "data.dataset=arrays",
        "--set",
        f"data.path={tmp_path / 'named.npz'}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    npz = json.loads((tmp_path / "npz" / "report.json").read_text())["backends"]
    assert npz["jax"]["losses"] == pytest.approx(npz["torch"]["losses"], abs=1e-6)
    assert abs(npz["jax"]["losses"][0] - losses[0]) > 1e-3  # other data: other losses
    assert (tmp_path / "named.npz").read_bytes() == users  # the user's file is read, never written
    # nothing beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["function", "mesh", "named.npz", "npz"]
    np.savez(tmp_path / "ragged.npz", **{**arrays, "c": arrays["c"][:19]})
    proc = compare(
        tmp_path / "ragged",
        "good",
        "--set",
        "data.dataset=arrays",
        "--set",
        f"data.path={tmp_path / 'ragged.npz'}",
    )
    assert (
        proc.returncode == 2
        and "must all have the same number of rows (examples), found [19, 20]" in proc.stderr
    )


@pytest.mark.slow
@pytest.mark.error_case("data-file-bad")
def test_an_npz_of_float64_features_trains_a_float32_run_and_one_lacking_a_key_is_refused(
    tmp_path,
):
    """Float arrays reach both sides in the run's float width: float64 features in a float32 run
    train on every side alike (torch used to crash on them after JAX had trained). An npz without
    an argument the forward needs is refused before anything runs, naming it (both backends used
    to crash with "missing 1 required positional argument")."""
    rng = np.random.default_rng(0)
    arrays = {
        "x": rng.standard_normal((20, 8)),  # float64, as numpy makes them
        "c": rng.integers(0, 4, 20).astype(np.int32),
        "target": rng.standard_normal((20, 8)),
    }
    np.savez(tmp_path / "wide.npz", **arrays)
    np.savez(tmp_path / "lacking.npz", **{k: v for k, v in arrays.items() if k != "c"})
    data = ("--set", "data.dataset=arrays", "--set")
    proc = compare(tmp_path / "wide", "good", *data, f"data.path={tmp_path / 'wide.npz'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    backends = json.loads((tmp_path / "wide" / "report.json").read_text())["backends"]
    assert backends["jax"]["losses"] == pytest.approx(backends["torch"]["losses"], abs=1e-6)
    proc = compare(tmp_path / "lacking", "good", *data, f"data.path={tmp_path / 'lacking.npz'}")
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "needs 'c', which the batches do not give (they give x)" in errors[0], errors[0]
    assert not (tmp_path / "lacking").exists()


@pytest.mark.slow
def test_every_output_a_forward_returns_is_compared_by_name(tmp_path):
    proc = compare(tmp_path / "run", "two_outputs", backends="jax,torch,torchax")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    for name in ("torch", "torchax"):
        tensors = report["parity"][name]["tensors"]
        assert {"outputs/logits", "outputs/features", "outputs/loss"} <= set(tensors)
        assert (
            tensors["outputs/features"]["within"]
            and tensors["outputs/features"]["elements"] == 8 * 8
        )
    # a second output no loss reads, computed otherwise: training agrees, step 0's outputs do not
    # no capture run
    proc = compare(tmp_path / "misported", "two_outputs_misported", "--activations")
    assert proc.returncode == 1, proc.stderr[-2000:]
    parity = json.loads((tmp_path / "misported" / "report.json").read_text())["parity"]["torch"]
    assert parity["worst"][0]["name"] == "outputs/features" and parity["first_divergent_step"] == 0
    assert (
        parity["tensors"]["outputs/logits"]["within"]
        and parity["loss"]["first_divergent_step"] is None
    )


@pytest.mark.slow
@pytest.mark.error_case("twin-loss-not-scalar")
@pytest.mark.parametrize(
    "twin, message",
    [
        (
            "loss_per_element",
            r"loss\['torch'\]='models.py:torch_loss_per_element' returns shape \(1, 8\); a loss "
            r"returns "
            r"a scalar \(reduce it, e.g. with .mean\(\)\)",
        ),
        (
            "loss_int_torch",
            r"loss\['torch'\]='models.py:torch_loss_int' returns torch.int64; a loss returns a "
            r"float "
            "scalar",
        ),
        (
            "loss_int_nnx",
            r"loss\['nnx'\]='models.py:nnx_loss_int' returns int32; a loss returns a float scalar",
        ),
        (
            "loss_python_number",
            r"loss\['torch'\]='models.py:loss_python_number' returns a int; a loss returns its "
            "framework's float scalar",
        ),
        (
            "loss_model_without_one",
            r"the forward of torch='models.py:TorchNet' returns a Tensor with no scalar 'loss' "
            "entry or attribute; the twin's loss='model' needs a forward that computes its own",
        ),
    ],
)
def test_an_own_loss_that_cannot_be_trained_on_is_refused_before_anything_trains(
    tmp_path, twin, message
):
    out = tmp_path / "run"
    proc = compare(out, twin)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, (
        proc.stderr[-2000:]
    )
    assert __import__("re").search(
        rf"twin '[^']*batch_sources/twins.py:{twin}': {message}", errors[0]
    ), errors[0]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.error_case("data-file-bad")
@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda a: {k: v for k, v in a.items() if k != "target"},
            "the twin's loss_keys name 'target', which it does "
            r"not give \(it gives c, x\)",
        ),
        (
            lambda a: {**a, "c": a["c"].astype(np.uint64) + 2**33},
            r"'c' spans 858993459\d\.\.858993459\d, beyond int32",
        ),
    ],
)
def test_an_npz_that_breaks_the_twins_contract_is_one_line_before_anything_trains(
    tmp_path, change, message
):
    rng = np.random.default_rng(0)
    arrays = {
        "x": rng.standard_normal((20, 8)).astype(np.float32),
        "c": rng.integers(0, 4, 20).astype(np.int32),
        "target": rng.standard_normal((20, 8)).astype(np.float32),
    }
    np.savez(tmp_path / "named.npz", **change(arrays))
    users = (tmp_path / "named.npz").read_bytes()
    proc = compare(
        tmp_path / "run",
        "good",
        "--set",
        "data.dataset=arrays",
        "--set",
        f"data.path={tmp_path / 'named.npz'}",
    )
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, (
        proc.stderr[-2000:]
    )
    assert __import__("re").search(message, errors[0]), errors[0]
    assert not (tmp_path / "run").exists() and (tmp_path / "named.npz").read_bytes() == users
