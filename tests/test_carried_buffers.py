"""A checkpoint's buffers other than running statistics (input statistics, counters, EMA weights,
persistent tables) are carried to every runtime, as `load_state_dict` puts them in place of the
factory's (issue 45, item 6): each buffer that both sides hold, linked by name as its start state
is, goes into the start file under its NNX name (`buffer/...`, its torch name in the file's
metadata), in its own dtype; the start state check says it was carried, not judged as built. The
model: tests/data/standardised, inputs standardised by statistics held in buffers."""

import json

import numpy as np
import pytest

from common.weights import CheckpointError, read_safetensors, save_checkpoint
from common.weights.carried import BUFFER_NAMES, buffer_metadata, carried_buffers, start_state
from tests.helpers import run_cli

TWINS = "tests/data/standardised/twins.py"
MEAN, STD = np.linspace(-2, 3, 8, dtype=np.float32), np.linspace(0.5, 4, 8, dtype=np.float32)


def test_the_buffers_both_sides_hold_are_written_under_their_nnx_names_and_read_back_as_they_were(
    tmp_path,
):
    buffers = {
        "stats.mean": MEAN,
        "num_updates": np.array(1200),
        "only_torch": np.ones(2, np.float32),
    }
    links = {"stats.mean": "norm.mean", "num_updates": "num_updates", "not_in_checkpoint": "other"}
    carried = carried_buffers(buffers, links)
    assert sorted(carried) == ["buffer/norm.mean", "buffer/num_updates"]
    save_checkpoint(
        tmp_path / "start.safetensors",
        {"w": np.zeros(2, np.float32), **carried},
        metadata=buffer_metadata(buffers, links),
    )
    state = start_state(f"canonical:{tmp_path / 'start.safetensors'}")
    assert state.statistics == {} and state.torch_names == {
        "norm.mean": "stats.mean",
        "num_updates": "num_updates",
    }
    np.testing.assert_array_equal(state.buffers["norm.mean"], MEAN)
    assert (
        state.buffers["num_updates"].dtype == np.int64 and int(state.buffers["num_updates"]) == 1200
    )

    save_checkpoint(tmp_path / "unnamed.safetensors", {"w": np.zeros(2, np.float32), **carried})
    with pytest.raises(
        CheckpointError, match="buffer norm.mean has no torch name in the file's metadata"
    ):
        start_state(f"canonical:{tmp_path / 'unnamed.safetensors'}")
    save_checkpoint(tmp_path / "garbled.safetensors", carried, metadata={BUFFER_NAMES: "{not json"})
    with pytest.raises(
        CheckpointError, match="its metadata's buffer_torch_names is not a JSON object of names"
    ):
        start_state(f"canonical:{tmp_path / 'garbled.safetensors'}")
    diverged = {**carried, "buffer/norm.mean": np.where(MEAN > 0, np.nan, MEAN)}
    save_checkpoint(
        tmp_path / "nan.safetensors", diverged, metadata=buffer_metadata(buffers, links)
    )
    with pytest.raises(CheckpointError, match="buffer norm.mean holds 5 NaN values; a start must"):
        start_state(f"canonical:{tmp_path / 'nan.safetensors'}")


def test_each_framework_takes_a_carried_buffer_by_its_own_name_in_its_own_dtype_and_shape():
    torch = pytest.importorskip("torch")
    from flax import nnx

    from common.weights.carried import StartState
    from jax_impl import convert as jax_convert
    from jax_impl.convert import to_canonical
    from tests.data.standardised.models import NnxStandardised, TorchStandardised
    from torch_impl import convert as torch_convert

    # (1,) for a ()
    state = StartState(
        buffers={"mean": MEAN, "std": STD, "num_updates": np.array([7])},
        torch_names={"mean": "mean", "std": "std", "num_updates": "num_updates"},
    )
    model = TorchStandardised(8, 16, 4).double()
    torch_convert.load_state(model, state, {})
    assert model.std.dtype == torch.float64 and model.std.numpy().tolist() == STD.tolist()
    assert model.num_updates.shape == () and int(model.num_updates) == 7

    rest = jax_convert.load_state(
        nnx.split(NnxStandardised(8, 16, 4, rngs=nnx.Rngs(0)), nnx.Param, ...)[2], state
    )
    loaded = to_canonical(rest)
    np.testing.assert_array_equal(np.asarray(loaded["mean"]), MEAN)
    assert loaded["num_updates"].shape == () and int(loaded["num_updates"]) == 7

    wrong = StartState(buffers={"std": np.ones(3, np.float32)}, torch_names={"std": "std"})
    with pytest.raises(
        CheckpointError, match="buffer std .* matches no buffer of that size in the torch model"
    ):
        torch_convert.load_state(TorchStandardised(8, 16, 4), wrong, {})
    with pytest.raises(
        CheckpointError, match="buffer std matches no Variable of its size of the NNX model"
    ):
        jax_convert.load_state(
            nnx.split(NnxStandardised(8, 16, 4, rngs=nnx.Rngs(0)), nnx.Param, ...)[2], wrong
        )


def _checkpoint(path):
    """The torch model as its trainer saved it: weights, and the training data's statistics in its
    buffers."""
    import torch

    from tests.data.standardised.models import TorchStandardised

    torch.manual_seed(1)
    model = TorchStandardised(8, 16, 4)
    model.mean.copy_(torch.from_numpy(MEAN))
    model.std.copy_(torch.from_numpy(STD))
    model.num_updates.fill_(1200)
    torch.save(model.state_dict(), path)
    return f"torch:{path}"


@pytest.mark.slow
def test_a_checkpoints_buffers_reach_every_runtime_and_are_compared_where_training_leaves_them(
    tmp_path,
):
    """The model that keeps an EMA of its inputs' mean and counts its updates (`running`), from a
    trained state_dict: every runtime starts from the checkpoint's buffers and ends with the same
    EMA and count, torchax too (it carries a buffer its forward updates through the jitted step)."""
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--twin",
        f"{TWINS}:running",
        "--backend",
        "all",
        "--checkpoint",
        _checkpoint(tmp_path / "trained.pt"),
        "--activations",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    arrays, _, metadata = read_safetensors(out / "start" / "init.safetensors", "start")
    np.testing.assert_array_equal(arrays["buffer/std"], STD)
    assert (
        arrays["buffer/num_updates"].dtype == np.int64 and int(arrays["buffer/num_updates"]) == 1200
    )
    assert json.loads(metadata[BUFFER_NAMES]) == {
        "mean": "mean",
        "std": "std",
        "num_updates": "num_updates",
    }
    report = json.loads((out / "report.json").read_text())
    assert report["start_state"]["carried"] == ["mean", "num_updates", "std"]
    assert report["start_state"]["compared"] == 0 and report["start_state"]["differ"] == []
    for name in ("jax", "torch", "torch_xla", "torchax"):
        record = json.loads((out / name / "record.json").read_text())
        assert record["extra"]["start"]["buffers"] == "3 from the checkpoint", name
    assert (
        "| std | std | carried from the checkpoint to both sides |"
        in (out / "report.md").read_text()
    )
    steps = report["spec"]["train"]["steps"]
    for name in ("jax", "torch", "torch_xla", "torchax"):
        trained = np.load(out / name / "tensors.npz")
        assert int(trained["buffers/num_updates"]) == 1200 + steps, name
        # the EMA moved from the checkpoint's
        assert np.abs(trained["buffers/mean"] - MEAN).max() > 0.1, name
        assert json.loads((out / name / "record.json").read_text())["extra"]["buffers_changed"] == [
            "mean",
            "num_updates",
        ], name  # the std, which training leaves, was judged at the start
    # under the NNX names, compared at the parameters' bounds
    for name in ("torch", "torch_xla", "torchax"):
        tensors = report["parity"][name]["tensors"]
        assert {k for k in tensors if k.startswith("buffers/")} == {
            "buffers/mean",
            "buffers/std",
            "buffers/num_updates",
        }, name
        assert all(tensors[k]["within"] for k in tensors if k.startswith("buffers/")), name
        assert (
            tensors["buffers/std"]["judged"] is False
            and "training changed it on neither side" in tensors["buffers/std"]["note"]
        )


@pytest.mark.slow
def test_a_port_whose_ema_follows_another_convention_fails_at_that_buffer(tmp_path):
    """The port reads torch's momentum 0.1 in flax's convention (0.1 of the old value kept):
    training, on each batch's own mean, agrees; the EMA, and the eval-mode forward that uses it, do
    not. Named at the buffer, after a start state check that passed (both factories build the same
    zeros)."""
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--twin",
        f"{TWINS}:running_misported",
        "--backend",
        "jax,torch",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert (
        report["start_state"]["differ"] == [] and "mean" in report["start_state"]["links"].values()
    )
    parity = report["parity"]["torch"]
    assert parity["first_divergent_step"] is None and parity["worst"][0]["name"] == "buffers/mean"
    assert (
        not parity["tensors"]["buffers/mean"]["within"]
        and parity["tensors"]["buffers/num_updates"]["within"]
    )
    assert (
        "though training agrees: buffers that training updates differ (1, e.g. mean"
        in report["message"]
    )


@pytest.mark.slow
@pytest.mark.parametrize("from_checkpoint, code", [(True, 1), (False, 0)])
def test_a_port_that_misuses_a_carried_buffer_fails_from_the_checkpoint_in_its_own_code(
    tmp_path, from_checkpoint, code
):
    """The port scales by the std where torch divides: the same model while the std is the factory's
    ones (from init it passes, as it must), another one from the trained checkpoint, named in the
    model's own code."""
    out = tmp_path / "run"
    start = ["--checkpoint", _checkpoint(tmp_path / "trained.pt")] if from_checkpoint else []
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(out),
        "--twin",
        f"{TWINS}:standardised_misported",
        "--backend",
        "jax,torch",
        "--activations",
        *start,
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    found = json.loads((out / "report.json").read_text())["parity"]["torch"][
        "first_divergent_module"
    ]
    if from_checkpoint:
        assert (found["module"], found["input_agrees"]) == ("(model)", True)
    else:
        assert found["module"] is None


def test_a_torch_runtimes_trained_buffers_take_the_nnx_names_their_start_state_links(tmp_path):
    from common.twin.start_state import STATE_LINKS, by_nnx_names, read_links

    assert read_links(tmp_path) == {}  # a built-in model: no links, nothing renamed
    (tmp_path / STATE_LINKS).write_text(
        json.dumps(
            {
                "links": {"stats.mean": "norm.mean", "count": "count"},
                "torch_only": ["norm.mean"],
                "nnx_only": [],
            }
        )
    )
    links = read_links(tmp_path)
    trained = {"stats.mean": MEAN, "count": np.array(3), "mask": np.ones(2), "norm.mean": STD}
    renamed = by_nnx_names(trained, links)
    # an unlinked buffer keeps its torch name (another torch runtime's is compared with it), unless
    # an NNX name of a linked one is that name: never two values under one name
    assert sorted(renamed) == ["count", "mask", "norm.mean"]
    np.testing.assert_array_equal(renamed["norm.mean"], MEAN)


def test_a_buffer_one_side_keeps_in_float32_in_a_float64_run_is_listed_not_judged():
    """HF keeps its rotary frequencies in float32 on purpose; a port may keep them in float64. Their
    rounding is not a port's (the start state check judged them as built, at float32's bounds); a
    counter's integer widths (int32 under JAX, int64 in torch) are no reason not to compare it."""
    from compare.judge.parity import compare_tensors
    from compare.judge.tolerances import load_policy

    ref = {"buffers": {"inv_freq": MEAN.astype(np.float64) / 3, "count": np.array(3, np.int32)}}
    other = {"buffers": {"inv_freq": (MEAN / 3).astype(np.float32), "count": np.array(4, np.int64)}}
    found = compare_tensors(ref, other, load_policy("default", "float64"))
    assert found["buffers/inv_freq"]["judged"] is False and found["buffers/inv_freq"]["within"]
    assert found["buffers/inv_freq"]["note"] == "not compared: float32 vs float64"
    assert found["buffers/count"]["within"] is False and found["buffers/count"].get("judged", True)


@pytest.mark.slow
@pytest.mark.error_case("checkpoint-buffer-missing", "checkpoint-buffer-nonfinite")
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            "drop num_updates",
            "it holds the model's buffers but not num_updates, a persistent buffer: the run would "
            "keep the model's own value of it, not the checkpoint's",
        ),
        ("nan std", "buffer std holds 1 NaN and 0 infinite values where the model's own holds"),
        ("inf mean", "buffer mean holds 0 NaN and 1 infinite values where the model's own holds"),
    ],
)
def test_a_checkpoints_buffers_are_held_to_the_parameters_rules(tmp_path, change, message):
    """A full state_dict whose persistent buffer is left out (the run kept the model's own value,
    silently), or whose buffer holds a NaN or an infinity the model's own does not (blamed on the
    forward, or trained on): refused in one line naming the buffer, before any run directory."""
    import torch

    ref = _checkpoint(tmp_path / "trained.pt")
    state = torch.load(tmp_path / "trained.pt")
    if change == "drop num_updates":
        del state["num_updates"]
    elif change == "nan std":
        state["std"][3] = float("nan")
    else:
        state["mean"][0] = float("inf")
    torch.save(state, tmp_path / "trained.pt")
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--twin",
        f"{TWINS}:running",
        "--backend",
        "jax,torch",
        "--checkpoint",
        ref,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert message in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
