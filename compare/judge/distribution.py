"""Step-0 logits judged as next-token distributions, as MaxText's logit checker does: KL divergence
and top-k agreement (compare/judge/tolerances.py `distribution`); in bfloat16 they decide whether
the logits are within."""

from __future__ import annotations

import numpy as np

from common.files.tensor_summary import TensorSummary, summarize


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _masks_agree(ref: np.ndarray, other: np.ndarray) -> bool:
    """Logits whose only non-finite values are -inf at the same positions on both sides (a masked
    class or vocabulary entry), each position keeping a finite logit: distributions both sides
    define alike."""
    if (
        np.isnan(ref).any()
        or np.isnan(other).any()
        or np.isposinf(ref).any()
        or np.isposinf(other).any()
    ):
        return False
    masked = np.isneginf(ref)
    return bool(np.array_equal(masked, np.isneginf(other)) and not masked.all(axis=-1).any())


def logit_agreement(ref: np.ndarray, other: np.ndarray, chunk: int = 4096) -> dict | None:
    """Step-0 logits as next-token distributions: KL(ref || other) per position (nats; mean and max)
    and how often the top-1 token agrees and how much of the top-5 overlaps. None for mismatched
    shapes, fewer than two classes, or non-finite logits other than -inf masks both sides share (a
    masked entry has probability 0 on both sides and adds 0 to KL). Rows go in chunks so a 50k
    vocabulary stays in memory."""
    if (
        ref.shape != other.shape
        or ref.ndim < 2
        or ref.shape[-1] < 2
        or not _masks_agree(ref, other)
    ):
        return None
    a, b = ref.reshape(-1, ref.shape[-1]), other.reshape(-1, other.shape[-1])
    k = min(5, a.shape[1])
    kl, top1, topk = [], [], []
    for start in range(0, len(a), chunk):
        x, y = (
            a[start : start + chunk].astype(np.float64),
            b[start : start + chunk].astype(np.float64),
        )
        lx, ly = _log_softmax(x), _log_softmax(y)
        p = np.exp(lx)
        # -inf - -inf at a shared mask: its probability 0 makes it 0
        with np.errstate(invalid="ignore"):
            # KL is never negative: a row's sum below 0 (-1.7e-17 for agreeing logits) is rounding
            kl.append(np.maximum(np.sum(np.where(p > 0, p * (lx - ly), 0.0), axis=-1), 0.0))
        top1.append(x.argmax(-1) == y.argmax(-1))
        tx, ty = (
            np.argpartition(-x, k - 1, axis=-1)[:, :k],
            np.argpartition(-y, k - 1, axis=-1)[:, :k],
        )
        # a row's k indices are distinct on each side: its overlap is its count of equal pairs
        topk.append((tx[:, :, None] == ty[:, None, :]).sum(axis=(1, 2)) / k)
    kl_all = np.concatenate(kl)
    return {
        "kl_mean": float(kl_all.mean()),
        "kl_max": float(kl_all.max()),
        "top1": float(np.concatenate(top1).mean()),
        f"top{k}": float(np.concatenate(topk).mean()),
        "positions": len(a),
    }


def _sampled_rows(ref, other) -> tuple:
    """The logit rows two summaries kept (common/files/tensor_summary.py: the same rows on both
    sides; a side kept whole is summarized alike), and how many of how many positions; (None, None,
    None) when they sampled other rows."""
    ref_s, other_s = (
        x if isinstance(x, TensorSummary) else summarize("outputs/logits", x) for x in (ref, other)
    )
    if ref_s.shape != other_s.shape or not np.array_equal(ref_s.indices, other_s.indices):
        return None, None, None
    width = ref_s.shape[-1]
    rows = ref_s.values.reshape(-1, width), other_s.values.reshape(-1, width)
    return (*rows, f"{len(rows[0])} of {ref_s.size // width} positions")


def judge_distribution(
    ref: dict, other: dict, bounds: dict, dtype: str, tensors: dict
) -> dict | None:
    """Logit agreement with its verdict; in bfloat16 it also decides whether the logits are
    within."""
    logits_ref, logits_other = (
        ref.get("outputs", {}).get("logits"),
        other.get("outputs", {}).get("logits"),
    )
    if logits_ref is None or logits_other is None:
        return None
    sampled = None
    # judged on its rows
    if isinstance(logits_ref, TensorSummary) or isinstance(logits_other, TensorSummary):
        logits_ref, logits_other, sampled = _sampled_rows(logits_ref, logits_other)
        if sampled is None:
            return None
    # None unless both define the same distributions
    agreement = logit_agreement(logits_ref, logits_other)
    if agreement is None:
        return None
    if sampled:
        agreement["sampled"] = sampled
    agreement["within"] = (
        agreement["kl_mean"] <= bounds["kl_mean"] and agreement["top1"] >= bounds["top1"]
    )
    entry = tensors.get("outputs/logits")
    if dtype == "bfloat16" and entry is not None:
        entry.update(
            within=agreement["within"],
            note="bfloat16: judged by KL and top-1 agreement, not max abs",
        )
        entry.pop("passes_with", None)  # an atol or rtol does not decide these logits
    return agreement
