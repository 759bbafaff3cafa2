"""torch.nn twins of the spec's models: MLP, CNN, GPT (same classes, same order as jax_impl).

Plain torch, no torch_xla: eager PyTorch and PyTorch/XLA run these same modules.

torch layouts differ from the canonical ones and `convert.py` bridges them:
Linear weight (out, in), Conv2d weight OIHW with NCHW activations (NHWC data
is permuted at the model boundary), and packed attention `attn.qkv` (3*D, D)
as in nanoGPT. Every numeric choice comes from the spec: LayerNorm epsilon
(torch defaults to 1e-5, NNX to 1e-6), GELU form, symmetric conv padding,
causal mask, tied embeddings. The attention is written out with the same ops
as the JAX twin (no fused SDPA kernel).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from common.spec import CNNSpec, MLPSpec, ModelSpec, TransformerSpec
from common.twin import TwinError, factory_error, forward_kwargs_of, hparams_of, resolve, twin_of
from common.twin.outputs import use_forward_kwargs
from torch_impl import ranks


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """`t` in float32 where it is narrower (a bfloat16 forward's logits, scores), float64 where it
    is float64."""
    return t if t.dtype == torch.float64 else t.float()


def as_fed(inputs, train):
    """What the forward is fed (a tensor, or a twin's named tensors): floats in bfloat16 where the
    model is loaded in bfloat16 (TrainSpec.loads_bfloat16), as its users cast pixels to
    `model.dtype`; as they are otherwise."""
    if not train.loads_bfloat16:
        return inputs
    if isinstance(inputs, dict):
        return {k: as_fed(v, train) for k, v in inputs.items()}
    return inputs.to(torch.bfloat16) if inputs.is_floating_point() else inputs


ACTIVATIONS = {
    "relu": F.relu,
    "tanh": torch.tanh,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_exact": lambda x: F.gelu(x, approximate="none"),
}


class MLP(nn.Module):
    def __init__(self, spec: MLPSpec):
        super().__init__()
        sizes = (spec.input_size, *spec.hidden_sizes)
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.head = nn.Linear(sizes[-1], spec.num_classes)
        self.activation = ACTIVATIONS[spec.activation]

    def forward(self, x):  # (B, input_size) -> (B, classes)
        for layer in self.hidden:
            x = self.activation(layer(x))
        return self.head(x)


class CNN(nn.Module):
    def __init__(self, spec: CNNSpec):
        super().__init__()
        convs, c_in = [], spec.input_shape[2]
        for c_out, k, s, p in zip(spec.channels, spec.kernel_sizes, spec.strides, spec.paddings):
            convs.append(nn.Conv2d(c_in, c_out, kernel_size=k, stride=s, padding=p))
            c_in = c_out
        self.convs = nn.ModuleList(convs)
        h, w = spec.feature_map_hw()
        n_features = c_in if spec.pooling == "global_avg" else h * w * c_in
        self.head = nn.Linear(n_features, spec.num_classes)
        self.activation = ACTIVATIONS[spec.activation]
        self.pooling = spec.pooling

    def forward(self, x):  # (B, H, W, C) -> (B, classes)
        x = x.permute(0, 3, 1, 2)  # NHWC data -> NCHW for Conv2d
        for conv in self.convs:
            x = self.activation(conv(x))
        if self.pooling == "global_avg":
            x = x.mean(dim=(2, 3))  # (B, C)
        else:
            x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # (B, H*W*C), HWC order like the twin
        return self.head(x)


class Attention(nn.Module):
    """Causal self-attention; q, k, v packed in one Linear (3*D, D)."""

    def __init__(self, spec: TransformerSpec):
        super().__init__()
        d = spec.d_model
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.n_heads = spec.n_heads

    def forward(self, x):  # (B, T, D)
        b, t, d = x.shape
        hd = d // self.n_heads
        # (B, T, H, hd)
        q, k, v = (z.reshape(b, t, self.n_heads, hd) for z in self.qkv(x).split(d, dim=2))
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)  # (B, H, T, T)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = at_least_float32(scores).masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(x.dtype)
        y = torch.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, d)
        return self.o(y)


class FeedForward(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.fc = nn.Linear(spec.d_model, spec.d_ff)
        self.proj = nn.Linear(spec.d_ff, spec.d_model)
        self.gelu = ACTIVATIONS["gelu_" + spec.gelu]

    def forward(self, x):
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.ln1 = nn.LayerNorm(spec.d_model, eps=spec.layernorm_eps)
        self.attn = Attention(spec)
        self.ln2 = nn.LayerNorm(spec.d_model, eps=spec.layernorm_eps)
        self.mlp = FeedForward(spec)
        self.dropout = nn.Dropout(spec.dropout)
        self.pre_layernorm = spec.pre_layernorm

    def forward(self, x):
        if self.pre_layernorm:
            x = x + self.dropout(self.attn(self.ln1(x)))
            return x + self.dropout(self.mlp(self.ln2(x)))
        x = self.ln1(x + self.dropout(self.attn(x)))
        return self.ln2(x + self.dropout(self.mlp(x)))


class GPT(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.seq_len, spec.d_model)
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layers))
        self.ln_f = nn.LayerNorm(spec.d_model, eps=spec.layernorm_eps)
        self.lm_head = (
            None if spec.tied_embeddings else nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        )

    def forward(self, tokens):  # (B, T) int -> (B, T, vocab)
        t = tokens.shape[1]
        positions = torch.arange(t, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight) if self.lm_head is None else self.lm_head(x)


# The built-in twins' torch factories (common/twin/ BUILTIN): called with the spec's fields.
def mlp(**hparams) -> MLP:
    return MLP(MLPSpec(**hparams))


def cnn(**hparams) -> CNN:
    return CNN(CNNSpec(**hparams))


def gpt(**hparams) -> GPT:
    return GPT(TransformerSpec(**hparams))


def build_model(spec: ModelSpec, seed: int = 0, dtype: str = "float32") -> nn.Module:
    """The twin's torch model on the CPU, from its factory (`common.twin`), seeded. Parameter values
    come from convert.load_canonical. Built for real, not on the meta device: a model on the meta
    device imports torch's reference decompositions at its first init call (2.7 s measured on this
    CPU, more than initialising gpt-tiny), and a user's constructor computes buffers (rotary tables,
    say).

    dtype float64 (a float64 run, TrainSpec.state_dtype): torch's default dtype is float64 from here
    on in this process, as a user's float64 run sets it, so that the constructor's buffers and the
    tensors the forward makes are float64, and the model's floating parameters and buffers are
    float64.

    dtype bfloat16 (a run loaded in bfloat16, TrainSpec.param_dtype): built under torch's bfloat16
    default, as Hugging Face's `from_pretrained(torch_dtype=torch.bfloat16)` builds it, the default
    put back after; parameters and the buffers the constructor makes in the default dtype are
    bfloat16, those it makes in a dtype of its own (a rotary table's float32) stay so."""
    if dtype == "float64":
        torch.set_default_dtype(torch.float64)
    with default_dtype(torch.bfloat16 if dtype == "bfloat16" else torch.get_default_dtype()):
        model = _built(spec, seed)
    return model.to(torch.float64) if dtype == "float64" else model


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype is `dtype` inside, the one before it after."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _built(spec: ModelSpec, seed: int) -> nn.Module:
    """The twin's factory called, seeded, and checked to give a module."""
    twin = twin_of(spec)
    factory = resolve(twin.torch, twin.base_dir)
    use_forward_kwargs(forward_kwargs_of(twin, "torch"))
    torch.manual_seed(seed)
    kwargs = hparams_of(spec)
    if twin.torch_mesh_arg:  # its ranks' mesh over the run's processes (None: all on this one)
        kwargs[twin.torch_mesh_arg] = ranks.DEVICE_MESH
    try:
        model = factory(**kwargs)
    except Exception as e:
        fields = {twin.torch_mesh_arg: "torch_mesh_arg"} if twin.torch_mesh_arg else {}
        raise factory_error("torch factory", twin.torch, e, kwargs, factory, fields) from None
    if not isinstance(model, nn.Module):
        raise TwinError(
            f"torch factory {twin.torch} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model
