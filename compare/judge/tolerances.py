"""The tolerance policy: one place, by dtype and kind, printed in every report.

A tensor passes when  max|a - b| <= atol + rtol * max|reference|
(`reference` is the JAX side). The relative error reported is
max|a - b| / max|reference|: normwise, so near-zero elements do not blow it up.

Kinds: forward (step-0 outputs and loss) and grad (step-0 gradients) are
single evaluations from identical weights, so their bounds are tight. loss
(every step's loss) and params (final parameters) follow a whole run, where
Adam amplifies rounding differences: it normalises updates, so a gradient
that differs in its last bits can move a parameter by a different ~lr per
step, and the trajectories drift apart. Measured here (fp32, CPU, 50 steps):
step-0 logits 7.7e-7, grads <= 4e-8; loss 2.9e-6 (gpt-tiny) but 1.7e-4
(mlp-tiny, from step ~29 on) and final params up to 2.5e-3 (mlp-tiny).
`strict` keeps tight trajectory bounds for short runs.

fraction (tensor kinds: forward, grad, params; 0 unless a tolerance file
sets it): the share of a tensor's elements allowed over the bound, as
testing tools' "mismatched elements" allowances: a tensor passes when at
most floor(fraction * elements) of its elements are over. Every report
row counts the elements over, and every failing tensor says the smallest
atol, rtol or fraction that would have passed it (compare/judge/parity.py
`passes_with`), so a bound set too tight reads apart from a port error.

distribution (step-0 logits read as next-token distributions, as MaxText's
logit checker does): mean KL(reference || other) in nats per position at
most `kl_mean`, and the top-1 token the same at a share of positions at
least `top1`. In bfloat16 the logits are judged by these instead of max-abs,
whose size follows the logits' scale rather than what the model predicts.
Measured on gpt-tiny (CPU, step 0), each runtime fp32 vs its own bf16: KL
1.8e-7..5.3e-7, top-1 0.995..0.998; JAX bf16 vs the other three bf16: KL
4.0e-7..5.0e-7, top-1 0.997..0.999 (fp32 pairs: KL <= 1e-15, top-1 1.0).
The bf16 bounds leave room for trained models, whose sharper distributions
move further under bf16 (a top-1 flip needs a near-tie).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from common import backends
from common.files.fsutil import require_regular_file
from common.files.record import RunRecord
from compare.judge.islands import island_policy, islands_of

KINDS = ("forward", "grad", "loss", "params")
TENSOR_KINDS = ("forward", "grad", "params")  # judged element by element: a fraction may be over
DISTRIBUTION_KEYS = ("kl_mean", "top1")
DISTRIBUTION = {
    "float32": {"kl_mean": 1e-8, "top1": 0.99},
    "bfloat16": {"kl_mean": 1e-3, "top1": 0.9},
    # float64: max-abs decides (KL ~ rel^2)
    "float64": {"kl_mean": 1e-12, "top1": 0.99},
}

PROFILES: dict[str, dict[str, dict[str, dict[str, float]]]] = {
    "default": {
        "float32": {
            "forward": {"atol": 1e-5, "rtol": 1e-4},
            "grad": {"atol": 1e-6, "rtol": 1e-3},
            "loss": {"atol": 1e-4, "rtol": 5e-4},
            "params": {"atol": 5e-3, "rtol": 1e-2},
        },
        "bfloat16": {
            "forward": {"atol": 5e-2, "rtol": 2e-2},
            "grad": {"atol": 1e-3, "rtol": 5e-2},
            "loss": {"atol": 5e-2, "rtol": 2e-2},
            "params": {"atol": 2e-2, "rtol": 2e-2},
        },
        "float64": {
            "forward": {"atol": 1e-13, "rtol": 1e-9},
            "grad": {"atol": 1e-14, "rtol": 1e-9},
            "loss": {"atol": 1e-12, "rtol": 1e-9},
            "params": {"atol": 1e-9, "rtol": 1e-8},
        },
    },
    "strict": {
        "float32": {
            "forward": {"atol": 1e-6, "rtol": 1e-5},
            "grad": {"atol": 1e-7, "rtol": 1e-4},
            "loss": {"atol": 1e-5, "rtol": 1e-5},
            "params": {"atol": 1e-4, "rtol": 1e-4},
        },
        "bfloat16": {
            "forward": {"atol": 1e-2, "rtol": 1e-2},
            "grad": {"atol": 1e-4, "rtol": 1e-2},
            "loss": {"atol": 1e-2, "rtol": 1e-2},
            "params": {"atol": 5e-3, "rtol": 5e-3},
        },
        "float64": {
            "forward": {"atol": 1e-14, "rtol": 1e-10},
            "grad": {"atol": 1e-15, "rtol": 1e-10},
            "loss": {"atol": 1e-13, "rtol": 1e-10},
            "params": {"atol": 1e-10, "rtol": 1e-9},
        },
    },
}


class ToleranceError(ValueError):
    pass


def pair_policy(
    policy: dict, profile: str, ref: RunRecord, other: RunRecord, has_state: bool = False
) -> tuple[dict, dict]:
    """The policy the pair of runs is judged by, and {what: why} of each way it differs from
    `policy` (the run's, of `profile`). In float64: each tensor kind's rtol no tighter than what
    either runtime's own lowerings need (its registry row's `float64_rtol`); where the two keep
    BatchNorm's running variance by different conventions and the runs have running statistics
    (`has_state`), those and the eval-mode forward that reads them (`state` bounds, used by
    compare/judge/parity.py for those groups) at float32's after-training bounds, which hold the
    convention's 1/(n-1); with float32 islands on either side, float32's bounds from the first
    island on (compare/judge/islands.py)."""
    if str(ref.numerics.get("dtype")) != "float64":
        return policy, {}
    policy, why = runtime_policy(policy, (ref.backend, other.backend), has_state)
    return (
        island_policy(policy, load_policy(profile, "float32")) if islands_of(ref, other) else policy
    ), why


def runtime_policy(
    policy: dict, names: tuple[str, ...], has_state: bool = False
) -> tuple[dict, dict]:
    """The float64 policy of a pair of runtimes: their registry rows' own rounding and conventions
    (pair_policy)."""
    rows = [backends.info(n) for n in names if n in backends.registry()]
    out, why = {k: dict(v) for k, v in policy.items()}, {}
    for row in rows:
        for kind, rtol in row.float64_rtol:
            out[kind]["rtol"] = max(out[kind]["rtol"], rtol)
        if row.float64_rtol:
            rtols = ", ".join(f"{k} {v:g}" for k, v in row.float64_rtol)
            why[row.name] = f"{row.float64_why}: judged with rtol {rtols}"
    conventions = {r.name: r.running_var for r in rows}
    if has_state and len(set(conventions.values())) > 1:
        out["state"] = dict(PROFILES["default"]["float32"]["params"])
        kept = " and ".join(f"{v} on {n}" for n, v in conventions.items())
        why["running statistics"] = (
            f"the running variance is {kept} (a convention of the frameworks, 1/(n-1) "
            "relative): running statistics and the eval-mode forward judged at float32's "
            "after-training bounds"
        )
    return out, why


def load_policy(profile: str, dtype: str) -> dict[str, dict[str, float]]:
    """A named profile, or a JSON file {dtype: {kind: {atol, rtol}}} (missing kinds fall back to
    default)."""
    if profile in PROFILES:
        table = PROFILES[profile]
    else:
        # a FIFO would block forever
        path = require_regular_file(Path(profile), "--tolerance-profile", ToleranceError)
        try:
            table = json.loads(path.read_text())
        except OSError as e:
            raise ToleranceError(
                f"--tolerance-profile {profile}: not a profile ({', '.join(PROFILES)}) and "
                f"not a readable file ({e.strerror or e})"
            ) from None
        except json.JSONDecodeError as e:
            raise ToleranceError(f"--tolerance-profile {profile} is not valid JSON: {e}") from None
        except UnicodeDecodeError as e:
            raise ToleranceError(
                f"--tolerance-profile {profile} is not UTF-8 text (a binary file?): {e}"
            ) from None
        except RecursionError:
            raise ToleranceError(
                f"--tolerance-profile {profile} is not a tolerance file: its values nest too "
                "deep to read"
            ) from None
    check_table(table, profile)
    policy = {k: dict(v) for k, v in PROFILES["default"][dtype].items()}
    policy["distribution"] = dict(DISTRIBUTION[dtype])
    for kind in TENSOR_KINDS:
        policy[kind]["fraction"] = 0.0
    for kind, bounds in (table.get(dtype) or {}).items():
        policy[kind].update({k: float(v) for k, v in bounds.items()})
    return policy


def _kind_of(value) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), "a number")


def check_table(table, profile: str) -> None:
    """A tolerance file's whole table, every dtype in it (not only this run's): {dtype: {kind:
    {atol, rtol}}} with finite numbers >= 0 (top1 a share from 0 to 1). The error names the file,
    the field and the fix."""
    where = f"--tolerance-profile {profile}"
    example = '{"float32": {"loss": {"atol": 1e-4, "rtol": 5e-4}}}'
    if not isinstance(table, dict):
        raise ToleranceError(
            f"{where} holds {_kind_of(table)}; a tolerance file is a JSON object "
            f"{{dtype: {{kind: {{atol, rtol}}}}}}, e.g. {example}"
        )
    for dtype, kinds in table.items():
        if dtype not in DISTRIBUTION:
            raise ToleranceError(
                f"{where}: unknown dtype {dtype!r}; the dtypes are {', '.join(DISTRIBUTION)}"
            )
        if not isinstance(kinds, dict):
            raise ToleranceError(
                f"{where}: {dtype} is {_kind_of(kinds)}; it must be an object {{kind: {{atol, "
                f"rtol}}}}, e.g. {example}"
            )
        for kind, bounds in kinds.items():
            keys = (
                DISTRIBUTION_KEYS
                if kind == "distribution"
                else ("atol", "rtol", "fraction")
                if kind in TENSOR_KINDS
                else ("atol", "rtol")
            )
            if kind == "loss" and isinstance(bounds, dict) and "fraction" in bounds:
                raise ToleranceError(
                    f"{where}: {dtype}.loss.fraction: the loss is judged step by step, not by "
                    f"elements; a fraction applies to {', '.join(TENSOR_KINDS)}"
                )
            if (
                kind not in (*KINDS, "distribution")
                or not isinstance(bounds, dict)
                or set(bounds) - set(keys)
            ):
                raise ToleranceError(
                    f"{where}: {dtype}.{kind} must be one of {', '.join(KINDS)} with atol/rtol "
                    f"numbers (and a fraction for {', '.join(TENSOR_KINDS)}), or distribution "
                    "with kl_mean/top1"
                )
            for key, value in bounds.items():
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                # a 400-digit int: too big
                size = float(value) if number and abs(value) < 1e300 else math.inf
                share = key in ("top1", "fraction")
                if not number or not math.isfinite(size) or size < 0 or (share and size > 1):
                    rule = "a share from 0 to 1" if share else "a finite number >= 0"
                    shown = json.dumps(value) if not isinstance(value, float) else repr(value)
                    raise ToleranceError(f"{where}: {dtype}.{kind}.{key}={shown} must be {rule}")
