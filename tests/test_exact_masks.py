"""`--parity-mode exact`: common's dropout masks (common/data/masks.py) fed to every backend's
dropout."""

import json

import numpy as np
import pytest

from common.data.masks import (
    DropoutSite,
    MaskError,
    MaskFeed,
    draw_mask,
    draw_masks,
    drawing_feed,
    given_feed,
)
from tests.helpers import run_cli


def test_masks_keep_the_rate_and_scale_and_are_drawn_per_step_and_call():
    mask = draw_mask(7, 3, 1, (64, 1000), 0.1)
    assert mask.dtype == np.float32 and set(np.unique(mask)) == {np.float32(0), np.float32(1 / 0.9)}
    assert abs((mask > 0).mean() - 0.9) < 0.005  # 64,000 draws: the keep fraction within 5 sigma
    # a function of (seed, step, call)
    assert np.array_equal(mask, draw_mask(7, 3, 1, (64, 1000), 0.1))
    for other in (
        draw_mask(8, 3, 1, (64, 1000), 0.1),
        draw_mask(7, 4, 1, (64, 1000), 0.1),
        draw_mask(7, 3, 2, (64, 1000), 0.1),
    ):
        assert (other != mask).mean() > 0.1
    # a smaller draw is a prefix: the activation capture's one sequence sees step 0's first row
    assert np.array_equal(
        draw_mask(7, 0, 0, (1, 64, 8), 0.1), draw_mask(7, 0, 0, (4, 64, 8), 0.1)[:1]
    )
    sites = [DropoutSite((2, 3), 0.5), DropoutSite((4,), 0.25)]
    assert [m.shape for m in draw_masks(0, 0, sites)] == [(2, 3), (4,)] and str(
        sites[1]
    ) == "[4]@0.25"


def test_a_given_feed_refuses_a_call_no_mask_was_drawn_for():
    feed = given_feed(draw_masks(0, 0, [DropoutSite((2, 3), 0.5)]))
    assert feed.next((2, 3), 0.5).shape == (2, 3)
    with pytest.raises(
        MaskError, match=r"dropout call 1 takes a \[5\] input but the mask drawn for it is none"
    ):
        feed.next((5,), 0.5)


def test_torch_dropout_takes_the_masks_in_call_order_and_only_in_train_mode():
    torch = pytest.importorskip("torch")
    from torch_impl.masks import fed_dropout

    x = torch.randn(4, 6)
    model = torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Dropout(0.0), torch.nn.Dropout(0.5))
    with fed_dropout(drawing_feed(3, 2, torch.from_numpy)) as feed:
        y = model(x)
        # eval: no mask, no call
        assert torch.equal(torch.nn.functional.dropout(x, 0.3, training=False), x)
    expected = x.numpy() * draw_mask(3, 2, 0, (4, 6), 0.1) * draw_mask(3, 2, 1, (4, 6), 0.5)
    # the rate-0 dropout took no mask: the second call is p=0.5's
    assert np.array_equal(y.numpy(), expected)
    assert feed.sites == [DropoutSite((4, 6), 0.1), DropoutSite((4, 6), 0.5)]
    assert torch.nn.functional.dropout.__module__ == "torch.nn.functional"  # restored on leaving


def test_nnx_dropout_takes_the_masks_in_call_order_and_only_in_train_mode():
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from flax import nnx

    from jax_impl.masks import fed_dropout

    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 6), dtype=np.float32))
    drops = [
        nnx.Dropout(0.1, rngs=nnx.Rngs(0)),
        nnx.Dropout(0.0),
        nnx.Dropout(0.5, rngs=nnx.Rngs(1)),
    ]
    with fed_dropout(drawing_feed(3, 2, jnp.asarray)) as feed:
        y = drops[2](drops[1](drops[0](x)))
        assert drops[0](x, deterministic=True) is x
    expected = np.asarray(x) * draw_mask(3, 2, 0, (4, 6), 0.1) * draw_mask(3, 2, 1, (4, 6), 0.5)
    assert np.array_equal(np.asarray(y), expected)
    assert feed.sites == [DropoutSite((4, 6), 0.1), DropoutSite((4, 6), 0.5)]
    recording = MaskFeed()
    with fed_dropout(recording):  # no masks: records the calls and passes the input through
        assert drops[0](x) is x and recording.sites == [DropoutSite((4, 6), 0.1)]


@pytest.mark.error_case("exact-broadcast-dropout")
def test_exact_mode_refuses_an_nnx_dropout_that_shares_its_mask_across_axes():
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from flax import nnx

    from common.spec import SpecError
    from jax_impl.masks import fed_dropout

    drop = nnx.Dropout(0.1, broadcast_dims=(1,), rngs=nnx.Rngs(0))
    with fed_dropout(MaskFeed()), pytest.raises(SpecError) as err:
        drop(jnp.ones((2, 3)))
    assert str(err.value) == (
        "nnx.Dropout(broadcast_dims=(1,)) shares its mask across axes; common's masks are "
        "drawn per element: use the framework's masks for this model"
    )


@pytest.mark.slow
@pytest.mark.error_case("hlo-eager-torch")
def test_exact_mode_feeds_every_backend_the_same_masks_and_agrees_within_fp32(tmp_path):
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
        "4",
        "--set",
        "model.dropout=0.1",
        "--parity-mode",
        "exact",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "ok" and report["spec"]["train"]["dropout_masks"] == "common"
    sites = ["[16,64,64]@0.1"] * 5  # embeddings, then each of 2 blocks' attention and MLP outputs
    for name in ("torch", "torch_xla", "torchax"):
        parity = report["parity"][name]
        assert parity["passed"] and parity["first_divergent_step"] is None
        assert (
            parity["loss"]["max_abs"] < 1e-5 and parity["tensors"]["outputs/logits"]["abs"] < 1e-5
        )
        assert parity["dropout_sites"] == {"reference": sites, "other": sites, "equal": True}
        assert report["backends"][name]["compiles"]["steady_state"] in (0, None)
    # the masks did something: the same start without dropout reads
    # 5.56057 at step 0 on every backend
    assert abs(report["backends"]["jax"]["losses"][0] - 5.56057) > 1e-3
    assert report["backends"]["torch"]["hlo"] == {
        "available": False,
        "why": "eager: runs op by op, no compiled program",
    }


@pytest.mark.slow
@pytest.mark.error_case("hlo-no-hlo")
def test_exact_mode_names_a_port_that_drops_out_differently(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--out",
        str(out),
        "--quiet",
        "--backend",
        "jax,torch",
        "--spec",
        "gpt-tiny",
        "--steps",
        "3",
        "--set",
        "model.dropout=0.1",
        "--torch-set",
        "model.dropout=0.2",
        "--parity-mode",
        "exact",
        "--no-hlo",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert (
        report["status"] == "parity_failed"
        and report["parity"]["torch"]["first_divergent_step"] == 0
    )
    assert report["message"].startswith(
        "torch: parity failed: first divergent step 0, first divergent module "
    )
    assert (
        "dropout calls differ (5 in the reference, 5 here: run records' extra.dropout_sites)"
        in report["message"]
    )
    assert report["parity"]["torch"]["dropout_sites"]["other"] == ["[16,64,64]@0.2"] * 5
    assert report["backends"]["jax"]["hlo"] == {
        "available": False,
        "why": "no HLO file recorded (run with --no-hlo, or it did not finish)",
    }
