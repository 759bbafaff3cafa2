"""One tensor against its reference: max abs / rel error under atol + rtol * max|ref| (with a
fraction of elements allowed over), non-finite values compared by rule, and the smallest tolerance
that would pass a failing tensor. compare/judge/parity.py judges whole runs with it,
compare/judge/backward.py the backward pass."""

from __future__ import annotations

import math

import numpy as np

from common.files.tensor_summary import TensorSummary, summarize, summary_checks

# an agreeing module input using more of its bound than this may carry the difference already
BORDERLINE = 0.5


def _value_kind(x: np.ndarray) -> np.ndarray:
    """Per element: 'finite', 'nan', 'inf' or '-inf'."""
    return np.where(
        np.isnan(x),
        "nan",
        np.where(np.isposinf(x), "inf", np.where(np.isneginf(x), "-inf", "finite")),
    )


def nonfinite_mismatches(ref: np.ndarray, other: np.ndarray) -> list[tuple[int, str, str]]:
    """Where two tensors of one shape disagree in a non-finite value: (count, kind on ref, kind on
    other) per pair of kinds, most first. Empty when every non-finite element has its equal on the
    other side (the same infinity, or NaN against NaN, at the same position)."""
    a, b = _value_kind(ref), _value_kind(other)
    differ = (a != b) & ((a != "finite") | (b != "finite"))
    if not differ.any():
        return []
    pairs, counts = np.unique(np.stack([a[differ], b[differ]], axis=-1), axis=0, return_counts=True)
    return sorted(
        ((int(n), str(x), str(y)) for n, (x, y) in zip(counts, pairs)), key=lambda m: (-m[0], m[1:])
    )


def _mismatch_words(mismatches: list[tuple[int, str, str]], names: tuple[str, str]) -> str:
    """'3 elements are -inf on jax and finite on torch; 1 element is nan on jax and inf on
    torch'."""
    return "; ".join(
        f"{n} element{'s are' if n != 1 else ' is'} {x} on {names[0]} and {y} on {names[1]}"
        for n, x, y in mismatches
    )


def allowed_over(fraction: float, elements: int) -> int:
    """How many elements a tolerance lets over its bound: the stated fraction of the tensor, rounded
    down (a hair of slack so that a fraction written as count / elements allows that count)."""
    return int(math.floor(fraction * elements * (1 + 1e-12)))


def _two_digits_up(x: float, enough) -> float:
    """The smallest number of two significant digits, from x up, that `enough` accepts (a bound the
    user can type that passes under the same float arithmetic as the check)."""
    if x <= 0:
        return 0.0
    exponent = math.floor(math.log10(x)) - 1
    q = x / 10.0**exponent
    n = round(q) if abs(q - round(q)) < 1e-9 else math.ceil(q)  # 28.000000000000004 is 28
    # 42e-4 parses to 0.0042, where 42 * 1e-4 is 0.0042000000000000001
    while not enough(float(f"{n}e{exponent}")):
        n += 1
    return float(f"{n}e{exponent}")


def passes_with(
    needed: float, scale: float, over: int, elements: int, atol: float, rtol: float
) -> dict:
    """The smallest tolerance that would pass a failing tensor, each changed alone: atol with this
    rtol, rtol with this atol (None when max|ref| is 0: no rtol scales), or the fraction of elements
    allowed over this bound. `needed`: the error the bound must reach at the fraction in force."""
    return {
        "atol": _two_digits_up(needed - rtol * scale, lambda a: needed <= a + rtol * scale),
        "rtol": _two_digits_up((needed - atol) / scale, lambda r: needed <= atol + r * scale)
        if scale > 0
        else None,
        "fraction": _two_digits_up(over / elements, lambda f: allowed_over(f, elements) >= over)
        if elements
        else None,
    }


def passes_with_words(found: dict) -> str:
    """'would pass with atol 3.2e-03, rtol 1.6e-03 or 0.098% of elements over (each alone)'."""
    ways = (
        [f"atol {found['atol']:.2g}"]
        + ([f"rtol {found['rtol']:.2g}"] if found["rtol"] is not None else [])
        + (
            [f"{100 * found['fraction']:.3g}% of elements over"]
            if found["fraction"] is not None
            else []
        )
    )
    return (
        f"would pass with {', '.join(ways[:-1])} or {ways[-1]} (each alone)"
        if len(ways) > 1
        else f"would pass with {ways[0]}"
    )


def tensor_error(
    ref: np.ndarray,
    other: np.ndarray,
    atol: float,
    rtol: float,
    names: tuple[str, str] = ("the reference", "the other side"),
    fraction: float = 0.0,
    scale: float | None = None,
) -> dict:
    """Max abs / rel error of `other` against `ref`, and whether it is within atol + rtol *
    max|ref|.

    `fraction` lets that share of the elements (rounded down) exceed the bound: the tensor is within
    when at most that many are over (`over` counts them, of `elements`). A tensor out of tolerance
    carries `passes_with`, the smallest atol, rtol or fraction that would pass it, each changed
    alone: a bound set too tight reads as a small step, a port error as a large one.

    Non-finite values are compared by rule, never hidden: the same infinity at the same position on
    both sides is equal, and so is NaN against NaN (the same computation gave no number on either
    side; a masked class or vocabulary entry is -inf on both); they add 0 error. A NaN or an
    infinity facing a finite number, another infinity or NaN fails the tensor, and `nonfinite` names
    each kind with its count: no tolerance passes it. abs and rel are computed over the finite pairs
    only. `scale`: max|ref| when `ref` is a sample of the tensor the bound is for
    (summary_error)."""
    ref, other = np.asarray(ref, np.float64), np.asarray(other, np.float64)
    if ref.shape != other.shape:
        return {
            "abs": None,
            "rel": None,
            "tolerance_used": None,
            "within": False,
            "note": f"shapes differ: {ref.shape} vs {other.shape}",
        }
    finite = np.isfinite(ref) & np.isfinite(other)
    mismatches, extra = [], {}
    if not finite.all():
        mismatches = nonfinite_mismatches(ref, other)
        mismatched = sum(n for n, _, _ in mismatches)
        extra["nonfinite"] = {"equal": int((~finite).sum()) - mismatched, "mismatched": mismatched}
        if mismatches:
            extra["note"] = _mismatch_words(mismatches, names)
        ref, other = ref[finite], other[finite]
    diffs = np.abs(ref - other).ravel()
    diff = float(diffs.max()) if diffs.size else 0.0
    if scale is None:
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    bound, allowed = atol + rtol * scale, allowed_over(fraction, diffs.size)
    # the error the bound must cover: the largest with no fraction, else the largest beyond the
    # allowed ones
    needed = (
        0.0
        if allowed >= diffs.size
        else float(np.partition(diffs, diffs.size - 1 - allowed)[-1 - allowed])
    )
    over = int(np.count_nonzero(diffs > bound))
    used = needed / bound if bound > 0 else (0.0 if needed == 0 else None)
    within = not mismatches and needed <= bound
    if not within and not mismatches:
        extra["passes_with"] = passes_with(needed, scale, over, diffs.size, atol, rtol)
    return {
        "abs": diff,
        "rel": diff / scale if scale > 0 else (0.0 if diff == 0 else None),
        # a non-finite mismatch fails whatever the finite pairs say: unmeasurable, ranked first
        "tolerance_used": None if mismatches else used,
        "within": within,
        "over": over,
        "elements": int(diffs.size),
        "sensitivity": bound / scale if scale > 0 else None,
        **extra,
    }


def module_error(a, b, bounds: dict, names: tuple[str, str], key: str) -> dict:
    """A module's step-0 activation (or its gradient, `key` its tensor-file key) against the
    reference's, whole or by summary (a capture under --tensors summary|auto). Both sides store
    activations channel-last, each in the layout its module fixes (common/capture/activations.py):
    shapes that still differ are a difference of the ports (a padding that changes a size), which
    diverges, said as such, never transposed into agreement. Shapes that differ only by axes of size
    1 (a norm fed (N, C, 1, 1) on one side and (N, C) on the other) hold the same elements in the
    same order: compared as they are."""
    whole = not isinstance(a, TensorSummary) and not isinstance(b, TensorSummary)
    if (
        whole
        and tuple(a.shape) != tuple(b.shape)
        and _without_units(a.shape) == _without_units(b.shape)
    ):
        b = np.asarray(b).reshape(a.shape)
    if tuple(a.shape) != tuple(b.shape):
        return {
            "abs": None,
            "rel": None,
            "tolerance_used": None,
            "within": False,
            "note": f"output shapes differ: {names[0]} {list(a.shape)}, {names[1]} {list(b.shape)} "
            "(both channel-last)",
        }
    if isinstance(a, TensorSummary) or isinstance(b, TensorSummary):
        return summary_error(
            key, a, b, bounds["atol"], bounds["rtol"], names, bounds.get("fraction", 0.0)
        )
    return tensor_error(a, b, bounds["atol"], bounds["rtol"], names, bounds.get("fraction", 0.0))


def summary_error(
    key: str, ref, other, atol: float, rtol: float, names: tuple[str, str], fraction: float = 0.0
) -> dict:
    """A tensor judged by its summary (common/files/tensor_summary.py), either side kept whole or
    summarized: element by element on the sample, against the bound the whole tensor sets (atol +
    rtol * max|ref|, from its statistics), and by the checks its statistics allow (summary_checks:
    each a necessary condition of element-wise agreement, so a failed one fails the tensor). `abs`
    is the larger of the sample's error and what the largest magnitudes prove (|max|ref| -
    max|other|| <= max|ref - other|): a lower bound of the whole tensor's error."""
    ref_s, other_s = (
        x if isinstance(x, TensorSummary) else summarize(key, x) for x in (ref, other)
    )
    if ref_s.shape != other_s.shape or not np.array_equal(ref_s.indices, other_s.indices):
        why = (
            f"shapes differ: {ref_s.shape} vs {other_s.shape}"
            if ref_s.shape != other_s.shape
            else "the two summaries sampled other elements (a tensor file of another toolkit "
            "version?)"
        )
        return {"abs": None, "rel": None, "tolerance_used": None, "within": False, "note": why}
    scale = ref_s.stats["max_abs"]
    sample = tensor_error(ref_s.values, other_s.values, atol, rtol, names, fraction, scale=scale)
    bound = atol + rtol * scale
    checks = summary_checks(ref_s, other_s, bound)
    failed = {name: c for name, c in checks.items() if not c["within"]}
    entry = {
        **sample,
        "judged_by": "summary",
        "sampled": f"{ref_s.values.size} of {ref_s.size} elements",
        "summary_checks": checks,
    }
    if failed:
        lower = abs(checks["max_abs"]["ref"] - checks["max_abs"]["other"])
        used = [
            abs(c["ref"] - c["other"]) / c["allowed"] for c in failed.values() if c["allowed"] > 0
        ]
        entry.pop("passes_with", None)
        entry.update(
            within=False,
            abs=max(sample["abs"] or 0.0, lower),
            tolerance_used=max([sample["tolerance_used"] or 0.0, *used])
            if "nonfinite" not in failed
            else None,
            note=f"its whole-tensor statistics leave the bound: {', '.join(failed)} "
            + "; ".join(
                f"{name} {c['ref']:.6g} vs {c['other']:.6g} (allowed difference {c['allowed']:.3g})"
                for name, c in failed.items()
            ),
        )
        entry["rel"] = entry["abs"] / scale if scale > 0 else None
    return entry


def by_summary(errors) -> dict:
    """A location's note when any activation it was judged on was a summary (a capture under
    --tensors summary or auto): a difference confined to elements the sample missed, within the
    statistics' checks, can hide."""
    if not any(e is not None and e.get("judged_by") == "summary" for e in errors):
        return {}
    return {
        "judged_by": "summary",
        "note": "located by summaries of the activations (statistics and a fixed "
        "sample of each): a difference confined to unsampled elements can "
        "hide; --tensors full captures them whole",
    }


def _without_units(shape) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)
