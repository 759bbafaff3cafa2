"""A Megatron-style tensor-parallel decoder in torch.nn, written per rank as Megatron writes it:
column-parallel q/k/v and fc1 (each rank uses a block of their output columns: its own heads, its
own slice of the hidden layer), row-parallel o and fc2 (each rank uses the matching block of their
input rows and computes a partial sum), an all-reduce of the partial sums. Names follow Hugging
Face's (`self_attn`, `q_proj`, `mlp.fc1`).

The ranks run either as processes (`compare --processes 4`: torch.distributed on gloo, one rank
each, the factory given their DeviceMesh, `mesh`, the twin's `torch_mesh_arg`) with Megatron's
copy-to and reduce-from autograd functions around each region, or all `ranks` on one process
(`mesh` None), rank after rank, their partial sums added: the same math. Each rank
holds the whole weights (the checkpoint's) and cuts its block inside the region, so a weight enters
the region as the input does: replicated, its gradient the sum of every rank's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CopyToRanks(torch.autograd.Function):
    """Megatron's copy into the tensor-parallel region: the same value on every rank; backward, the
    ranks' gradients summed (each rank's holds only what its own block used)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromRanks(torch.autograd.Function):
    """Megatron's reduce out of the region: the ranks' partial sums summed; backward, as is."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@dataclass(frozen=True)
class Ranks:
    """Where the tensor-parallel ranks run: all on this process (`group` None), or one per process,
    this one `rank` of `group`."""

    count: int
    rank: int = 0
    group: object = None

    @classmethod
    def of(cls, count: int, mesh) -> Ranks:
        """All `count` ranks on this process, or this process's rank of the mesh's "tensor" axis
        (a torch.distributed DeviceMesh)."""
        if mesh is None:
            return cls(count)
        return cls(mesh["tensor"].size(), mesh.get_local_rank("tensor"), mesh.get_group("tensor"))

    def __deepcopy__(self, memo) -> Ranks:
        return self  # a copy of the model (e.g. a float64 one) runs on the same process group

    def replicated(self, x: torch.Tensor) -> torch.Tensor:
        """A value (an input, a whole weight) as the region on this rank takes it."""
        return x if self.group is None else CopyToRanks.apply(x, self.group)

    def all_reduce(self, rank_forward, x: torch.Tensor) -> torch.Tensor:
        """The ranks' partial results of `rank_forward(x, rank)` summed."""
        if self.group is None:
            return torch.stack([rank_forward(x, r) for r in range(self.count)]).sum(0)
        return ReduceFromRanks.apply(rank_forward(self.replicated(x), self.rank), self.group)


def column_shard(linear: nn.Linear, rank: int, ranks: Ranks) -> torch.Tensor:
    """Rank `rank`'s block of a column-parallel layer's output columns: rows of torch's weight."""
    block = linear.weight.shape[0] // ranks.count
    return ranks.replicated(linear.weight)[rank * block : (rank + 1) * block]


def row_shard(linear: nn.Linear, rank: int, ranks: Ranks) -> torch.Tensor:
    """Rank `rank`'s block of a row-parallel layer's input rows: columns of torch's weight."""
    block = linear.weight.shape[1] // ranks.count
    return ranks.replicated(linear.weight)[:, rank * block : (rank + 1) * block]


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, ranks: Ranks):
        super().__init__()
        self.n_heads, self.head_dim, self.ranks = n_heads, d_model // n_heads, ranks
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4)
        )

    def rank_forward(self, x, rank: int):
        """One rank's heads, through its row block of o_proj: its partial sum."""
        b, t, _ = x.shape
        heads = self.n_heads // self.ranks.count
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
        return self.ranks.all_reduce(self.rank_forward, x)


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, ranks: Ranks):
        super().__init__()
        self.ranks = ranks
        self.fc1 = nn.Linear(d_model, d_ff, bias=False)
        self.fc2 = nn.Linear(d_ff, d_model, bias=False)

    def rank_forward(self, x, rank: int):
        hidden = F.gelu(F.linear(x, column_shard(self.fc1, rank, self.ranks)))
        return F.linear(hidden, row_shard(self.fc2, rank, self.ranks))

    def forward(self, x):
        return self.ranks.all_reduce(self.rank_forward, x)


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
        mesh=None,
    ):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        ranks_run = Ranks.of(ranks, mesh)
        self.layers = nn.ModuleList(
            Block(d_model, n_heads, d_ff, ranks_run) for _ in range(n_layers)
        )
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
