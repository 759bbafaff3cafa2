"""Discrete choices a forward makes (top-k, argmax, argmin, sort orders), captured at step 0 and
compared as choices.

A model that routes (a mixture of experts: top-k over its router's scores) chooses by ranking. Where
two candidates' scores are within rounding of a tie, the two frameworks may choose differently
although both compute the same function: `torch.topk` and `jax.lax.top_k` break exact ties
differently, and scores a rounding apart swap places. Everything downstream of such a flip then
differs by far more than rounding, and the first module it reaches (the experts) looks like the
culprit. So each side's capture (jax_impl/capture.py, torch_impl/decisions.py) records every such
call, in call order: the module it ran in, the chosen indices and the scores it ranked; compare sets
them side by side here (`compare_decisions`). A flip is within rounding of a tie when the margin
between the last chosen and the first passed-over score (the k-th and (k+1)-th) is within the
forward bound on each side, of that side's own scores (a port may rank the router's logits where
torch ranks their softmax: the same order on other values); any other flip is a difference of the
port. Where every flip is a tie, compare runs the torch side's capture once more with the
reference's choices imposed (`--impose-decisions`): what then still differs is the port's.

The scores are kept oriented so that larger is chosen (argmin and ascending orders negate them) and
with the ranked axis last; the indices as (..., k) (argmax's k is 1; a sort's k is the axis'
length).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.files.record import RECORD_FILE, read_record
from common.files.tensor_file import read_tensors

GROUP = "decisions"  # their tensor-file group: "<i>.indices", "<i>.scores"
OPS = ("topk", "argmax", "argmin", "sort", "argsort")
ORDERED = ("sort", "argsort")  # the order is the choice; of top-k and argmax, the set chosen


@dataclass
class Decision:
    module: str  # the innermost named module the call ran in (ROOT_MODULE: the model's own code)
    op: str  # one of OPS
    indices: np.ndarray  # the choice, (..., k), integers
    scores: np.ndarray  # what was ranked, (..., n), larger chosen first


def oriented(indices, scores, dim: int, smallest: bool) -> tuple[np.ndarray, np.ndarray]:
    """A framework's raw call, as a Decision keeps it: the ranked axis `dim` moved last, the indices
    given a k axis when the call dropped it, the scores negated where the smallest are chosen."""
    scores = np.moveaxis(np.asarray(scores), dim, -1)
    indices = np.asarray(indices)
    indices = indices[..., None] if indices.ndim < scores.ndim else np.moveaxis(indices, dim, -1)
    return indices.astype(np.int64), (-scores if smallest else scores)


def to_tensors(decisions: list[Decision]) -> tuple[dict, list[dict]]:
    """({name: array} for the tensor file's group, the facts for the record's extra.decisions)."""
    arrays, facts = {}, []
    for i, d in enumerate(decisions):
        arrays[f"{i}.indices"], arrays[f"{i}.scores"] = d.indices, d.scores
        facts.append({"module": d.module, "op": d.op, "k": int(d.indices.shape[-1])})
    return arrays, facts


def from_tensors(arrays, facts: list[dict]) -> list[Decision]:
    return [
        Decision(
            f["module"],
            f["op"],
            np.asarray(arrays[f"{i}.indices"]),
            np.asarray(arrays[f"{i}.scores"]),
        )
        for i, f in enumerate(facts)
    ]


def read_decisions(run_dir: Path) -> list[Decision]:
    """The decisions a capture run (its run directory) recorded."""
    record = read_record(Path(run_dir) / RECORD_FILE)
    return from_tensors(
        read_tensors(Path(run_dir) / RECORD_FILE, record)[GROUP], record.extra.decisions or []
    )


def margins(d: Decision) -> np.ndarray:
    """Per row, how far the choice is from a tie: the k-th minus the (k+1)-th largest score (a sort:
    its smallest gap between neighbours); infinite where nothing was passed over."""
    rows = d.scores.reshape(-1, d.scores.shape[-1]).astype(np.float64)
    ranked = -np.sort(-rows, axis=-1)
    if d.op in ORDERED:
        return (
            np.min(ranked[:, :-1] - ranked[:, 1:], axis=-1)
            if rows.shape[-1] > 1
            else np.full(len(rows), np.inf)
        )
    k = d.indices.shape[-1]
    return ranked[:, k - 1] - ranked[:, k] if k < rows.shape[-1] else np.full(len(rows), np.inf)


def _chosen(d: Decision) -> np.ndarray:
    rows = d.indices.reshape(-1, d.indices.shape[-1])
    return rows if d.op in ORDERED else np.sort(rows, axis=-1)


def compare_decisions(
    ref: list[Decision], other: list[Decision], atol: float, rtol: float
) -> dict | None:
    """The two sides' choices set side by side, in call order: per decision the rows (tokens) that
    chose otherwise and whether each such flip is within rounding of a tie (its margin within `atol
    + rtol * max|scores|` on each side, of that side's scores). None when neither side made a
      decision."""
    if not ref and not other:
        return None
    if len(ref) != len(other) or any(
        a.indices.shape != b.indices.shape or a.scores.shape != b.scores.shape
        for a, b in zip(ref, other)
    ):
        seen = (
            "; a side that made none may call them under a name bound at import (`from jax.lax "
            "import "
            "top_k`), which the capture does not see: call jax.lax.top_k"
            if not ref or not other
            else ""
        )
        return {
            "matched": False,
            "flipped": None,
            "ties_only": False,
            "reference": len(ref),
            "other": len(other),
            "why": f"the sides made {len(ref)} and {len(other)} decisions, or of other shapes: "
            "not set side by "
            f"side{seen}",
        }
    found = []
    for i, (a, b) in enumerate(zip(ref, other)):
        flipped = np.any(_chosen(a) != _chosen(b), axis=-1)
        bound_a, bound_b = (
            atol + rtol * float(np.max(np.abs(d.scores))) if d.scores.size else atol for d in (a, b)
        )
        scores_apart = (
            float(np.max(np.abs(a.scores.astype(np.float64) - b.scores))) if a.scores.size else 0.0
        )
        margin_a, margin_b = margins(a)[flipped], margins(b)[flipped]
        # each flip's margin as a share of its side's bound: within
        # rounding when at most 1 on both sides
        share_a, share_b = margin_a / bound_a, margin_b / bound_b
        margin, bound = None, bound_a
        if flipped.any():
            j = int(np.argmax(np.maximum(share_a, share_b)))  # the flip farthest from a tie
            margin, bound = (
                (margin_a[j], bound_a) if share_a[j] >= share_b[j] else (margin_b[j], bound_b)
            )
        found.append(
            {
                "index": i,
                "module": a.module,
                "other_module": b.module,
                "op": a.op,
                "k": int(a.indices.shape[-1]),
                "rows": int(flipped.size),
                "flipped": int(flipped.sum()),
                "widest_margin": None if margin is None else float(margin),
                "bound": bound,
                "scores_max_abs": scores_apart,
                "within_rounding": margin is None or bool(margin <= bound),
            }
        )
    flips = [d for d in found if d["flipped"]]
    return {
        "matched": True,
        "decisions": found,
        "flipped": sum(d["flipped"] for d in found),
        "ties_only": bool(flips) and all(d["within_rounding"] for d in flips),
        "first": flips[0] if flips else None,
        "first_not_a_tie": next((d for d in flips if not d["within_rounding"]), None),
    }


def decision_words(found: dict) -> str:
    """One line: what the decisions' comparison showed."""
    if not found["matched"]:
        return found["why"]
    if not found["flipped"]:
        return (
            f"{len(found['decisions'])} decisions (top-k, argmax, sort), every one the same on "
            "both sides"
        )
    first = found["first_not_a_tie"] or found["first"]
    where = first["module"] + (
        f" (the other side: {first['other_module']})"
        if first["other_module"] != first["module"]
        else ""
    )
    words = (
        f"{found['flipped']} choices differ (a choice: one row ranked, e.g. one token's routing); "
        "first at "
        f"{where}, {first['op']} k={first['k']}: {first['flipped']} of {first['rows']} rows, "
        "widest margin "
        f"{first['widest_margin']:.2e} against the bound {first['bound']:.2e}, scores "
        f"{first['scores_max_abs']:.2e} apart"
    )
    if found["ties_only"]:
        return words + ": every flip within rounding of a tie"
    return words + ": not a tie (a difference of the port in what is ranked or how)"
