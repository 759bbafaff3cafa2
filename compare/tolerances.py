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
"""
from __future__ import annotations

import json
from pathlib import Path

KINDS = ("forward", "grad", "loss", "params")

PROFILES: dict[str, dict[str, dict[str, dict[str, float]]]] = {
    "default": {
        "float32": {"forward": {"atol": 1e-5, "rtol": 1e-4}, "grad": {"atol": 1e-6, "rtol": 1e-3},
                    "loss": {"atol": 1e-4, "rtol": 5e-4}, "params": {"atol": 5e-3, "rtol": 1e-2}},
        "bfloat16": {"forward": {"atol": 5e-2, "rtol": 2e-2}, "grad": {"atol": 1e-3, "rtol": 5e-2},
                     "loss": {"atol": 5e-2, "rtol": 2e-2}, "params": {"atol": 2e-2, "rtol": 2e-2}},
    },
    "strict": {
        "float32": {"forward": {"atol": 1e-6, "rtol": 1e-5}, "grad": {"atol": 1e-7, "rtol": 1e-4},
                    "loss": {"atol": 1e-5, "rtol": 1e-5}, "params": {"atol": 1e-4, "rtol": 1e-4}},
        "bfloat16": {"forward": {"atol": 1e-2, "rtol": 1e-2}, "grad": {"atol": 1e-4, "rtol": 1e-2},
                     "loss": {"atol": 1e-2, "rtol": 1e-2}, "params": {"atol": 5e-3, "rtol": 5e-3}},
    },
}


class ToleranceError(ValueError):
    pass


def load_policy(profile: str, dtype: str) -> dict[str, dict[str, float]]:
    """A named profile, or a JSON file {dtype: {kind: {atol, rtol}}} (missing kinds fall back to default)."""
    if profile in PROFILES:
        table = PROFILES[profile]
    else:
        path = Path(profile)
        try:
            table = json.loads(path.read_text())
        except OSError as e:
            raise ToleranceError(f"--tolerance-profile {profile}: not a profile ({', '.join(PROFILES)}) and "
                                 f"not a readable file ({e.strerror or e})") from None
        except json.JSONDecodeError as e:
            raise ToleranceError(f"--tolerance-profile {profile} is not valid JSON: {e}") from None
    policy = {k: dict(v) for k, v in PROFILES["default"][dtype].items()}
    for kind, bounds in (table.get(dtype) or {}).items():
        if kind not in KINDS or not isinstance(bounds, dict) or set(bounds) - {"atol", "rtol"}:
            raise ToleranceError(f"--tolerance-profile {profile}: {dtype}.{kind} must be one of {', '.join(KINDS)} "
                                 "with atol/rtol numbers")
        policy[kind].update({k: float(v) for k, v in bounds.items()})
    return policy
