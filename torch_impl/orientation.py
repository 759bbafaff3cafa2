"""How the torch side's modules hold their matrices, found by running them (the describe step's),
never guessed from a name or a type: nn.Linear keeps its weight (out, in) and computes x @ W.T;
Hugging Face's GPT-2 keeps its projections in `Conv1D` modules, whose weight is (in, out) and
computes x @ W. A square matrix looks the same either way, so each module with a 2-D weight and
no submodules is called on one probe input, in float64, its weight replaced by a random one (a zero
or symmetric init would read both ways); the orientation that reproduces its output is the one it
uses. A module the probe cannot call on a plain (N, in) input (an embedding, a module needing other
arguments) gets none, and the correspondence's rules apply to it as before.

Ties are found here too: a tensor the model holds under two names (Hugging Face's `lm_head.weight`,
which is its input embedding's) is listed once by named_parameters, and a port that trains a head
of its own is told which tensor HF's head is."""

from __future__ import annotations

import copy

import torch
from torch import nn

OUT_IN, IN_OUT = "out_in", "in_out"  # y = x @ W.T (nn.Linear) | y = x @ W (HF's Conv1D)
PROBE_ROWS = 3


def _probe(module: nn.Module, weight: torch.Tensor, orientation: str) -> bool:
    """Whether `module` (a float64 copy, its weight random) computes x @ W.T or x @ W as
    `orientation` says, on a random input: its output at x less its output at 0 (a bias cancels)."""
    d_in = weight.shape[1] if orientation == OUT_IN else weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, d_in, dtype=torch.float64, generator=generator)
    try:
        with torch.no_grad():
            got = module(x) - module(torch.zeros_like(x))
    except Exception:  # the module takes no plain (N, in) input: the probe tells nothing
        return False
    want = x @ (weight.T if orientation == OUT_IN else weight)
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got, want, rtol=1e-9, atol=1e-9)
    )


def _takes_rows(module: nn.Module, weight: torch.Tensor) -> bool:
    """Whether the module runs on a (1, in) row of its own dtype, for either reading of its
    weight."""
    for d_in in set(weight.shape):
        try:
            with torch.no_grad():
                module(torch.zeros(1, d_in, dtype=weight.dtype, device=weight.device))
            return True
        except Exception:
            continue
    return False


def weight_orientations(model: nn.Module) -> dict[str, str]:
    """{parameter name: "out_in" | "in_out"} of each 2-D `weight` of a module with no submodules,
    as its forward uses it; modules the probe cannot tell are left out."""
    found = {}
    generator = torch.Generator().manual_seed(0)
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is None or weight.dim() != 2 or next(module.children(), None) is not None:
            continue
        if not _takes_rows(module, weight):  # an embedding, say: no copy made
            continue
        probe = copy.deepcopy(module).to(torch.float64)
        with torch.no_grad():
            probe.weight.copy_(torch.randn(weight.shape, dtype=torch.float64, generator=generator))
        fits = [o for o in (OUT_IN, IN_OUT) if _probe(probe, probe.weight.detach(), o)]
        if len(fits) == 1:
            found[f"{name}.weight" if name else "weight"] = fits[0]
    return found


def tied_names(model: nn.Module) -> dict[str, str]:
    """{name: the name named_parameters lists for the same tensor} of every parameter held under a
    second name (a tied head)."""
    first: dict[int, str] = {}
    ties = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            ties[name] = first[id(param)]
        else:
            first[id(param)] = name
    return ties
