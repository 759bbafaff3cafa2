"""A Llama-style decoder in torch.nn, written as a user's model would be: RMSNorm, rotary position
embeddings (Hugging Face's rotate-half layout), SwiGLU MLP, grouped-query attention, no biases, an
untied head. Names follow Hugging Face's LlamaForCausalLM (`self_attn`, `q_proj`, `gate_proj`,
...)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(
            x.dtype
        ) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, rope_theta: float):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        inv_freq = 1.0 / rope_theta ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):  # (B, T, D)
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.n_kv_heads, self.head_dim)
        freqs = (
            torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        )
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd): rotate-half pairs i and i + hd/2
        cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # grouped-query: query head h reads kv head h // repeat
        repeat = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        probs = torch.softmax(scores.float().masked_fill(~causal, float("-inf")), dim=-1).to(
            x.dtype
        )
        return self.o_proj(torch.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, rms_eps, rope_theta):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, rms_eps)
        self.self_attn = Attention(d_model, n_heads, n_kv_heads, rope_theta)
        self.post_attention_layernorm = RMSNorm(d_model, rms_eps)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        d_ff: int,
        rms_eps: float = 1e-5,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, n_kv_heads, d_ff, rms_eps, rope_theta)
            for _ in range(n_layers)
        )
        self.norm = RMSNorm(d_model, rms_eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():  # Llama's init: normal(0, 0.02) for every matrix
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens):  # (B, T) int -> (B, T, vocab)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
