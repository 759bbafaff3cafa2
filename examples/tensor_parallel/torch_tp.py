"""A Megatron-style tensor-parallel decoder in torch.nn, written per rank as Megatron writes it:
column-parallel q/k/v and fc1 (each rank holds a block of their output columns: its own heads, its
own slice of the hidden layer), row-parallel o and fc2 (each rank holds the matching block of their
input rows and computes a partial sum), an all-reduce of the partial sums. Every rank's code runs
here in one process, rank after rank, and `all_reduce` adds their partial sums: the same math a
torch.distributed group computes, on one process. Names follow Hugging Face's (`self_attn`,
`q_proj`, `mlp.fc1`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def all_reduce(partials: list[torch.Tensor]) -> torch.Tensor:
    """Every rank's partial result summed (torch.distributed.all_reduce's SUM), on one process."""
    return torch.stack(partials).sum(0)


def column_shard(linear: nn.Linear, rank: int, ranks: int) -> torch.Tensor:
    """Rank `rank`'s block of a column-parallel layer's output columns: rows of torch's weight."""
    block = linear.weight.shape[0] // ranks
    return linear.weight[rank * block : (rank + 1) * block]


def row_shard(linear: nn.Linear, rank: int, ranks: int) -> torch.Tensor:
    """Rank `rank`'s block of a row-parallel layer's input rows: columns of torch's weight."""
    block = linear.weight.shape[1] // ranks
    return linear.weight[:, rank * block : (rank + 1) * block]


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, ranks: int):
        super().__init__()
        self.n_heads, self.head_dim, self.ranks = n_heads, d_model // n_heads, ranks
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4)
        )

    def rank_forward(self, x, rank: int):
        """One rank's heads, through its row block of o_proj: its partial sum."""
        b, t, _ = x.shape
        heads = self.n_heads // self.ranks
        q, k, v = (
            F.linear(x, column_shard(p, rank, self.ranks)).reshape(b, t, heads, self.head_dim)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out = torch.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1)
        return F.linear(out, row_shard(self.o_proj, rank, self.ranks))

    def forward(self, x):
        return all_reduce([self.rank_forward(x, r) for r in range(self.ranks)])


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, ranks: int):
        super().__init__()
        self.ranks = ranks
        self.fc1 = nn.Linear(d_model, d_ff, bias=False)
        self.fc2 = nn.Linear(d_ff, d_model, bias=False)

    def rank_forward(self, x, rank: int):
        hidden = F.gelu(F.linear(x, column_shard(self.fc1, rank, self.ranks)))
        return F.linear(hidden, row_shard(self.fc2, rank, self.ranks))

    def forward(self, x):
        return all_reduce([self.rank_forward(x, r) for r in range(self.ranks)])


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, ranks):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d_model, eps=1e-6)
        self.self_attn = Attention(d_model, n_heads, ranks)
        self.post_attention_layernorm = nn.RMSNorm(d_model, eps=1e-6)
        self.mlp = MLP(d_model, d_ff, ranks)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_ff: int,
        ranks: int,
    ):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(Block(d_model, n_heads, d_ff, ranks) for _ in range(n_layers))
        self.norm = nn.RMSNorm(d_model, eps=1e-6)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
