"""Float32 islands of a float64 run, and how a pair with them is judged.

Code that drops to float32 on purpose (Hugging Face's RMSNorm variance, rotary tables and eager
softmax; flax's `dot_product_attention`) makes a float64 run float32 there: each backend names those
modules in its record (`float32_islands`, found by watching op dtypes: torch_impl/islands.py,
jax_impl/islands.py). Their difference from the other side is float32's rounding, and everything
computed after them carries it: the logits, the loss, every gradient (the backward passes back
through them) and every module that starts after the first island. So a pair with islands on either
side is judged at float32's bounds there, and at float64's only in the modules that start before the
first island (a port error there is still found at ~1e-9). The report lists the islands and says
which parts float64 resolved (compare/judge/sensitivity.py).

By default a float64 run widens those casts on both sides (train.float32_casts=widen), so no island
is left and float64's bounds apply everywhere; the report lists the casts widened per side
(`widened_of`). train.float32_casts=keep computes them as written, judged as above.
"""

from __future__ import annotations

from common.files.record import RunRecord


def islands_of(ref: RunRecord, other: RunRecord) -> dict[str, dict[str, str]]:
    """{backend: {module: "float32: op, ..."}} of the two records, the backends without any left
    out."""
    return {r.backend: dict(r.float32_islands) for r in (ref, other) if r.float32_islands}


def widened_of(ref: RunRecord, other: RunRecord) -> dict[str, dict[str, int]]:
    """{backend: {cast: count}} of the casts to float32 each side widened (train.float32_casts:
    torch_impl/widen.py, jax_impl/widen.py), the backends without any left out."""
    return {
        r.backend: dict(r.float32_casts_widened) for r in (ref, other) if r.float32_casts_widened
    }


def widened_words(widened: dict[str, dict[str, int]]) -> str:
    """One clause: how many of the model's casts to float32 each side computed in float64."""
    named = "; ".join(
        f"{side}: {sum(casts.values())} ({', '.join(casts)})" for side, casts in widened.items()
    )
    return f"casts to float32 widened to float64 ({named})"


def island_policy(policy: dict, float32: dict) -> dict:
    """A float64 policy for a pair with islands: every tensor kind and the logits' distribution at
    float32's bounds (`float32`, the same profile's), and float64's forward and grad bounds kept
    under `before_islands` for the modules that start before the first island."""
    out = {k: dict(v) for k, v in float32.items()}
    out["before_islands"] = {"forward": dict(policy["forward"]), "grad": dict(policy["grad"])}
    # a running-variance convention apart (compare/judge/tolerances.py pair_policy)
    if "state" in policy:
        out["state"] = dict(policy["state"])
    return out


def before_first_island(keys: list[str], islands: set[str]) -> set[str]:
    """The activation keys (`module`, `module:in`, in the order the reference's capture met them: an
    input as its module starts, an output as it ends) that come before the first island starts; all
    of them where there is none."""
    out = set()
    for key in keys:
        if key.removesuffix(":in") in islands:
            break
        out.add(key)
    return out


def islands_words(
    islands: dict[str, dict[str, str]], modules_before: int | None, modules: int | None
) -> str:
    """One clause: which modules compute in float32 on which side, and what float64 resolved."""
    named = "; ".join(f"{side}: {', '.join(found)}" for side, found in islands.items())
    resolved = "tensors judged at float32's bounds"
    if modules:
        resolved += (
            f", {modules_before} of {modules} modules (those before the first island) at float64's"
        )
    return f"float32 islands ({named}): {resolved}"
