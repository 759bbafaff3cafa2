"""A user's own small classifier, once in torch.nn and once in Flax NNX (a throwaway project's file:
the toolkit reaches it only through twins.py)."""

import jax
import torch
from flax import nnx
from torch import nn


class TorchNet(nn.Module):
    def __init__(self, input_shape: int, hidden: int, num_classes: int):
        super().__init__()
        self.fc1 = nn.Linear(input_shape, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-5)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


class NnxNet(nnx.Module):
    def __init__(
        self, input_shape: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs, gelu: bool = False
    ):
        self.fc1 = nnx.Linear(input_shape, hidden, rngs=rngs)
        self.norm = nnx.LayerNorm(hidden, epsilon=1e-5, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, num_classes, rngs=rngs)
        self.activation = jax.nn.gelu if gelu else jax.nn.relu

    def __call__(self, x):
        return self.fc2(self.activation(self.norm(self.fc1(x))))


def nnx_net_misported(**hparams):
    """The port reached for GELU where the torch model uses ReLU."""
    return NnxNet(**hparams, gelu=True)


def nnx_net_renamed(input_shape, hidden, num_classes, *, rngs):
    net = NnxNet(input_shape, hidden, num_classes, rngs=rngs)
    net.out = net.fc2  # a head named differently from torch's fc2
    del net.fc2
    return net


def raises(**hparams):
    raise ValueError("hidden must be even")


def not_a_module(**hparams):
    return {"fc1": None}


def check_batch(n: int) -> None:
    """A limit the user's forward enforces on its input, the same on both sides."""
    if n > 8:
        # in brackets as a C++ library's location reads (gloo's "[/pytorch/.../pair.cc:547]"): text
        # compare prints as it is, never as rich markup
        raise ValueError(
            f"[/data/batches.cc:57] the net takes at most 8 examples per batch, got {n}"
        )


class TorchNetSmallBatches(TorchNet):
    def forward(self, x):
        check_batch(x.shape[0])
        return super().forward(x)


class NnxNetSmallBatches(NnxNet):
    def __call__(self, x):
        check_batch(x.shape[0])  # runs while the jitted step traces
        return super().__call__(x)


class TorchModelOutput(TorchNet):  # as a Hugging Face model returns its outputs
    def forward(self, x):
        from transformers.modeling_outputs import SequenceClassifierOutput

        return SequenceClassifierOutput(logits=super().forward(x), hidden_states=(x,))


class NnxLogitsAndHidden(NnxNet):  # (logits, hidden state), as many ports return
    def __call__(self, x):
        return super().__call__(x), x


class TorchScores(TorchNet):  # its logits under a name of its own
    def forward(self, x):
        return {"scores": super().forward(x)}


class TorchReadsValue(TorchNet):  # a value read into Python: runs eagerly, not under jax.jit
    def forward(self, x):
        hidden = torch.relu(self.norm(self.fc1(x)))
        if hidden.max() > 1e6:  # a guard on a value, as training code writes one
            hidden = hidden / hidden.max()
        return self.fc2(hidden)


class _LinearFunction(torch.autograd.Function):
    """y = x W^T + b with a hand-written backward, as fused or custom kernels are wrapped.
    `clamped`: the mis-port's backward passes the input gradient back through max(W, 0), a bug its
    forward never shows."""

    @staticmethod
    def forward(ctx, x, weight, bias, clamped: bool):
        ctx.save_for_backward(x, weight)
        ctx.clamped = clamped
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ (weight.clamp(min=0) if ctx.clamped else weight)
        return grad_x, grad.t() @ x, grad.sum(0), None


class CustomLinear(nn.Linear):
    def __init__(self, *args, clamped: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.clamped = clamped

    def forward(self, x):
        return _LinearFunction.apply(x, self.weight, self.bias, self.clamped)


class TorchNetCustomBackward(TorchNet):
    """TorchNet whose head runs a custom autograd function."""

    def __init__(self, input_shape: int, hidden: int, num_classes: int, clamped: bool = False):
        super().__init__(input_shape, hidden, num_classes)
        self.fc2 = CustomLinear(hidden, num_classes, clamped=clamped)


def torch_net_backward_misported(**hparams):
    """The forward agrees with NnxNet's; the head's backward does not."""
    return TorchNetCustomBackward(**hparams, clamped=True)


class TorchNetFixesFloat32Later(TorchNet):
    """Its first layer follows the run's dtype; its second is fed float32 on purpose (`.float()`
    past the first layer): it cannot run in a float64 run, where fc2 is float64."""

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))).float())


class TorchNetFixesFloat32(TorchNet):
    """Its input cast to float32 on purpose (`x.float()`, as code written for float32 does): it
    cannot run in a float64 run, where fc1 is float64."""

    def forward(self, x):
        return super().forward(x.float())
