"""Hugging Face's own `LlamaForCausalLM`, used as it is for the torch side: built from a
`LlamaConfig` of the twin's hyperparameters (no download), its forward returning a
`CausalLMOutputWithPast` (the toolkit takes `.logits`), its attention called with keyword arguments
(the step-0 capture sees them)."""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM


def llama(
    vocab_size: int,
    seq_len: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    d_ff: int,
    rms_eps: float = 1e-5,
    rope_theta: float = 10000.0,
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=seq_len,
        rms_norm_eps=rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        use_cache=False,
        initializer_range=0.02,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(config)


def _pallas_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Hugging Face's attention interface answered by the NNX side's own flash kernel (kernels.py),
    called through torchax's `call_jax`: the same kernel on both sides, under torchax alone."""
    import functools

    import kernels

    try:
        from torchax.interop import call_jax
        from torchax.tensor import Tensor as JaxBacked
    except ImportError:
        JaxBacked = ()
    if not isinstance(query, JaxBacked):
        raise RuntimeError(
            "kernel 'pallas' on the torch side calls the NNX side's JAX kernel through torchax: "
            "set it on torchax alone (--torchax-set model.kernel=pallas)"
        )

    repeat = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(repeat, dim=1) for x in (key, value))
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, T, H, hd)
    attend = functools.partial(kernels.flash_attention, scale=scaling)
    return call_jax(attend, q, k, v), None


def llama_sdpa(*args, kernel: str = "reference", **hparams) -> LlamaForCausalLM:
    """`llama` with SDPA, the op a flash kernel stands in for (kernel "reference"), or with the NNX
    side's own flash kernel through torchax (kernel "pallas": run it on torchax)."""
    from transformers import AttentionInterface

    model = llama(*args, **hparams)
    if kernel == "reference":
        model.set_attn_implementation("sdpa")
        return model
    if kernel != "pallas":
        raise ValueError(f"kernel {kernel!r}: the torch side has 'reference' (SDPA) and 'pallas'")
    AttentionInterface.register("jax_pallas", _pallas_attention)
    model.set_attn_implementation("jax_pallas")
    return model
