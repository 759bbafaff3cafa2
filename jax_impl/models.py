"""Flax NNX twins of the spec's models: MLP, CNN, GPT.

Attribute paths equal canonical names (`common/weights/`): `hidden.0.kernel`,
`convs.1.bias`, `blocks.0.attn.q.kernel`, ... NNX keeps dense kernels
(in, out) and conv kernels HWIO, which are the canonical layouts, so
`convert.py` only renames. Every numeric choice comes from the spec: LayerNorm
epsilon, GELU form, explicit symmetric conv padding, causal mask, tied
embeddings. Parameters are float32; `compute_dtype` is the activation/matmul
dtype (bfloat16 under the bf16 policy, see `train.py`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from common.data import input_ndim
from common.spec import CNNSpec, MLPSpec, ModelSpec, RunSpec, TransformerSpec
from common.twin import (
    TwinError,
    factory_error,
    forward_kwargs_of,
    hparams_of,
    no_bfloat16_refusal,
    resolve,
    twin_of,
)
from common.twin.outputs import use_forward_kwargs

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
}


def _linear(n_in: int, n_out: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
    # Initial values are replaced by the canonical init (convert.py); the
    # initializer here only fixes shapes and dtypes.
    return nnx.Linear(n_in, n_out, dtype=dtype, param_dtype=jnp.float32, rngs=rngs)


class MLP(nnx.Module):
    def __init__(self, spec: MLPSpec, *, compute_dtype=jnp.float32, rngs: nnx.Rngs):
        sizes = (spec.input_size, *spec.hidden_sizes)
        self.hidden = nnx.List(
            [_linear(a, b, compute_dtype, rngs) for a, b in zip(sizes[:-1], sizes[1:])]
        )
        self.head = _linear(sizes[-1], spec.num_classes, compute_dtype, rngs)
        self.activation = ACTIVATIONS[spec.activation]

    def __call__(self, x):  # (B, input_size) -> (B, classes)
        for layer in self.hidden:
            x = self.activation(layer(x))
        return self.head(x)


class CNN(nnx.Module):
    def __init__(self, spec: CNNSpec, *, compute_dtype=jnp.float32, rngs: nnx.Rngs):
        convs, c_in = [], spec.input_shape[2]
        for c_out, k, s, p in zip(spec.channels, spec.kernel_sizes, spec.strides, spec.paddings):
            convs.append(
                nnx.Conv(
                    c_in,
                    c_out,
                    kernel_size=(k, k),
                    strides=(s, s),
                    padding=((p, p), (p, p)),
                    dtype=compute_dtype,
                    param_dtype=jnp.float32,
                    rngs=rngs,
                )
            )
            c_in = c_out
        self.convs = nnx.List(convs)
        h, w = spec.feature_map_hw()
        n_features = c_in if spec.pooling == "global_avg" else h * w * c_in
        self.head = _linear(n_features, spec.num_classes, compute_dtype, rngs)
        self.activation = ACTIVATIONS[spec.activation]
        self.pooling = spec.pooling

    def __call__(self, x):  # (B, H, W, C) -> (B, classes)
        for conv in self.convs:
            x = self.activation(conv(x))
        if self.pooling == "global_avg":
            x = x.mean(axis=(1, 2))  # (B, C)
        else:
            x = x.reshape(x.shape[0], -1)  # (B, H*W*C), HWC order
        return self.head(x)


class Attention(nnx.Module):
    """Causal self-attention with split q/k/v projections, written out explicitly."""

    def __init__(self, spec: TransformerSpec, compute_dtype, rngs: nnx.Rngs):
        d = spec.d_model
        self.q, self.k, self.v, self.o = (_linear(d, d, compute_dtype, rngs) for _ in range(4))
        self.n_heads = spec.n_heads

    def __call__(self, x):  # (B, T, D)
        b, t, d = x.shape
        hd = d // self.n_heads
        # (B, T, H, hd)
        q, k, v = (proj(x).reshape(b, t, self.n_heads, hd) for proj in (self.q, self.k, self.v))
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)  # (B, H, T, T)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(
            causal, scores.astype(jnp.promote_types(scores.dtype, jnp.float32)), -jnp.inf
        )
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        y = jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, d)
        return self.o(y)


class FeedForward(nnx.Module):
    def __init__(self, spec: TransformerSpec, compute_dtype, rngs: nnx.Rngs):
        self.fc = _linear(spec.d_model, spec.d_ff, compute_dtype, rngs)
        self.proj = _linear(spec.d_ff, spec.d_model, compute_dtype, rngs)
        self.gelu = ACTIVATIONS["gelu_" + spec.gelu]

    def __call__(self, x):
        return self.proj(self.gelu(self.fc(x)))


def _layernorm(spec: TransformerSpec, compute_dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(
        spec.d_model,
        epsilon=spec.layernorm_eps,
        dtype=compute_dtype,
        param_dtype=jnp.float32,
        rngs=rngs,
    )


def _dropout(spec: TransformerSpec, rngs: nnx.Rngs) -> nnx.Dropout:
    # At rate 0 (parity mode) it holds no RNG state and is the identity.
    return nnx.Dropout(spec.dropout, rngs=rngs) if spec.dropout > 0 else nnx.Dropout(0.0)


class Block(nnx.Module):
    def __init__(self, spec: TransformerSpec, compute_dtype, rngs: nnx.Rngs):
        self.ln1 = _layernorm(spec, compute_dtype, rngs)
        self.attn = Attention(spec, compute_dtype, rngs)
        self.ln2 = _layernorm(spec, compute_dtype, rngs)
        self.mlp = FeedForward(spec, compute_dtype, rngs)
        self.dropout = _dropout(spec, rngs)
        self.pre_layernorm = spec.pre_layernorm

    def __call__(self, x):
        if self.pre_layernorm:
            x = x + self.dropout(self.attn(self.ln1(x)))
            return x + self.dropout(self.mlp(self.ln2(x)))
        x = self.ln1(x + self.dropout(self.attn(x)))
        return self.ln2(x + self.dropout(self.mlp(x)))


class GPT(nnx.Module):
    def __init__(self, spec: TransformerSpec, *, compute_dtype=jnp.float32, rngs: nnx.Rngs):
        self.wte = nnx.Embed(
            spec.vocab_size, spec.d_model, dtype=compute_dtype, param_dtype=jnp.float32, rngs=rngs
        )
        self.wpe = nnx.Embed(
            spec.seq_len, spec.d_model, dtype=compute_dtype, param_dtype=jnp.float32, rngs=rngs
        )
        self.drop = _dropout(spec, rngs)
        self.blocks = nnx.List([Block(spec, compute_dtype, rngs) for _ in range(spec.n_layers)])
        self.ln_f = _layernorm(spec, compute_dtype, rngs)
        if not spec.tied_embeddings:
            self.lm_head = nnx.Linear(
                spec.d_model,
                spec.vocab_size,
                use_bias=False,
                dtype=compute_dtype,
                param_dtype=jnp.float32,
                rngs=rngs,
            )
        self.tied = spec.tied_embeddings

    def __call__(self, tokens):  # (B, T) int -> (B, T, vocab)
        t = tokens.shape[1]
        x = self.drop(self.wte(tokens) + self.wpe(jnp.arange(t)))  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.wte.attend(x) if self.tied else self.lm_head(x)


# The built-in twins' NNX factories (common/twin/ BUILTIN): called with the spec's fields.
def mlp(*, rngs: nnx.Rngs, compute_dtype=jnp.float32, **hparams) -> MLP:
    return MLP(MLPSpec(**hparams), compute_dtype=compute_dtype, rngs=rngs)


def cnn(*, rngs: nnx.Rngs, compute_dtype=jnp.float32, **hparams) -> CNN:
    return CNN(CNNSpec(**hparams), compute_dtype=compute_dtype, rngs=rngs)


def gpt(*, rngs: nnx.Rngs, compute_dtype=jnp.float32, **hparams) -> GPT:
    return GPT(TransformerSpec(**hparams), compute_dtype=compute_dtype, rngs=rngs)


def build_model(
    spec: ModelSpec, compute_dtype=jnp.float32, seed: int = 0, dropout_seed: int | None = None
):
    """The twin's NNX model, from its factory (`common.twin`); parameter values come from
    convert.load_canonical.

    A model is built abstractly (shapes only), so no init kernel compiles, unless it holds state
    other than its parameters that its constructor computes (dropout's RNG state, a user's rotary
    table): then it is built for real.
    """
    twin = twin_of(spec)
    factory = resolve(twin.nnx, twin.base_dir)
    use_forward_kwargs(forward_kwargs_of(twin, "nnx"))
    kwargs = hparams_of(spec)
    if twin.nnx_mesh_arg:  # the run's mesh (None where a model is built to read its tree alone)
        from jax_impl import sharding

        kwargs[twin.nnx_mesh_arg] = sharding.MESH
    if twin.nnx_dtype_arg:
        kwargs[twin.nnx_dtype_arg] = compute_dtype
    # (float64 needs none: modules without a dtype follow their inputs')
    elif compute_dtype == jnp.bfloat16:
        raise no_bfloat16_refusal(getattr(spec, "twin", spec.family))
    try:
        rngs = lambda: nnx.Rngs(seed, dropout=seed if dropout_seed is None else dropout_seed)  # noqa: E731
        make = lambda: factory(**kwargs, rngs=rngs())  # noqa: E731  (Rngs made inside the trace)
        model = nnx.eval_shape(make)
        if isinstance(model, nnx.Module) and jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param))):
            model = make()
    except Exception as e:
        fields = {
            getattr(twin, f): f for f in ("nnx_mesh_arg", "nnx_dtype_arg") if getattr(twin, f)
        }
        raise factory_error(
            "NNX factory", twin.nnx, e, [*kwargs, "rngs"], factory, fields
        ) from None
    if not isinstance(model, nnx.Module):
        raise TwinError(
            f"NNX factory {twin.nnx} returned a {type(model).__name__}, not a flax.nnx.Module"
        )
    if compute_dtype == jnp.float64:
        float64_parameters(model)
    return model


def float64_parameters(model: nnx.Module) -> None:
    """A float64 run's model as a JAX user builds one for it, `param_dtype=jnp.float64`: every
    layer's param_dtype float64 (its values come from the canonical weights, widened), and an
    `nnx.Embed` whose compute dtype came from its float32 param_dtype (flax sets `dtype = dtype or
    param dtype`) computes in float64; left so, it casts its float64 table to float32 (a float32
    island where the torch side has none)."""
    for _, module in nnx.iter_modules(model):
        if getattr(module, "param_dtype", None) == jnp.float32:
            if isinstance(module, nnx.Embed) and module.dtype == jnp.float32:
                module.dtype = jnp.float64
            module.param_dtype = jnp.float64


def nnx_input_axes(spec: RunSpec) -> tuple[int, ...]:
    """The transpose the NNX side's inputs take (the twin's `nnx_input_axes`), checked against the
    batch."""
    axes = twin_of(spec.model).nnx_input_axes or ()
    # a twin's named inputs (task custom): checked per input as the batch comes
    if isinstance(axes, dict):
        return {k: tuple(v) for k, v in axes.items()}
    axes = tuple(axes)
    if axes and len(axes) != input_ndim(spec):
        raise TwinError(
            f"twin {getattr(spec.model, 'twin', spec.model.family)}: nnx_input_axes={axes} has "
            f"{len(axes)} axes but the inputs have {input_ndim(spec)} (batch first); give one per "
            "axis"
        )
    return axes


def nnx_inputs(inputs, axes):
    """A batch's inputs as the NNX side takes them (numpy, jax or abstract arrays; a twin's named
    inputs, each transposed by its own axes)."""
    if isinstance(inputs, dict):
        return {k: nnx_inputs(v, axes.get(k, ()) if axes else ()) for k, v in inputs.items()}
    return inputs.transpose(axes) if axes else inputs
