"""--generate N judged: each side's decode path against itself, then each against the reference's,
step by step (common/generation.py runs them; compare/runs/extra_runs.py generation_runs).

Every logits array is judged by the run's `forward` tolerance, atol + rtol * max|reference|, over
the real tokens (a left-padded prompt's padding is never judged):
- each side against itself: the decode path's logits at every step against one prefill of the whole
  sequence it was fed (a cache bug: a position, a mask, a slot, is found on its side even when the
  other side has one too), and that prefill against the training forward on the prompts with no
  padding (the decode path is the model that trained);
- each side against the reference: the prefill's logits, and each step's. Every side is fed the
  reference's tokens, so the steps stay comparable after a choice differs; where a side's own
  greedy choice first differs from the reference's, the step, the prompt and both sides' margins
  between their two best logits are said, and a choice whose reference margin is within the step's
  bound is a flip at a near-tie, not a port error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common import backends
from common.files.record import RECORD_FILE, RecordError, read_record
from common.files.tensor_file import read_tensors
from common.generation import GROUP
from common.vocab import ReportStatus
from compare.judge.noise_floor import FACTOR
from compare.judge.parity import first_divergent_module
from compare.judge.verdict import CheckResult

GENERATION_DIR = "generation"  # <run>/<backend>/generation: its generation run
# <run>/<backend>/generation/float32: a bfloat16 generation run's float32 twin, its noise floor
FLOOR_SUBDIR = "float32"
# <run>/<backend>/generation/at-step-<s>: the call making step s's logits captured module by module
CAPTURE_SUBDIR = "at-step-"


def capture_step(first_divergent_step) -> int:
    """The call a pair's parting step comes from: the prefill (0) for the prefill, else its own."""
    return 0 if first_divergent_step == "prefill" else int(first_divergent_step)


def read_decode_capture(out: Path, name: str, run_id: str | None, step: int) -> dict | None:
    """A backend's capture of its decode call at `step` in this compare run: {activations,
    skipped, more_inputs}, or None."""
    path = out / name / GENERATION_DIR / f"{CAPTURE_SUBDIR}{step}" / RECORD_FILE
    try:
        record = read_record(path)
        if run_id is not None and record.run_id != run_id:
            return None
        return {
            "activations": dict(read_tensors(path, record)["activations"]),
            "skipped": record.extra.activations_skipped or {},
            "more_inputs": record.extra.activations_more_inputs or {},
        }
    except (RecordError, OSError, KeyError):
        return None


def locate_in_step(
    out: Path, reference: str, name: str, run_id: str | None, step: int, tolerance: dict
) -> dict | None:
    """The first module where the two decode calls at `step` part (compare/judge/parity.py
    first_divergent_module on their captures), or None without both captures."""
    a, b = (read_decode_capture(out, n, run_id, step) for n in (reference, name))
    if a is None or b is None:
        return None
    found = first_divergent_module(
        a["activations"],
        b["activations"],
        tolerance,
        (reference, name),
        (a["skipped"], b["skipped"]),
        None,
        (a["more_inputs"], b["more_inputs"]),
    )
    return found and {**found, "step": step}


def read_generation(out: Path, name: str, run_id: str | None, sub: str = "") -> dict | None:
    """A backend's generation run of this compare run ({array: numpy}; `sub`: its float32 twin's),
    or None (none, failed, or another run's)."""
    path = out / name / GENERATION_DIR / sub / RECORD_FILE
    try:
        record = read_record(path)
        if run_id is not None and record.run_id != run_id:
            return None
        arrays = {k: np.asarray(v) for k, v in read_tensors(path, record)[GROUP].items()}
        return {**arrays, "how": record.extra.notes.get("decode_path", "")}
    except (RecordError, OSError, KeyError):
        return None


def _bound(tolerance: dict, reference: np.ndarray) -> float:
    return float(tolerance["atol"] + tolerance["rtol"] * np.max(np.abs(reference), initial=0.0))


@dataclass(frozen=True)
class Bounds:
    """What bounds a logits difference: the run's forward tolerance, or (a bfloat16 run whose
    float32 twins were measured: `floor_tolerance` float32's) FACTOR times the larger noise of the
    sides at that place, each its distance from its own float32 run, never below float32's
    bound."""

    tolerance: dict
    floor_tolerance: dict | None = None

    def of(self, reference: np.ndarray, noises: tuple | None) -> float:
        if self.floor_tolerance is None or noises is None:
            return _bound(self.tolerance, reference)
        return max(FACTOR * max(noises), _bound(self.floor_tolerance, reference))


def _noise(run: dict, floor: dict | None, key: str, where=...) -> float | None:
    """A run's distance from its float32 twin (`floor`) at `key`[`where`]; None without one."""
    if floor is None:
        return None
    return float(np.max(np.abs(run[key][where].astype(np.float64) - floor[key][where])))


def _noises(*found) -> tuple | None:
    return None if any(n is None for n in found) else tuple(found)


def _margin(logits: np.ndarray) -> float:
    """The gap between the two largest logits of one row."""
    top = np.sort(logits.astype(np.float64))[-2:]
    return float(top[1] - top[0])


def self_check(run: dict, bounds: Bounds, floor: dict | None = None) -> dict:
    """A side's decode path against one prefill of everything it fed, step by step, and that
    prefill against its training forward on the prompts with no padding (`floor`: its float32
    twin, in bfloat16)."""
    p = run["prefill"].shape[1]
    steps = []
    for s, logits in enumerate(run["steps"]):
        whole = run["whole"][:, p - 1 + s]
        noises = _noises(
            _noise(run, floor, "steps", s), _noise(run, floor, "whole", (slice(None), p - 1 + s))
        )
        diff = float(np.max(np.abs(logits.astype(np.float64) - whole)))
        steps.append({"step": s, "max_abs": diff, "bound": bounds.of(whole, noises)})
    parted = [s["step"] for s in steps if not s["max_abs"] <= s["bound"]]
    unpadded = run["mask"].all(axis=1)
    forward = {"prompts": int(unpadded.sum()), "max_abs": None, "within": None}
    if "forward" in run and unpadded.any():
        ref = run["forward"][unpadded]
        noises = _noises(
            _noise(run, floor, "whole", unpadded), _noise(run, floor, "forward", unpadded)
        )
        forward["max_abs"] = float(np.max(np.abs(run["whole"][unpadded].astype(np.float64) - ref)))
        forward["bound"] = bounds.of(ref, noises)
        forward["within"] = forward["max_abs"] <= forward["bound"]
    return {
        "steps": steps,
        "first_divergent_step": parted[0] if parted else None,
        "forward": forward,
        "passed": not parted and forward["within"] is not False,
    }


def pair_check(ref: dict, other: dict, bounds: Bounds, floors: tuple = (None, None)) -> dict:
    """A side's prefill and decode steps against the reference's, fed the same tokens (`floors`:
    the float32 twins of both, in bfloat16)."""
    p = ref["prefill"].shape[1]
    real = ref["mask"][:, :p]
    prefill_diff = float(np.max(np.abs(ref["prefill"] - other["prefill"].astype(np.float64))[real]))
    noises = _noises(*(_noise(r, f, "prefill", real) for r, f in zip((ref, other), floors)))
    prefill = {"max_abs": prefill_diff, "bound": bounds.of(ref["prefill"][real], noises)}
    steps = []
    for s, (a, b) in enumerate(zip(ref["steps"], other["steps"])):
        noises = _noises(*(_noise(r, f, "steps", s) for r, f in zip((ref, other), floors)))
        max_abs = float(np.max(np.abs(a.astype(np.float64) - b)))
        steps.append(
            {
                "step": s,
                "max_abs": max_abs,
                "rel": max_abs / max(float(np.max(np.abs(a))), np.finfo(np.float64).tiny),
                "kl": mean_kl(a, b),
                "bound": bounds.of(a, noises),
                "top1": float(np.mean(np.argmax(a, -1) == np.argmax(b, -1))),
            }
        )
    parted = [s["step"] for s in steps if not s["max_abs"] <= s["bound"]]
    # the least sensitive step: the relative change of the logits its bound would have let pass
    scales = [float(np.max(np.abs(a))) for a in ref["steps"]]
    shares = [s["bound"] / scale for s, scale in zip(steps, scales) if scale > 0]
    if not prefill_diff <= prefill["bound"]:
        parted.insert(0, "prefill")
    return {
        "prefill": prefill,
        "steps": steps,
        "first_divergent_step": parted[0] if parted else None,
        "first_flip": _first_flip(ref, other, steps),
        "sensitivity": max(shares) if shares else None,
        "passed": not parted,
    }


def mean_kl(ref_logits, other_logits) -> float:
    """The mean over rows of KL(softmax(ref) || softmax(other)), in float64."""

    def log_softmax(x):
        x = np.asarray(x, np.float64)
        shifted = x - np.max(x, axis=-1, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))

    p, q = log_softmax(ref_logits), log_softmax(other_logits)
    return float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1)))


def _first_flip(ref: dict, other: dict, steps: list[dict]) -> dict | None:
    """Where the side's own greedy choice first differs from the reference's: the step, the prompt,
    the two tokens and each side's margin between its two best logits; within rounding when the
    reference's margin is within that step's bound."""
    differs = np.argwhere(other["chosen"] != ref["fed"])
    if not len(differs):
        return None
    step, row = (int(i) for i in differs[0])
    margins = [_margin(run["steps"][step][row]) for run in (ref, other)]
    return {
        "step": step,
        "prompt": row,
        "reference_token": int(ref["fed"][step][row]),
        "token": int(other["chosen"][step][row]),
        "margin_reference": margins[0],
        "margin_other": margins[1],
        "within_rounding": margins[0] <= steps[step]["bound"],
    }


def runtime_facts(run: dict, n_new: int) -> dict:
    """What a side's decode path cost: time to the first token's logits (the prefill), the median
    decode step, and where the runtime counts them, the graphs compiled by the prefill, the first
    decode step and every later one (a static cache: none)."""
    seconds = run.get("seconds")
    facts = {
        "how": run.get("how", ""),
        "prefill_ms": float(seconds[0] * 1e3) if seconds is not None else None,
        "decode_ms_median": float(np.median(seconds[1:]) * 1e3)
        if seconds is not None and len(seconds) > 1
        else None,
    }
    compiles = run.get("compiles")
    if compiles is not None and len(compiles) > n_new:
        facts["compiles"] = {
            "prefill": int(compiles[0]),
            "first_decode_step": int(compiles[1]) if n_new else 0,
            "later_decode_steps": int(compiles[2 : n_new + 1].sum()),
        }
    return facts


def _module_words(found: dict | None) -> str:
    """Where in the step the sides part, when their captures of it name a module."""
    if not found or not found.get("module"):
        return ""
    fed = ", its input agreeing" if found["input_agrees"] else ""
    return f", first at module {found['module']}{fed}"


def _whose(own: dict, reference: str, name: str) -> str:
    """Which side a pair's difference lies on, where their own checks say: the one whose decode path
    differs from its own forward while the other's agrees."""
    wrong = [n for n in (reference, name) if n in own and not own[n]["passed"]]
    return (
        f" (on {wrong[0]}'s side: its decode path differs from its own forward)"
        if len(wrong) == 1
        else ""
    )


def generation_check(
    out: Path,
    names: list[str],
    reference: str,
    policy: dict,
    run_id: str | None,
    n_new: int,
    floor_policy: dict | None = None,
) -> CheckResult:
    """--generate's section and verdict: every side's decode path against itself and against the
    reference's; in bfloat16 with `floor_policy` (float32's), bounded by each run's measured
    distance from its float32 twin where both sides have one."""
    tolerance = policy["forward"]
    runs = {n: read_generation(out, n, run_id) for n in names}
    floors = {
        n: read_generation(out, n, run_id, FLOOR_SUBDIR) if floor_policy else None for n in names
    }
    bounds = Bounds(tolerance, floor_policy["forward"] if floor_policy else None)
    ref = runs.get(reference)
    section = {
        "new_tokens": n_new,
        "reference": reference,
        "tolerance": dict(tolerance),
        "judged_by": "noise-floor" if floor_policy else "fixed",
        "floor_not_measured": [n for n, r in runs.items() if r and floor_policy and not floors[n]],
        "prompt_lengths": ref["mask"][:, : ref["prefill"].shape[1]].sum(1).tolist() if ref else [],
        "not_run": {
            n: "its runtime runs no decode path yet (common/backends.py generates)"
            if not backends.info(n).generates
            else "its generation run failed or was not made"
            for n, r in runs.items()
            if r is None
        },
        "self": {n: self_check(r, bounds, floors[n]) for n, r in runs.items() if r is not None},
        "pairs": {
            n: pair_check(ref, r, bounds, (floors[reference], floors[n]))
            for n, r in runs.items()
            if r is not None and ref is not None and n != reference
        },
    }
    for n, pair in section["pairs"].items():
        if not pair["passed"]:
            step = capture_step(pair["first_divergent_step"])
            pair["first_divergent_module"] = locate_in_step(
                out, reference, n, run_id, step, {"fraction": 0.0, **tolerance}
            )
    nonfinite = {
        n: int(np.argmax(~np.isfinite(r["steps"]).reshape(len(r["steps"]), -1).all(-1)))
        for n, r in runs.items()
        if r is not None and not np.isfinite(r["steps"]).all()
    }
    section["nonfinite_from_step"] = nonfinite
    failures = (
        [f"{n}'s decode path gave non-finite logits from step {s}" for n, s in nonfinite.items()]
        + [
            f"{n}'s decode path differs from its own forward from step {c['first_divergent_step']}"
            if c["first_divergent_step"] is not None
            else f"{n}'s prefill differs from its training forward"
            for n, c in section["self"].items()
            if not c["passed"] and n not in nonfinite
        ]
        + [
            f"{n}'s decode differs from {reference}'s at "
            + (
                "the prefill"
                if c["first_divergent_step"] == "prefill"
                else f"step {c['first_divergent_step']}"
            )
            + _module_words(c.get("first_divergent_module"))
            + _whose(section["self"], reference, n)
            for n, c in section["pairs"].items()
            if not c["passed"]
        ]
    )
    section["runtime"] = {n: runtime_facts(r, n_new) for n, r in runs.items() if r is not None}
    # passed: every side asked for compared (one not run is said in not_run, and its run's failure
    # by the extra runs' check)
    section["passed"] = not failures and ref is not None and not section["not_run"]
    if ref is None:
        failures.append(f"the reference {reference} has no generation run to compare against")
    return CheckResult(
        "generation",
        ReportStatus.PARITY_FAILED if failures else ReportStatus.OK,
        ("generation: " + "; ".join(failures)) if failures else "",
        section,
    )
