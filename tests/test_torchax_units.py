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
