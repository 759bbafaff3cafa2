"""Numerical parity of two run records: settings first, then every tensor and every step's loss."""

from __future__ import annotations

import json

from common.capture.activations import FIELD_MARK
from common.files.record import RunRecord
from common.files.tensor_summary import TensorSummary
from common.twin.modules import ROOT_MODULE
from compare.judge import noise_floor
from compare.judge.backward import first_divergent_module_backward
from compare.judge.curves import compare_curves
from compare.judge.decided import judge_decisions, judge_later_choices
from compare.judge.distribution import judge_distribution
from compare.judge.extra_inputs import with_extra_inputs
from compare.judge.islands import before_first_island, islands_of
from compare.judge.noise_floor import Floors, loss_sensitivity
from compare.judge.own_loss import mark_loss_value, mark_own_loss
from compare.judge.sensitivity import group_sensitivity
from compare.judge.shards import device_check
from compare.judge.tensor_error import (
    by_summary,
    module_error,
    summary_error,
    tensor_error,
)
from compare.judge.unreached import mark_unreached, unreached_params
from compare.judge.whole_tensors import location_keys, mark_second_pass

# Record fields that must agree before numbers mean anything.
NUMERICS_FIELDS = ("dtype", "matmul_precision")
# what measures a dtype's noise floor (compare/judge/noise_floor.py), for a pair judged without one
FLOOR_FLAGS = {
    "float32": "--fp32-tolerance noise-floor",
    "bfloat16": "--bf16-tolerance noise-floor",
}


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def setting_differences(a: RunRecord, b: RunRecord) -> list[str]:
    """'field: a=.. b=..' for every spec or numerics field that differs."""
    fa, fb = _flatten({"spec": a.spec}), _flatten({"spec": b.spec})
    fa.update({f"numerics.{k}": a.numerics.get(k) for k in NUMERICS_FIELDS})
    fb.update({f"numerics.{k}": b.numerics.get(k) for k in NUMERICS_FIELDS})
    return [
        f"{k.removeprefix('spec.')}: {a.backend}={fa.get(k)!r} {b.backend}={fb.get(k)!r}"
        for k in sorted(set(fa) | set(fb))
        if k != "spec.name" and fa.get(k) != fb.get(k)
    ]


def ran_differences(ran: dict, asked) -> list[str]:
    """'SECTION.FIELD=RAN, this run's is ASKED' for each setting a reused record ran otherwise: its
    training settings, its mesh and its model (a preset's sizes, a twin's hyperparameters: its
    kernel switch among them; not where the twin's file lies nor its parameter tree)."""
    asked = json.loads(json.dumps(asked.to_dict()))

    def model(spec: dict) -> dict:
        fields = {k: v for k, v in (spec.get("model") or {}).items() if k not in ("twin", "params")}
        hparams = fields.pop("hparams", None) or {}
        return {**fields, **{f"hparams.{k}": v for k, v in hparams.items()}}

    parts = {
        "train": (ran.get("train", {}), asked["train"]),
        "mesh": (ran.get("mesh", {}), asked["mesh"]),
        "model": (model(ran), model(asked)),
    }
    return [
        f"{section}.{k}={had.get(k)!r}, this run's is {wants.get(k)!r}"
        for section, (had, wants) in parts.items()
        for k in sorted(set(had) | set(wants))
        if had.get(k) != wants.get(k)
    ]


# the eval-mode logits follow the whole run, as the parameters do (their tolerance)
KIND_OF_GROUP = {
    "outputs": "forward",
    "grads": "grad",
    "params": "params",
    "state": "params",
    "buffers": "params",
    "eval": "params",
}
AFTER_TRAINING = ("params/", "state/", "buffers/", "eval/")
# compared where both sides hold it: a port's own statistics or buffers (unlinked: the start state
# check lists them)
ONE_SIDED_GROUPS = ("state", "buffers")


def compare_tensors(
    ref: dict,
    other: dict,
    policy: dict,
    names: tuple[str, str] = ("the reference", "the other side"),
) -> dict[str, dict]:
    """{'<group>/<name>': error} for every tensor either side saved (`names`: the two backends, as
    the notes on non-finite values name them)."""
    out = {}
    for group, kind in KIND_OF_GROUP.items():
        # a pair whose running variances differ by convention has `state` bounds
        # (compare/judge/tolerances.py pair_policy)
        bounds = policy.get("state", policy[kind]) if group in ("state", "eval") else policy[kind]
        a, b = ref.get(group, {}), other.get(group, {})
        names_here = set(a) & set(b) if group in ONE_SIDED_GROUPS else set(a) | set(b)
        # a forward's other outputs are compared where both sides return one of that name
        if group == "outputs":
            names_here = (set(a) & set(b)) | (names_here & {"logits", "loss"})
        for name in sorted(names_here):
            key = f"{group}/{name}"
            if name not in a or name not in b:
                out[key] = {
                    "abs": None,
                    "rel": None,
                    "tolerance_used": None,
                    "within": False,
                    "kind": kind,
                    "note": f"missing on the {'reference' if name not in a else 'other'} side",
                }
                continue
            if group == "buffers" and not _trained(name, ref, other):
                out[key] = {
                    "abs": None,
                    "rel": None,
                    "tolerance_used": None,
                    "within": True,
                    "judged": False,
                    "kind": kind,
                    "note": "not compared: training changed it on neither side (the start "
                    "state check judged it as built)",
                }
                continue
            # each read from its file once (common/files/tensor_file.py LazyTensors)
            x, y = a[name], b[name]
            if isinstance(x, TensorSummary) or isinstance(y, TensorSummary):  # --tensors summary
                out[key] = {
                    **summary_error(
                        key,
                        x,
                        y,
                        bounds["atol"],
                        bounds["rtol"],
                        names,
                        bounds.get("fraction", 0.0),
                    ),
                    "kind": kind,
                }
                continue
            if group == "outputs" and name not in ("logits", "loss") and x.shape != y.shape:
                # another output of one name in two layouts (an NHWC port's
                # feature map): shown, not judged
                out[key] = {
                    "abs": None,
                    "rel": None,
                    "tolerance_used": None,
                    "within": True,
                    "judged": False,
                    "kind": kind,
                    "note": f"not compared: shapes differ, {list(x.shape)} vs "
                    f"{list(y.shape)} (a layout of the port's own?)",
                }
                continue
            widths = {x.dtype, y.dtype} if group == "buffers" else set()
            if len(widths) > 1 and all(d.kind == "f" for d in widths):
                # a table one side keeps in float32 in a float64 run (as HF keeps its rotary
                # frequencies): its rounding is not a port's; the start state check compared it as
                # built, at float32's bounds
                out[key] = {
                    "abs": None,
                    "rel": None,
                    "tolerance_used": None,
                    "within": True,
                    "judged": False,
                    "kind": kind,
                    "note": "not compared: " + " vs ".join(sorted(map(str, widths))),
                }
                continue
            out[key] = {
                **tensor_error(
                    x, y, bounds["atol"], bounds["rtol"], names, bounds.get("fraction", 0.0)
                ),
                "kind": kind,
            }
    return out


def _trained(name: str, ref: dict, other: dict) -> bool:
    """Whether training changed buffer `name` on either side (each record's buffers_changed; a
    record that does not say: judged)."""
    said = [side.get("buffers_changed") for side in (ref, other)]
    return any(s is None for s in said) or any(name in s for s in said)


def compare_losses(ref: list, other: list, bounds: dict) -> dict:
    """Per-step |Δloss|, its tolerance, and the first step that leaves it."""
    n = min(len(ref), len(other))
    per_step, first, bound_of = [], None, []
    for step in range(n):
        a, b = ref[step], other[step]
        bound_of.append(None if a is None else bounds["atol"] + bounds["rtol"] * abs(a))
        if a is None or b is None:
            per_step.append(None)
            first = step if first is None else first
            continue
        diff = abs(a - b)
        per_step.append(diff)
        if first is None and diff > bound_of[-1]:
            first = step
    if first is None and len(ref) != len(other):
        first = n  # one side stopped early
    finite = [d for d in per_step if d is not None]
    return {
        "first_divergent_step": first,
        "per_step_abs": per_step,
        "max_abs": max(finite) if finite else None,
        "steps_compared": n,
        "sensitivity": loss_sensitivity(ref[:n], bound_of),
    }


def worst_tensors(tensors: dict[str, dict], n: int = 10) -> list[dict]:
    """The n tensors that use the most of their tolerance (unmeasurable ones first).

    Ranked by |a-b| / (atol + rtol*max|ref|), not by relative error: a tensor
    that is ~0 on both sides (e.g. the key bias gradient, which softmax makes
    exactly zero in theory) has a huge relative error that means nothing.
    """

    def key(item):
        used = item[1]["tolerance_used"]
        return -(used if used is not None else float("inf"))

    judged = [(name, e) for name, e in tensors.items() if e.get("judged", True)]
    return [{"name": name, **e} for name, e in sorted(judged, key=key)[:n]]


def modules_not_compared(
    ref: dict, other: dict, skipped: tuple[dict, dict], names: tuple[str, str]
) -> dict:
    """{module: why} for every module whose step-0 output one side could not store or only one side
    has."""
    out = {
        k: f"{name}: {why}"
        for name, side in zip(names, skipped)
        for k, why in side.items()
        if not k.endswith(":in") and FIELD_MARK not in k
    }
    for k in [*ref, *(k for k in other if k not in ref)]:
        if k.endswith(":in") or FIELD_MARK in k or k in out:
            continue
        if k not in other or k not in ref:
            has, lacks = names if k in ref else names[::-1]
            out[k] = (
                f"only {has} recorded it ({lacks} has no module mapped to that path: a container "
                "no rename "
                "rule maps, a module packed, named otherwise, or absent; or its forward never ran "
                "or returned "
                "no tensor)"
            )
    return out


def first_divergent_module(
    ref: dict,
    other: dict,
    bounds: dict,
    names: tuple[str, str] = ("the reference", "the other side"),
    skipped: tuple[dict, dict] = ({}, {}),
    finer: tuple[set, dict] | None = None,
    more_inputs: tuple[dict, dict] = ({}, {}),
) -> dict | None:
    """Where two ports part at step 0: in the order the reference's modules finished, the first
    module whose input agrees but whose output does not (the culprit: everything it was fed agreed;
    one differing in its numbers before one differing only in shape, `shapes_differ`), else the
    first module whose output disagrees. None when a side captured nothing; `module` None when every
    compared module agrees (or none could be compared). `not_compared` lists every module left out
    and why. `finer`: (keys, bounds) judged by those bounds instead (a float64 run's modules before
    its first float32 island). `more_inputs`: each side's {module: array arguments besides the
    first}, which are not compared: of such a culprit only its first input is known to agree
    (`inputs_not_compared`)."""
    if not ref or not other:  # a side without a capture: nothing to set side by side
        return None
    not_compared = modules_not_compared(ref, other, skipped, names)
    outputs = [
        k for k in ref if not k.endswith(":in") and FIELD_MARK not in k and k not in not_compared
    ]
    if not outputs and not not_compared:
        return None
    keys, finer_bounds = finer or (set(), bounds)
    bounds_of = lambda key: finer_bounds if key in keys else bounds  # noqa: E731
    errors = {k: _output_error(ref, other, k, bounds_of(k), names) for k in outputs}
    diverging = [k for k in outputs if not errors[k]["within"]]
    # outputs that differ only in shape (the sides return other fields of a structured output, or a
    # padding differs): such a module is not the location where a module differing in its numbers is
    # fed agreeing input
    shape_only = [
        k
        for k in diverging
        if errors[k]["abs"] is None and errors[k].get("note", "").startswith("output shapes differ")
    ]

    def input_error(k: str) -> dict | None:
        a, b = ref.get(f"{k}:in"), other.get(f"{k}:in")
        return (
            None
            if a is None or b is None
            else module_error(a, b, bounds_of(f"{k}:in"), names, f"activations/{k}:in")
        )

    inputs = {}

    # the culprit: everything it was fed agreed
    def first_fed_agreeing(candidates: list[str]) -> str | None:
        for k in candidates:
            inputs[k] = inputs[k] if k in inputs else input_error(k)
            if inputs[k] is not None and inputs[k]["within"]:
                return k
        return None

    # not a module holding the shape-only one (the whole model is fed agreeing input, always)
    apart = [
        k for k in diverging if k not in shape_only and not any(_holds(k, s) for s in shape_only)
    ]
    culprit = first_fed_agreeing(apart) if shape_only else None
    culprit = culprit or first_fed_agreeing(diverging)
    module = culprit or (diverging[0] if diverging else None)
    uncompared = max(more_inputs[0].get(module, 0), more_inputs[1].get(module, 0)) if culprit else 0
    return {
        "step": 0,
        "module": module,
        "input_agrees": culprit is not None,
        "inputs_not_compared": uncompared,
        "input_used": (inputs[culprit] or {}).get("tolerance_used") if culprit else None,
        "output_error": errors[module] if module else None,
        "modules_compared": len(outputs),
        "modules_diverging": len(diverging),
        "shapes_differ": shape_only,
        "not_compared": not_compared,
        **({"modules_before_islands": len([k for k in outputs if k in keys])} if finer else {}),
        "sensitivity": {
            k: e["sensitivity"] for k, e in errors.items() if e.get("sensitivity") is not None
        },
        **by_summary([*errors.values(), *inputs.values()]),
    }


def _output_error(ref: dict, other: dict, k: str, bounds: dict, names: tuple[str, str]) -> dict:
    """Module `k`'s output against the reference's; where their shapes differ, a field of one side's
    structured output shaped as the other's output is compared instead (HF's vision tower returns
    its hidden states first and its pooled vector second, a port's tower the pooled vector alone),
    said in `field`."""
    a, b = ref[k], other[k]
    if tuple(a.shape) != tuple(b.shape):
        for side, (mine, theirs) in enumerate(((ref, b), (other, a))):
            field = next(
                (
                    f
                    for f in mine
                    if f.startswith(f"{k}{FIELD_MARK}")
                    and tuple(mine[f].shape) == tuple(theirs.shape)
                ),
                None,
            )
            if field:
                a, b = (mine[field], b) if side == 0 else (a, mine[field])
                error = module_error(a, b, bounds, names, f"activations/{field}")
                return {**error, "field": f"{names[side]}'s {field.partition(FIELD_MARK)[2]}"}
    return module_error(a, b, bounds, names, f"activations/{k}")


def _holds(module: str, inner: str) -> bool:
    return module == ROOT_MODULE or inner.startswith(f"{module}.")


def unexplained_differences(differences: list[str], intended: list[str]) -> list[str]:
    """The setting differences no one-sided override explains. A twin's hyperparameter is set as
    model.NAME (--jax-set model.rope_theta=...) and recorded as model.hparams.NAME."""
    said = {
        k.replace("model.", "model.hparams.", 1) for k in intended if k.startswith("model.")
    } | set(intended)
    return [d for d in differences if d.split(":")[0] not in said]


def check_parity(
    ref: RunRecord,
    other: RunRecord,
    ref_tensors,
    other_tensors,
    policy,
    intended: list[str],
    floors: Floors | None = None,
) -> dict:
    """The whole parity verdict of two runs (report.json's `parity`): settings, tensors, losses;
    with `floors` (bfloat16: each run's own float32 run), tensors and losses bounded by their noise
    floor."""
    differences = setting_differences(ref, other)
    unexplained = unexplained_differences(differences, intended)
    names = (ref.backend, other.backend)
    tensors = compare_tensors(ref_tensors, other_tensors, policy, names)
    unreached = unreached_params(
        ref_tensors.get("grads", {}), other_tensors.get("grads", {}), str(ref.numerics.get("dtype"))
    )
    mark_unreached(tensors, unreached)
    mark_second_pass(tensors, ref_tensors, other_tensors)
    if floors is not None:
        noise_floor.judge_tensors(tensors, ref_tensors, other_tensors, floors)
    distribution = judge_distribution(
        ref_tensors, other_tensors, policy["distribution"], str(ref.numerics.get("dtype")), tensors
    )
    loss = compare_losses(ref.losses, other.losses, policy["loss"])
    curves = None
    if floors is not None:
        loss = noise_floor.judge_losses(loss, ref.losses, other.losses, floors)
        curves = compare_curves(
            ref.losses, other.losses, floors.ref.losses, floors.other.losses, floors.policy["loss"]
        )
        if curves is not None and not curves["within"] and loss["first_divergent_step"] is None:
            # the trends part, though no one step did
            loss = {**loss, "first_divergent_step": curves["parts_at"]}
    comparable = not unexplained
    # step 0's logits, loss and gradients are measured before the first update: when one of them is
    # out of tolerance the runs part at step 0, even if the loss curves stay close for a while
    step0_fails = any(
        not t["within"] for k, t in tensors.items() if not k.startswith(AFTER_TRAINING)
    ) or (distribution is not None and not distribution["within"])
    first_step = 0 if step0_fails else loss["first_divergent_step"]
    passed = (
        comparable
        and first_step is None
        and all(t["within"] for t in tensors.values())
        and (distribution is None or distribution["within"])
    )
    islands = islands_of(ref, other)
    finer = (
        (
            before_first_island(
                list(ref_tensors.get("activations", {})), {m for i in islands.values() for m in i}
            ),
            policy["before_islands"]["forward"],
        )
        if "before_islands" in policy
        else None
    )

    # two captures' first divergent modules
    def locate(a: dict, b: dict) -> tuple[dict | None, dict | None]:
        forward = first_divergent_module(
            a.get("activations", {}),
            b.get("activations", {}),
            policy["forward"],
            names,
            (a.get("activations_skipped", {}), b.get("activations_skipped", {})),
            finer,
            (a.get("activations_more_inputs", {}), b.get("activations_more_inputs", {})),
        )
        with_extra_inputs(
            forward, a.get("activations", {}), b.get("activations", {}), policy["forward"], names
        )
        # where the forwards part, the backward gradients follow from it: the backward is searched
        # when they agree
        backward = (
            None
            if forward and forward["module"]
            else first_divergent_module_backward(
                a.get("activation_grads", {}),
                b.get("activation_grads", {}),
                list(a.get("activations", {})),
                policy["grad"],
                names,
                (a.get("activations_more_outputs", {}), b.get("activations_more_outputs", {})),
            )
        )
        return forward, backward

    forward, backward = locate(ref_tensors, other_tensors)
    mark_own_loss(forward, ref, tensors, ref_tensors.get("activations", {}))
    mark_loss_value(forward, backward, tensors)
    if forward is not None and list(other_tensors.get("capture_at") or [0, 0]) != [0, 0]:
        forward["captured_at"] = list(other_tensors["capture_at"])  # where the logits differ most
    activation_pass = confirm_locations(forward, backward, ref_tensors, other_tensors)
    fixed = floors is None and str(ref.numerics.get("dtype")) in ("float32", "float64")
    by_module = passed and _module_parts(forward, fixed)
    devices = device_check(ref, other, ref_tensors, other_tensors, tensors, policy["forward"])
    passed = passed and not (devices or {}).get("replicas_differ")
    result = {
        "checked": True,
        "comparable": comparable,
        "setting_differences": differences,
        "intended_differences": [d for d in differences if d not in unexplained],
        "distribution": distribution,
        "first_divergent_step": first_step,
        "loss": loss,
        "tensors": tensors,
        "first_divergent_module": forward,
        "first_divergent_module_backward": backward,
        "devices": devices,
        "worst": worst_tensors(tensors),
        "passed": passed and not by_module,
        "by_module": by_module,
        "curves": curves,
        "unreached": unreached,
        "activation_pass": activation_pass,
        # parted after an agreeing step 0 with no floor measured: training may have grown rounding
        "unmeasured_noise": FLOOR_FLAGS.get(str(ref.numerics.get("dtype")))
        if floors is None and first_step
        else None,
        "dropout_sites": dropout_sites(ref, other),
        "float32_islands": islands,
        "sensitivity": group_sensitivity(tensors, loss, forward, set(unreached)),
    }
    judge_decisions(result, ref_tensors, other_tensors, policy["forward"], locate)
    judge_later_choices(result, ref_tensors, other_tensors, policy["forward"])
    return result


def _module_parts(forward: dict | None, fixed_float32: bool) -> bool:
    """A module whose output leaves its bound though its input agrees (judged whole, not on
    summaries alone) is a port difference even where it moved no compared tensor out of tolerance (a
    norm's eps: 97 % of the logits' bound on a Swin, where a correct port uses 0.1 %). It fails a
    float32 or float64 run judged by fixed bounds, where correct ports sit far inside them; under a
    noise floor or in bfloat16 it stays a location, as does an output that differs in shape only (a
    module boundary the two sides draw apart: HF's Wav2Vec2 positional Conv1d before its trim,
    against a port's convolution after it)."""
    return (
        fixed_float32
        and forward is not None
        and forward["module"] is not None
        and forward["input_agrees"]
        and not forward.get("to_confirm")
        and forward["output_error"].get("abs") is not None
    )


def confirm_locations(
    forward: dict | None, backward: dict | None, ref: dict, other: dict
) -> dict | None:
    """A location found on summaries of the activations, marked `confirmed_whole` where its module's
    input and output (or their gradients) are compared whole on both sides (kept whole, or captured
    whole again by compare/runs/extra_runs.py confirm_locations and reproduced), else `to_confirm`:
    the keys still summarized. Returns what the confirming captures kept whole, or None when there
    were none."""
    for found, group in ((forward, "activations"), (backward, "activation_grads")):
        keys = location_keys(found, group)
        summarized = {k for k in keys for side in (ref, other) if _summarized(side, k)}
        if keys and not summarized:
            found["confirmed_whole"] = sorted(keys)
            found["note"] = (
                "found on summaries of the activations (statistics and a fixed sample of each); "
                "its "
                "module's input and output compared whole on both sides confirm it"
            )
        elif summarized:
            found["to_confirm"] = sorted(summarized)
    a, b = ref.get("activation_pass"), other.get("activation_pass")
    if a is None and b is None:
        return None
    return {
        "whole": sorted(set((a or {}).get("whole", ())) & set((b or {}).get("whole", ()))),
        "not_reproduced": {
            **(b or {}).get("not_reproduced", {}),
            **(a or {}).get("not_reproduced", {}),
        },
        "failed": "; ".join(filter(None, [(a or {}).get("failed"), (b or {}).get("failed")]))
        or None,
    }


def _summarized(tensors: dict, key: str) -> bool:
    group, _, name = key.partition("/")
    return name in getattr(tensors.get(group), "summaries", {})


def dropout_sites(ref: RunRecord, other: RunRecord) -> dict | None:
    """Runs fed common's dropout masks: the dropout calls each made (a port that drops out
    elsewhere, or not at all, takes other masks and parts at step 0: this says where to look). None
    without them."""
    a, b = ref.extra.dropout_sites, other.extra.dropout_sites
    if a is None or b is None:
        return None
    return {"reference": a, "other": b, "equal": a == b}
