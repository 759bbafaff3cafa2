import numpy as np
import pytest

from common.presets import load_spec
from common.weights import (
    CheckpointError,
    init_params,
    jitter,
    load_checkpoint,
    param_count,
    param_infos,
    save_checkpoint,
)


def test_gpt2_small_has_124m_parameters():
    assert param_count(load_spec("gpt2-small").model) == 124_439_808


def test_canonical_names_and_layouts():
    infos = param_infos(load_spec("gpt-tiny", ["model.tied_embeddings=false"]).model)
    assert infos["blocks.0.attn.q.kernel"].shape == (64, 64)
    assert infos["blocks.1.mlp.fc.kernel"].shape == (64, 256)  # (in, out)
    assert infos["blocks.1.mlp.proj.kernel"].shape == (256, 64)
    assert infos["lm_head.kernel"].shape == (64, 256)
    assert "lm_head.kernel" not in param_infos(load_spec("gpt-tiny").model)
    cnn = param_infos(load_spec("cnn-digits").model)
    assert cnn["convs.0.kernel"].shape == (3, 3, 1, 16)  # HWIO
    assert cnn["head.kernel"].shape == (32, 10)


def test_init_is_deterministic_and_follows_documented_scales():
    model = load_spec("gpt-tiny").model
    a, b = init_params(model, seed=3), init_params(model, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["wte.embedding"], init_params(model, seed=4)["wte.embedding"])
    assert a["wte.embedding"].dtype == np.float32
    assert a["wte.embedding"].std() == pytest.approx(0.02, rel=0.05)
    assert a["blocks.0.attn.o.kernel"].std() == pytest.approx(0.02 / np.sqrt(4), rel=0.1)
    assert np.all(a["blocks.0.ln1.scale"] == 1) and np.all(a["blocks.0.attn.q.bias"] == 0)
    mlp = init_params(load_spec("mlp-tiny").model, 0)
    assert mlp["hidden.0.kernel"].std() == pytest.approx(np.sqrt(1 / 784), rel=0.02)


def test_init_of_a_tensor_does_not_depend_on_the_others():
    small = init_params(load_spec("gpt-tiny", ["model.n_layers=1"]).model, 0)
    big = init_params(load_spec("gpt-tiny", ["model.n_layers=2"]).model, 0)
    assert np.array_equal(small["wte.embedding"], big["wte.embedding"])


def test_checkpoint_round_trip_is_bit_identical(tmp_path):
    model = load_spec("cnn-digits").model
    params = init_params(model, 0)
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, params, {"spec": "cnn-digits"})
    loaded = load_checkpoint(path, model)
    assert list(loaded) == list(params) or set(loaded) == set(params)
    for k in params:
        assert loaded[k].dtype == params[k].dtype and np.array_equal(loaded[k], params[k]), k
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]  # no temp file left


def test_checkpoint_mismatch_names_the_tensor(tmp_path):
    model = load_spec("mlp-tiny").model
    params = init_params(model, 0)
    params["hidden.1.kernel"] = np.zeros((256, 255), np.float32)
    save_checkpoint(tmp_path / "bad.safetensors", params)
    with pytest.raises(
        CheckpointError,
        match=r"tensor hidden.1.kernel has shape \(256, 255\), the spec needs \(256, 256\)",
    ):
        load_checkpoint(tmp_path / "bad.safetensors", model)
    del params["hidden.1.kernel"]
    save_checkpoint(tmp_path / "missing.safetensors", params)
    with pytest.raises(CheckpointError, match="tensor hidden.1.kernel is missing"):
        load_checkpoint(tmp_path / "missing.safetensors", model)
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors", model)


def test_jitter_moves_every_start_weight_one_unit_in_the_last_place_alike_on_every_backend():
    params = init_params(load_spec("gpt-tiny", []).model, seed=0)
    moved = jitter(params, 1, seed=0)
    assert jitter(params, 0, seed=0) is params and moved.keys() == params.keys()
    ups = 0
    for name, p in params.items():
        q = moved[name]
        assert q.dtype == p.dtype == np.float32 and q.shape == p.shape
        up, down = np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(-np.inf))
        # one ulp, never more: zeros become the smallest subnormal
        assert np.all((q == up) | (q == down)), name
        ups += int(np.count_nonzero(q == up))
    total = sum(p.size for p in params.values())
    assert abs(ups / total - 0.5) < 0.01  # up or down as the seed draws, half each
    again = jitter(params, 1, seed=0)
    assert all(np.array_equal(again[n], moved[n]) for n in params)  # the same draw in every process
    other = jitter(params, 1, seed=1)
    assert any(not np.array_equal(other[n], moved[n]) for n in params)
    two = jitter(params, 2, seed=0)["blocks.0.mlp.fc.kernel"]
    p = params["blocks.0.mlp.fc.kernel"]
    assert np.all(np.abs(two.astype(np.float64) - p) <= 2 * np.spacing(np.abs(p)) + 1e-45)
    assert jitter({"step": np.arange(3)}, 1, seed=0)["step"].tolist() == [0, 1, 2]  # integers stay


def test_start_scale_moves_one_tensor_on_its_side_and_names_an_unknown_one():
    """train.start_scale: a deliberate difference of a chosen size (tests/test_compare.py finds it
    end to end)."""
    from common.presets import load_spec
    from common.weights import CheckpointError, adjusted_start

    params = init_params(load_spec("gpt-tiny").model, 0)
    moved = adjusted_start(
        params, load_spec("gpt-tiny", ["train.start_scale=blocks.0.mlp.fc.kernel*1.5"]).train
    )
    assert np.array_equal(
        moved["blocks.0.mlp.fc.kernel"], params["blocks.0.mlp.fc.kernel"] * np.float32(1.5)
    )
    assert moved["blocks.0.mlp.fc.kernel"].dtype == np.float32
    assert all(moved[k] is params[k] for k in params if k != "blocks.0.mlp.fc.kernel")
    with pytest.raises(
        CheckpointError, match=r"train.start_scale=nope\*2: nope is not a parameter of this model"
    ):
        adjusted_start(params, load_spec("gpt-tiny", ["train.start_scale=nope*2"]).train)
    with pytest.raises(ValueError, match=r"train.start_scale=nope must read NAME\*FACTOR"):
        load_spec("gpt-tiny", ["train.start_scale=nope"])
