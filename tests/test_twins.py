"""The twins side by side in one process, in seconds: plain CPU torch (no XLA) against Flax NNX.

From the same canonical weights and the same batch, per model family: logits,
loss and every gradient (canonical names), then a few optimizer steps of the
real JAX trainer (optax) against `torch.optim` with the same lr schedule and
clip, and every module's step-0 activation (with the first module a port mistake
breaks). Most twin regressions show here long before the subprocess runs.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from common.data import activation_inputs, make_dataset  # noqa: E402
from common.presets import load_spec  # noqa: E402
from common.weights import init_params, param_infos  # noqa: E402
from compare.judge.backward import first_divergent_module_backward  # noqa: E402
from compare.judge.parity import first_divergent_module  # noqa: E402

CASES = [
    ("mlp-tiny", []),
    ("cnn-digits", []),
    ("gpt-tiny", []),
    # (make test-fast: 2 min)
    pytest.param("gpt-tiny", ["model.tied_embeddings=false"], marks=pytest.mark.slow),
    ("cnn-digits", ["model.pooling=flatten"]),
    ("mlp-tiny", ["train.optimizer=sgd", "train.momentum=0.9", "train.lr=0.05"]),
    pytest.param(
        "gpt-tiny",
        ["train.weight_decay_mask=matrices", "train.weight_decay=0.5"],
        marks=pytest.mark.slow,
    ),
]
# Measured on this CPU (fp32), worst case over CASES: logits 8.2e-7, gradients 1.4e-6 relative to
# the tensor's largest entry, losses 2.4e-6, parameters after 5 steps 1.2e-5 (mlp-tiny under Adam,
# whose division by sqrt(v) magnifies the tiny differences of near-zero gradients).
LOGITS_ATOL, GRAD_RTOL, GRAD_ATOL, PARAM_ATOL, LOSS_ATOL = 1e-5, 1e-5, 1e-9, 5e-5, 1e-5
STEPS = 5
# the default forward tolerance (compare/judge/tolerances.py)
ACTIVATION_BOUNDS = {"atol": 1e-5, "rtol": 1e-4}
GRAD_BOUNDS = {"atol": 1e-6, "rtol": 1e-3}  # and the gradients' one


def torch_side(spec, batches):
    """Eager torch on the CPU, written from the shared pieces as a user's loop would be."""
    from torch_impl.capture import capture_activations
    from torch_impl.convert import (
        correspondence,
        load_canonical,
        modules_to_canonical,
        to_canonical,
    )
    from torch_impl.models import build_model
    from torch_impl.optim import clip_gradients, make_optimizer, set_lr
    from torch_impl.train import cross_entropy

    model = load_canonical(
        build_model(spec.model), init_params(spec.model, spec.train.seed), spec.model
    )
    links = correspondence(model, spec.model)
    inputs, targets = (torch.from_numpy(a) for a in batches[0])
    logits = model(inputs)
    loss = cross_entropy(logits, targets)
    loss.backward()
    step0 = {
        "logits": logits.detach().numpy(),
        "loss": loss.item(),
        "grads": to_canonical({n: p.grad for n, p in model.named_parameters()}, links),
    }
    labels = torch.from_numpy(activation_inputs(spec, batches[0].targets))
    capture = capture_activations(
        model,
        torch.from_numpy(activation_inputs(spec, batches[0].inputs)),
        modules_to_canonical(model, spec.model),
        loss_of=lambda out: cross_entropy(out, labels),
    )
    step0.update(activations=capture.arrays, activation_grads=capture.grads)
    optimizer = make_optimizer(model.parameters(), spec.train)
    losses = []
    for step, (x, y) in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        set_lr(optimizer, spec.train, step)
        loss = cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        clip_gradients(model.parameters(), spec.train)
        optimizer.step()
        losses.append(loss.item())
    return step0, losses, to_canonical(model.state_dict(), links)


def jax_side(spec, batches):
    """The JAX backend's own trainer on one CPU device."""
    from driver.harness import RunOptions
    from jax_impl import sharding
    from jax_impl.instrument import CompileMonitor
    from jax_impl.train import make_trainer

    trainer = make_trainer(spec, RunOptions(), CompileMonitor())
    put = lambda b: sharding.put_batch(b, spec.mesh, trainer.mesh)
    assert all(
        np.array_equal(b.inputs, trainer.data.global_batch(s).inputs) for s, b in enumerate(batches)
    )
    tensors = trainer.step0_tensors()
    capture = trainer.step0_activations(
        activation_inputs(spec, batches[0].inputs), activation_inputs(spec, batches[0].targets)
    )
    step0 = {
        "logits": tensors["outputs"]["logits"],
        "loss": float(tensors["outputs"]["loss"]),
        "grads": tensors["grads"],
        "activations": capture.arrays,
        "activation_grads": capture.grads,
    }
    losses = [float(trainer.step(put(b))) for b in batches]
    return step0, losses, trainer.canonical_params()


@pytest.mark.parametrize("preset, overrides", CASES)
def test_torch_and_nnx_agree_in_one_process(preset, overrides):
    spec = load_spec(preset, [f"train.steps={STEPS}", *overrides])
    data = make_dataset(spec)
    batches = [data.global_batch(s) for s in range(STEPS)]
    t0, t_losses, t_params = torch_side(spec, batches)
    j0, j_losses, j_params = jax_side(spec, batches)

    assert np.max(np.abs(t0["logits"] - j0["logits"])) <= LOGITS_ATOL
    assert abs(t0["loss"] - j0["loss"]) <= LOSS_ATOL
    assert set(t0["grads"]) == set(j0["grads"])
    for name, grad in t0["grads"].items():
        # + an absolute floor: attention's key bias has a zero gradient in
        # exact arithmetic (~1e-12 here)
        bound = GRAD_RTOL * float(np.max(np.abs(grad))) + GRAD_ATOL
        assert np.max(np.abs(grad - j0["grads"][name])) <= bound, name
    common = set(t0["activations"]) & set(j0["activations"])
    assert {"(model)", "(model):in"} < common and len(common) >= 4, sorted(common)
    assert (
        first_divergent_module(j0["activations"], t0["activations"], ACTIVATION_BOUNDS)["module"]
        is None
    )
    # the loss's gradient at every module's output and input agrees too (the backward pass, step 0)
    assert (
        set(t0["activation_grads"]) <= set(t0["activations"])
        and "(model)" in j0["activation_grads"]
    )
    backward = first_divergent_module_backward(
        j0["activation_grads"], t0["activation_grads"], list(j0["activations"]), GRAD_BOUNDS
    )
    assert backward["module"] is None and backward["modules_compared"] >= 3, backward
    assert np.max(np.abs(np.array(t_losses) - np.array(j_losses))) <= LOSS_ATOL
    # step 0 of the loop is the parity step
    assert t_losses[0] == pytest.approx(t0["loss"], abs=1e-6)
    for name, value in t_params.items():
        assert np.max(np.abs(value - j_params[name])) <= PARAM_ATOL, name
    moved = max(
        float(np.max(np.abs(t_params[n] - v)))
        for n, v in init_params(spec.model, spec.train.seed).items()
    )
    assert moved > 1e-3  # the optimizer really stepped


def test_a_port_mistake_is_caught_in_one_process():
    """A deliberate difference (LayerNorm epsilon on one side) must fail the same checks."""
    spec = load_spec("gpt-tiny", ["train.steps=1"])
    other = load_spec("gpt-tiny", ["train.steps=1", "model.layernorm_eps=1e-1"])
    batches = [make_dataset(spec).global_batch(0)]
    t0, _, _ = torch_side(spec, batches)
    j0, _, _ = jax_side(other, batches)
    assert np.max(np.abs(t0["logits"] - j0["logits"])) > 100 * LOGITS_ATOL
    found = first_divergent_module(j0["activations"], t0["activations"], ACTIVATION_BOUNDS)
    # the first LayerNorm is the culprit
    assert found["module"] == "blocks.0.ln1" and found["input_agrees"]


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("mlp-tiny", []),
        ("cnn-digits", []),
        ("gpt-tiny", []),
        ("gpt-tiny", ["model.tied_embeddings=false"]),
        ("cnn-digits", ["model.pooling=flatten"]),
    ],
)
def test_canonical_round_trip_is_bit_identical(preset, overrides):
    """canonical -> each side's layout -> canonical, through the same-named functions on both
    sides."""
    from flax import nnx

    import jax_impl.convert
    import jax_impl.models
    import torch_impl.convert
    import torch_impl.models

    model_spec = load_spec(preset, overrides).model
    canonical = init_params(model_spec, seed=7)
    torch_model = torch_impl.convert.load_canonical(
        torch_impl.models.build_model(model_spec), canonical, model_spec
    )
    torch_back = torch_impl.convert.to_canonical(
        torch_model.state_dict(), torch_impl.convert.correspondence(torch_model, model_spec)
    )
    _, abstract, _ = nnx.split(jax_impl.models.build_model(model_spec), nnx.Param, ...)
    assert sorted(jax_impl.convert.to_canonical(abstract)) == sorted(param_infos(model_spec))
    jax_back = jax_impl.convert.to_canonical(
        jax_impl.convert.load_canonical(abstract, canonical, model_spec)
    )
    for back in (torch_back, {k: np.asarray(v) for k, v in jax_back.items()}):
        assert set(back) == set(canonical)
        for name, value in canonical.items():
            assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name


def test_layouts_are_converted():
    from torch_impl.convert import load_canonical
    from torch_impl.models import build_model

    spec = load_spec("gpt-tiny").model
    canonical = init_params(spec, 0)
    state = load_canonical(build_model(spec), canonical, spec).state_dict()
    qkv = state["blocks.0.attn.qkv.weight"].numpy()  # (3D, D), rows q | k | v
    assert qkv.shape == (192, 64)
    assert np.array_equal(qkv[64:128], canonical["blocks.0.attn.k.kernel"].T)
    assert np.array_equal(
        state["blocks.0.mlp.fc.weight"].numpy(), canonical["blocks.0.mlp.fc.kernel"].T
    )
    cnn = load_spec("cnn-digits").model
    c = init_params(cnn, 0)
    m = load_canonical(build_model(cnn), c, cnn)
    assert np.array_equal(
        m.state_dict()["convs.1.weight"].numpy(), c["convs.1.kernel"].transpose(3, 2, 0, 1)
    )


def test_shape_mismatch_names_the_tensor():
    from torch_impl.convert import load_canonical
    from torch_impl.models import build_model

    spec = load_spec("mlp-tiny").model
    canonical = init_params(spec, 0)
    canonical["head.kernel"] = np.zeros((256, 9), np.float32)
    with pytest.raises(ValueError, match="tensor head.kernel has shape"):
        load_canonical(build_model(spec), canonical, spec)


@pytest.mark.parametrize("mask", ["matrices", "all"])
def test_weight_decay_mask_spares_biases_and_norms(mask):
    """With zero gradients an AdamW step is pure decay: p <- p * (1 - lr * wd) where the mask
    decays, p unchanged where it does not; the same values from torch's param groups and optax's
    mask."""
    import optax

    from jax_impl.optim import make_optimizer as optax_optimizer
    from torch_impl.optim import make_optimizer as torch_optimizer

    spec = load_spec(
        "gpt-tiny",
        [
            "train.schedule=constant",
            "train.schedule_warmup_steps=0",
            "train.lr=0.1",
            "train.weight_decay=0.5",
            "train.grad_clip=0",
            f"train.weight_decay_mask={mask}",
        ],
    )
    start = {k: v + 1.0 for k, v in init_params(spec.model, 0).items()}  # no zeros: decay must show
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in start.items()}
    optimizer = torch_optimizer(params.values(), spec.train)
    for p in params.values():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    tx = optax_optimizer(spec.train)
    jax_params = {k: jax.numpy.asarray(v) for k, v in start.items()}
    updates, _ = tx.update(
        jax.tree.map(jax.numpy.zeros_like, jax_params), tx.init(jax_params), jax_params
    )
    stepped = optax.apply_updates(jax_params, updates)
    shrink = np.float32(1 - 0.1 * 0.5)
    for name, value in start.items():
        decayed = mask == "all" or value.ndim >= 2
        want = value * shrink if decayed else value
        for got in (params[name].detach().numpy(), np.asarray(stepped[name])):
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
        if not decayed:  # biases and LayerNorm scales: exactly untouched
            assert np.array_equal(params[name].detach().numpy(), value), name
    assert {
        "blocks.0.ln1.scale",
        "blocks.0.attn.q.bias",
        "wte.embedding",
        "blocks.0.mlp.fc.kernel",
    } <= set(start)
