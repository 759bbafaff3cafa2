"""A pair's step-0 decisions (top-k, argmax, sort: common/capture/decisions.py) judged, and what
they do to its verdict.

Where the two sides chose alike, nothing changes. Where a choice differs by more than rounding (the
scores apart, or a margin wider than the bound), the port decides otherwise: the pair fails there,
at the module that made the decision, not at the first module its different choice reaches. Where
every differing choice is a tie flipped by rounding, the difference downstream says nothing of the
port: the torch side's capture is run once more with the reference's choices imposed
(compare/runs/extra_runs.py), and that capture decides. Every module's output and gradient agreeing
then, the pair passes at step 0 and its later steps are not judged (the two runs route tokens to
other experts from step 0 on, so their training differs by design); a module that still differs is
the port's difference and is named. Without such a capture (a runtime that cannot take another
side's choices) the pair fails with the flips explained and no module blamed."""

from __future__ import annotations

from common.capture.decisions import compare_decisions, decision_words, from_tensors

# the other side's tensors captured with the reference's choices (its `imposed` entry)
IMPOSED = "imposed"
# each side's choices at the step where a pair's runs part (compare/runs/capture_runs.py)
LATER = "later_choices"
NOT_JUDGED = (
    "steps after 0 not judged: the runs chose differently at step 0 (ties flipped by rounding), "
    "so their "
    "training differs by design"
)


def judge_decisions(parity: dict, ref: dict, other: dict, forward_bound: dict, locate) -> None:
    """Sets parity["decisions"] from the two captures' decisions and, where they differ, the
    location and the verdict as the module docstring says. `locate(ref_tensors, other_tensors) ->
    (forward, backward)`: the first divergent modules of two captures (compare/judge/parity.py)."""
    a, b = ref.get("decisions") or {}, other.get("decisions") or {}
    found = compare_decisions(
        from_tensors(a, ref.get("decisions_facts") or []),
        from_tensors(b, other.get("decisions_facts") or []),
        forward_bound["atol"],
        forward_bound["rtol"],
    )
    if found is None:
        return
    parity["decisions"] = found
    if not found["matched"] or not found["flipped"] or (found["ties_only"] and parity["passed"]):
        return  # no choice differs, or only at ties that moved no compared tensor out of its bound
    parity["passed"] = False
    if not found["ties_only"]:
        decision, forward = found["first_not_a_tie"], parity.get("first_divergent_module") or {}
        culprit = forward.get("module") if forward.get("input_agrees") else None
        if culprit and not _decided_first(
            list(ref.get("activations", {})), decision["module"], culprit
        ):
            # a module that parts earlier changed what was ranked: the flip follows
            found["after"] = culprit
            return
        parity["first_divergent_module"] = {
            "step": 0,
            "module": decision["module"],
            "decision": decision,
            "input_agrees": False,
            "output_error": {},
            "not_compared": {},
            **{k: forward[k] for k in ("modules_compared", "modules_diverging") if k in forward},
        }
        parity["first_divergent_module_backward"] = None
        return
    imposed = other.get(IMPOSED) or {}
    if not imposed.get("activations"):
        found["imposed"] = None
        parity["first_divergent_module"] = parity["first_divergent_module_backward"] = None
        return
    forward, backward = locate(ref, imposed)
    agrees = (
        bool(forward)
        and forward["module"] is None
        and not (backward and (backward.get("module") or backward.get("in_loss")))
    )
    found["imposed"] = {
        "agrees": agrees,
        "modules_compared": (forward or {}).get("modules_compared"),
    }
    parity["first_divergent_module"], parity["first_divergent_module_backward"] = forward, backward
    if agrees:
        parity["passed"] = parity["comparable"]
        parity["not_judged"] = NOT_JUDGED


def _decided_first(order: list[str], decided_in: str, culprit: str) -> bool:
    """Whether a decision made in module `decided_in` comes before module `culprit` is called (the
    activations' order: each module's input kept as it starts); a module the capture did not keep
    counts as first."""
    a, b = f"{decided_in}:in", f"{culprit}:in"
    return a not in order or b not in order or order.index(a) <= order.index(b)


def needs_imposing(parity: dict) -> bool:
    """Whether this pair's choices differ only at ties and no capture with the reference's choices
    was made."""
    found = parity.get("decisions") or {}
    return bool(found.get("ties_only")) and not found.get("imposed") and not parity.get("passed")


def decisions_cell(parity: dict) -> str:
    """The report's row: what the decisions showed and, where one was made, what the imposed capture
    found."""
    found = parity.get("decisions")
    if not found:
        return "-"
    words = decision_words(found)
    if found.get("ties_only") and "imposed" not in found:
        return words + "; every compared tensor within its bound all the same"
    if found.get("after"):
        words += f", after {found['after']} parts (below): the flips follow from what it changed"
    if found.get("ties_only"):
        imposed = found.get("imposed")
        words += (
            "; with the reference's choices imposed, every module and its gradient agree ("
            f"{imposed['modules_compared']} modules): " + NOT_JUDGED
            if imposed and imposed["agrees"]
            else "; with the reference's choices imposed, a module still differs (below)"
            if imposed
            else "; not checked with the reference's choices imposed (this runtime cannot take "
            "them): the "
            "port is not judged past the flips"
        )
    return words


def judge_later_choices(parity: dict, ref: dict, other: dict, forward_bound: dict) -> None:
    """Sets parity["decisions_later"]: the two sides' choices at the step where their runs part
    after a step 0 that agreed in everything, choices included (compare/runs/extra_runs.py
    choices_where_parted), each side's from the weights its own steps left, over that step's whole
    batch. It explains the parting and decides nothing: by then each side's weights carry its own
    rounding, so the scores it ranks do too, and whether that drift is rounding is the noise floor's
    to judge (compare/judge/noise_floor.py)."""
    for step, theirs in (other.get(LATER) or {}).items():
        ours = (ref.get(LATER) or {}).get(step)
        found = ours and compare_decisions(
            from_tensors(ours["decisions"], ours["decisions_facts"]),
            from_tensors(theirs["decisions"], theirs["decisions_facts"]),
            forward_bound["atol"],
            forward_bound["rtol"],
        )
        if found:
            parity["decisions_later"] = {"step": step, **found}


def later_words(found: dict) -> str:
    """One line: the choices at the step where the runs parted (judge_later_choices)."""
    step = found["step"]
    if not found["matched"]:
        return f"at step {step}: {found['why']}"
    if not found["flipped"]:
        return (
            f"at step {step}, where the runs part, every one of {len(found['decisions'])} "
            "decisions chose alike "
            "over its whole batch: the runs part elsewhere"
        )
    flips = [d for d in found["decisions"] if d["flipped"]]
    first, ties = flips[0], sum(d["flipped"] for d in flips if d["within_rounding"])
    explained = all(d["widest_margin"] <= d["scores_max_abs"] for d in flips)
    return (
        f"at step {step}, where the runs part, {found['flipped']} choices differ over its whole "
        "batch (first at "
        f"{first['module']}, {first['op']} k={first['k']}: {first['flipped']} of {first['rows']} "
        "rows, widest "
        f"margin {first['widest_margin']:.2e}); {ties} of them within rounding of a tie (the "
        "forward bound), "
        + (
            "every one within how far the ranked scores had drifted apart by then "
            f"({max(d['scores_max_abs'] for d in flips):.2e}: what each side's own steps left, "
            "rounding or a port "
            "error, which the noise floor tells apart)"
            if explained
            else "some wider than the ranked scores are apart (a port's ranking)"
        )
    )
