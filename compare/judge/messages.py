"""The one line a failed pair's parity is said in (report.json's message): where it parts and by how
much."""

from __future__ import annotations

from common.runtime_behaviours import words
from common.twin.modules import ROOT_MODULE
from compare.judge.curves import curves_words
from compare.judge.decided import decisions_cell, later_words
from compare.judge.extra_inputs import entered_words
from compare.judge.shards import replica_words
from compare.judge.tensor_error import BORDERLINE, passes_with_words


def _later_choices(parity: dict) -> str:
    """What a model that makes discrete choices adds to curves that parted after an agreeing step 0:
    its choices at the step where they part, where they were captured (compare/judge/decided.py
    judge_later_choices)."""
    found, later = parity.get("decisions"), parity.get("decisions_later")
    if (found and (not found.get("matched") or found.get("flipped"))) or not (found or later):
        return ""
    made = (
        f"{len(found['decisions'])} discrete choices (top-k, argmax, sort; first in "
        f"{found['decisions'][0]['module']}), all alike at step 0,"
        if found
        else "discrete choices (top-k, argmax, sort),"
    )
    return (
        f"; the model makes {made} and a tie flipped by rounding at a later step parts the runs "
        "by design: "
        + (later_words(later) if later else "their choices at that step were not captured")
    )


def _after_training_words(parity: dict, step) -> str:
    """Where only what training leaves differs (running statistics, buffers, the eval forward)."""
    failing = [k for k, t in parity["tensors"].items() if not t["within"]]
    if (
        failing
        and all(k.startswith(("eval/", "state/", "buffers/")) for k in failing)
        and step is None
    ):
        stats = [k.removeprefix("state/") for k in failing if k.startswith("state/")]
        held = [k.removeprefix("buffers/") for k in failing if k.startswith("buffers/")]
        return ", though training agrees: " + "; ".join(
            filter(
                None,
                [
                    stats
                    and f"the running statistics differ ({len(stats)}, e.g. {stats[0]}: a "
                    "momentum or variance "
                    "convention)",
                    held
                    and f"buffers that training updates differ ({len(held)}, e.g. {held[0]}: an "
                    "update rule, a "
                    "momentum's convention)",
                    any(k.startswith("eval/") for k in failing)
                    and "the trained model's eval-mode forward differs",
                ],
            )
        )
    return ""


def failure_message(name: str, parity: dict) -> str:
    """The one line that says where `name`'s parity (check_parity's result) failed, and by how
    much."""
    worst = parity["worst"][0] if parity["worst"] else None
    step = parity["first_divergent_step"]
    where = f"{name}: parity failed: first divergent step {step if step is not None else 'none'}"
    module, backward = (
        parity.get("first_divergent_module"),
        parity.get("first_divergent_module_backward"),
    )
    # the choices differ: what that says comes first
    if (parity.get("decisions") or {}).get("flipped"):
        where += f", step-0 decisions differ: {decisions_cell(parity)}"
    if module and module.get("in_loss"):  # compare/judge/own_loss.py
        where += ", first divergent in the loss: " + module["in_loss"]
    elif module and module["module"]:
        where += f", first divergent module {module['module']}"
        via = module.get("entered_through")  # compare/judge/extra_inputs.py
        if via:
            where += f" ({entered_words(via)})"
        # compare/reporting/render.py: _root_culprit
        if module["module"] == ROOT_MODULE and module.get("not_compared"):
            where += f" or a module not compared ({len(module['not_compared'])})"
    # the forwards agree, the gradient the loss sends back does not
    elif backward and backward.get("in_loss"):
        where += (
            ", first divergent in the loss: every module's forward agrees, the gradient of the "
            "loss at the "
            "model's output differs (the two losses compute differently: the twin's loss or task)"
        )
    elif backward and backward["module"]:  # the forwards agree: where the backward passes part
        where += f", first divergent module in the backward pass {backward['module']}"
    devices = parity.get("devices") or {}
    if devices.get("first_divergent_device") is not None:
        where += f", first divergent device {devices['first_divergent_device']}"
    if devices.get("replicas_differ"):
        where += f" ({replica_words(devices)})"
    where += _after_training_words(parity, step)
    if parity.get("by_module"):
        used = module.get("input_used") or 0
        where += (
            ": its output leaves its bound though its input agrees"
            + (
                f" (at {used:.0%} of its bound: the difference may enter before it)"
                if used > BORDERLINE
                else ""
            )
            + ", and every compared tensor is within tolerance (a difference too small to move "
            "them: a norm's "
            "eps, an approximated activation; --tolerance-profile strict judges every module "
            "tighter and may "
            "place it earlier)"
        )
    curves = parity.get("curves")
    if curves and not curves["within"]:
        where += ", " + curves_words(curves)
    sites = parity.get("dropout_sites")
    if sites and not sites["equal"]:
        where += (
            f", dropout calls differ ({len(sites['reference'])} in the reference, "
            f"{len(sites['other'])} "
            f"here: run records' extra.dropout_sites)"
        )
    if parity.get("unmeasured_noise"):
        where += (
            f" (step 0 agreed and no noise floor was measured: {parity['unmeasured_noise']} tells "
            "rounding "
            "that training grew from a port error" + _later_choices(parity) + ")"
        )
    # judged by a noise floor: the choices still say where the runs part
    elif parity.get("decisions_later"):
        where += ", " + later_words(parity["decisions_later"])
    if not worst:
        return where + behaviour_words(name, parity)
    size = worst.get("note") or (
        f"max abs {worst['abs']:.3g}"
        if isinstance(worst.get("abs"), (int, float))
        else "not measurable"
    )
    # a module that parts with its input agreeing is a port difference: no tolerance to loosen is
    # offered then
    located = bool(
        module and (module.get("in_loss") or module["module"] and module["input_agrees"])
    )
    return (
        where
        + f"; worst tensor {worst['name']} ({size}, within={worst['within']}"
        + (
            f"; {passes_with_words(worst['passes_with'])}"
            if worst.get("passes_with") and not located
            else ""
        )
        + ")"
        + behaviour_words(name, parity)
    )


def behaviour_words(name: str, parity: dict) -> str:
    """What a failed pair's line adds where the model meets a named behaviour of `name`'s runtime
    (common/runtime_behaviours.py): whether the run with it made eager torch's passed."""
    found = parity.get("runtime_behaviours")
    if not found:
        return ""
    said = "; ".join(words(b) for b in found["met"])
    matched = found.get("matched")
    if matched is None:
        return f"; the model meets a known behaviour of {name}: {said}; not checked against it"
    if matched["passed"] is None:
        return (
            f"; the model meets a known behaviour of {name}: {said}; the run with it made eager "
            f"torch's could not be judged ({matched['why']})"
        )
    if matched["passed"]:
        return (
            f"; explained by {name}'s own behaviour, not the port: {said}; with it made eager "
            f"torch's, {name} passes ({matched['run_dir']})"
        )
    return (
        f"; not explained by {name}'s own behaviour ({', '.join(found['met'])}): with it made "
        f"eager torch's, {name} still fails"
    )
