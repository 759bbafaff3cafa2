"""How whole tensors kept by --tensors auto's second pass (compare/runs/second_pass.py) mark the
judgement: the rows judged on both sides' whole tensors, and the keys that confirm a location found
on summaries."""

from __future__ import annotations


def location_keys(found: dict | None, group: str) -> set[str]:
    """The tensors a location found on summaries is confirmed by: its module's input and output (or
    their gradients), in the group its search read."""
    if not found or not found.get("module") or found.get("judged_by") != "summary":
        return set()
    return {f"{group}/{found['module']}", f"{group}/{found['module']}:in"}


def mark_second_pass(rows: dict[str, dict], ref: dict, other: dict) -> None:
    """Parity's tensor rows (compare/judge/parity.py) marked: `second_pass` where both sides' whole
    tensors were judged, and a note where a side's second pass did not reproduce its run."""
    a, b = ref.get("second_pass", {}), other.get("second_pass", {})
    for key in set(a.get("whole", ())) & set(b.get("whole", ())):
        if key in rows:
            rows[key]["second_pass"] = True
    for key, why in {**b.get("not_reproduced", {}), **a.get("not_reproduced", {})}.items():
        if key in rows:
            rows[key]["note"] = "; ".join(filter(None, [rows[key].get("note"), why]))
