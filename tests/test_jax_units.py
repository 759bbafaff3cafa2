"""Fast in-process checks of the JAX twin's pieces (one CPU device)."""

import pytest

jax = pytest.importorskip("jax")

from common.presets import load_spec  # noqa: E402


def test_optimizer_matches_torch_semantics():
    """SGD weight decay is L2 before momentum; the clip uses torch's +1e-6."""
    import jax.numpy as jnp

    from jax_impl.optim import make_optimizer

    spec = load_spec(
        "mlp-tiny",
        [
            "train.optimizer=sgd",
            "train.lr=0.1",
            "train.momentum=0.9",
            "train.weight_decay=0.5",
            "train.grad_clip=0",
        ],
    ).train
    tx = make_optimizer(spec)
    p, g = {"w": jnp.array([2.0])}, {"w": jnp.array([1.0])}
    state = tx.init(p)
    u1, state = tx.update(g, state, p)  # buf = g + wd*p = 2 ; step = -lr*buf
    assert float(u1["w"][0]) == pytest.approx(-0.2)
    u2, _ = tx.update(g, state, p)  # buf = 0.9*2 + 2 = 3.8
    assert float(u2["w"][0]) == pytest.approx(-0.38)
    clip = make_optimizer(
        load_spec(
            "mlp-tiny",
            ["train.optimizer=sgd", "train.lr=1", "train.weight_decay=0", "train.grad_clip=1"],
        ).train
    )
    u, _ = clip.update({"w": jnp.array([3.0, 4.0])}, clip.init(p), p)  # norm 5 -> scale 1/(5+1e-6)
    assert float(u["w"][0]) == pytest.approx(-3.0 / (5.0 + 1e-6), rel=1e-6)


@pytest.mark.error_case("twin-bf16-no-dtype-arg")
def test_bfloat16_on_a_twin_whose_nnx_factory_takes_no_dtype_is_refused():
    import jax.numpy as jnp

    from common.spec import SpecError
    from common.twin import twin_run_spec
    from jax_impl.models import build_model
    from tests.helpers import REPO

    spec = twin_run_spec(f"{REPO}/tests/data/user_project/twins.py:net")
    with pytest.raises(SpecError) as err:
        build_model(spec.model, jnp.bfloat16)
    assert str(err.value).endswith(
        "names no nnx_dtype_arg, so its NNX side cannot compute in bfloat16; add one "
        "to the Twin or run float32"
    )


@pytest.mark.slow
@pytest.mark.error_case("twin-bf16-no-dtype-arg")
def test_compare_refuses_bfloat16_without_a_dtype_arg_before_the_torch_side_trains(tmp_path):
    from tests.helpers import run_cli

    twin = "tests/data/user_project/twins.py:net"
    args = ("compare", "--twin", twin, "--dtype", "bfloat16", "--out", str(tmp_path / "x"))
    proc = run_cli(*args, "--backend", "jax,torch")
    assert proc.returncode == 2 and not (tmp_path / "x").exists()
    assert proc.stderr.strip().endswith(
        "net names no nnx_dtype_arg, so its NNX side cannot compute in bfloat16; add one to the "
        "Twin or run float32"
    )
    # no NNX-side backend runs: the torch side alone computes in bfloat16 under autocast
    assert run_cli(*args, "--backend", "torch", "--steps", "1").returncode == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_summary_made_on_the_device_is_the_hosts_but_for_rounding_and_passes_as_its_second_pass(
    dtype,
):
    """--tensors summary on jax (jax_impl/summary.py): the statistics reduced on the device, the
    sampled values gathered there. Shape, sample, largest magnitude and counts equal the host's
    summary of the same values; the sums differ by float32 rounding only, which a second pass's
    reproduction check allows a summary made on the devices (and nothing more), never one the host
    made."""
    import dataclasses

    import jax.numpy as jnp
    import numpy as np

    from common.files.tensor_summary import summarize
    from compare.runs.second_pass import _differs
    from jax_impl.summary import device_summary
    from tests.helpers import assert_summary_agrees_with_the_hosts, device_summary_case

    name, host = device_summary_case()
    x = jnp.asarray(host, dtype)
    ours = device_summary(name, x)
    theirs = summarize(name, np.asarray(x.astype(jnp.float32)))
    assert_summary_agrees_with_the_hosts(ours, theirs)
    # a summary the host made is reproduced bit for bit or not at all: one ulp more in its sum is
    # another run's
    nudged = {**theirs.stats, "sum": float(np.nextafter(theirs.stats["sum"], np.inf))}
    assert _differs(theirs, dataclasses.replace(theirs, stats=nudged)).startswith("sum ")
    moved = theirs.values.copy()
    moved[7] = np.nextafter(moved[7], np.float32(1))  # one sampled value one ulp off: another run's
    assert _differs(ours, dataclasses.replace(theirs, values=moved)) == "sampled values that differ"
    grown = {
        **theirs.stats,
        "sum": theirs.stats["sum"] + 1e-3 * np.sqrt(theirs.stats["count"] * theirs.stats["sum_sq"]),
    }
    assert _differs(ours, dataclasses.replace(theirs, stats=grown)).startswith("sum ")
