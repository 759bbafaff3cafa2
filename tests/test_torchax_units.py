"""torchax pieces in one process: BatchNorm's running statistics, which torchax 0.0.13 computes but
drops."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
pytest.importorskip("torchax")


def test_batchnorm_running_statistics_follow_torch_through_a_jitted_functional_call():
    import torchax

    from torchax_impl.batch_norm import keep_running_statistics

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    reference.load_state_dict(model.state_dict())
    env = torchax.default_env()
    keep_running_statistics(env)
    states, _ = torchax.extract_jax(model)
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(4, 3, 6, 6)).astype(np.float32)

    def call(states, x):
        tensors, args = env.j2t_iso((states, (x,)))
        with env:
            out = torch.func.functional_call(model, tensors, args, tie_weights=False)
        return env.t2j_iso(out), {
            k: env.t2j_iso(tensors[k]) for k in ("1.running_mean", "1.running_var")
        }

    out, stats = jax.jit(call)(states, jax.numpy.asarray(x))
    with torch.no_grad():
        expected = reference(torch.from_numpy(x))
    np.testing.assert_allclose(np.asarray(out), expected.numpy(), atol=1e-5)
    # torch's formula: momentum 0.1, the unbiased batch variance
    np.testing.assert_allclose(
        np.asarray(stats["1.running_mean"]), reference[1].running_mean.numpy(), atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(stats["1.running_var"]), reference[1].running_var.numpy(), atol=1e-5
    )
    assert float(np.abs(np.asarray(stats["1.running_mean"])).max()) > 0.01  # they moved


def test_torchax_gives_the_padding_row_a_gradient_its_op_watch_sees_it_and_the_match_undoes_it():
    """common/runtime_behaviours.py `embedding-padding-idx`, as torchax 0.0.13 does it: the padding
    row takes a gradient (eager torch's is zero); the op check's watch notes the padding_idx; the
    matched lowering gives that row none and every other row torchax's own."""
    import torchax

    from torchax_impl.embedding import OP, honour_padding_idx
    from torchax_impl.ops import OpsWatch

    torch.manual_seed(0)
    embedding = torch.nn.Embedding(6, 3, padding_idx=2)
    env = torchax.default_env()
    ids = np.array([[2, 1, 2, 5]])
    SCALE = np.arange(12, dtype=np.float32).reshape(1, 4, 3) + 1  # noqa: N806

    def gradient():
        states, _ = torchax.extract_jax(embedding)

        def loss(states):
            tensors, args = env.j2t_iso((states, (jax.numpy.asarray(ids),)))
            with env:
                out = torch.func.functional_call(embedding, tensors, args)
            return (env.t2j_iso(out) * SCALE).sum()

        return np.asarray(jax.grad(loss)(states)["weight"])

    eager = embedding.weight.detach().clone().requires_grad_()
    looked_up = torch.nn.functional.embedding(torch.from_numpy(ids), eager, padding_idx=2)
    (looked_up * torch.from_numpy(SCALE)).sum().backward()
    expected = eager.grad.numpy().copy()
    watch = OpsWatch()
    with watch:
        as_is = gradient()
    assert np.abs(as_is[2]).min() > 0 and not expected[2].any()  # the behaviour
    assert watch.found(None)["behaviours"] == {"embedding-padding-idx": {"padding_idx": [2]}}
    own = env._ops.get(OP)
    try:
        honour_padding_idx(env)
        matched = gradient()
    finally:
        if own is None:
            env._ops.pop(OP, None)
        else:
            env._ops[OP] = own
    np.testing.assert_allclose(matched, expected, atol=1e-6)
    np.testing.assert_array_equal(np.delete(matched, 2, 0), np.delete(as_is, 2, 0))
