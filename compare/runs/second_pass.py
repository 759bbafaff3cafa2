"""`--tensors auto`: summaries everywhere, whole tensors only where a summary leaves tolerance.

Every backend keeps its parameter-sized tensors as summaries (common/files/tensor_summary.py). When
a tensor judged by its summary leaves tolerance, compare runs the reference and that backend once
more (the same spec, start, batches and provoked recompiles, so the same values; no HLO, profile or
throughput, which change none), keeping those tensors whole (`--whole-tensors`), into
`<run>/<backend>/whole-tensors/` (a noise-floor run's beside it, when the pair is judged by one).
The report then judges them element by element with their real error.

A second pass is taken only where it reproduced the first run: the summary of each tensor it kept
whole must equal, bit for bit, the first run's summary of that tensor (count, sum, sum of squares,
largest magnitude, the sampled values). A backend that computes other bits when run again (a
nondeterministic kernel) leaves that tensor judged by its summary, and the report says why: two
runs' values are never mixed in one verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from common.files.record import RECORD_FILE, RecordError, read_record
from common.files.tensor_file import SUMMARIZED_GROUPS, read_tensors
from common.files.tensor_summary import TensorSummary, summarize
from common.weights import param_count
from compare.options import CompareOptions

WHOLE_DIR = "whole-tensors"
# `--tensors` defaults to auto above this (80 MB of float32 parameters)
AUTO_ABOVE_PARAMS = 20_000_000


def default_mode(params: int) -> tuple[str, str]:
    """(the tensor mode, why) of a run that did not choose one, from the model's parameter count."""
    if params > AUTO_ABOVE_PARAMS:
        return (
            "auto",
            f"the default above {AUTO_ABOVE_PARAMS:,} parameters (this model: {params:,})",
        )
    return "full", f"the default up to {AUTO_ABOVE_PARAMS:,} parameters (this model: {params:,})"


def needs_whole(judged) -> dict[str, list[str]]:
    """{backend: tensor keys} a second pass keeps whole: every tensor judged by its summary that
    left tolerance, on the backend that left it and on the reference."""
    wanted: dict[str, set[str]] = {}
    for name, parity in judged.pairs().items():
        failing = {
            key
            for key, row in (parity.get("tensors") or {}).items()
            if row.get("judged_by") == "summary" and not row["within"]
        }
        if failing:
            wanted.setdefault(judged.reference, set()).update(failing)
            wanted.setdefault(name, set()).update(failing)
    return {name: sorted(keys) for name, keys in wanted.items()}


class _Overlaid(Mapping):
    """A tensor group with some of its summaries replaced by the second pass's whole arrays (read
    when asked)."""

    def __init__(self, first: Mapping, whole: Mapping, replaced: set[str]):
        self._first, self._whole, self._replaced = first, whole, replaced

    def __getitem__(self, name: str):
        return self._whole[name] if name in self._replaced else self._first[name]

    def __iter__(self):
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    @property
    def summaries(self) -> dict:
        """{name: summary} of the tensors still kept as summaries."""
        return {
            k: v
            for k, v in getattr(self._first, "summaries", {}).items()
            if k not in self._replaced
        }


# a sum reduced in float32 on the devices (jax_impl/summary.py) against float64 on the host
ROUNDING = 1e-5


def _differs(first: TensorSummary, again: TensorSummary) -> str | None:
    """What differs between a run's summary of a tensor and the host's summary of its second pass's
    whole tensor: everything, bit for bit, of a summary the host made; of one made on the devices
    (which adds in float32, the host in float64) the sampled values, largest magnitude and counts
    bit for bit and the sum and sum of squares beyond their reduction's rounding, against the
    largest each could be (sqrt(n * sum of squares) bounds the sum of magnitudes): a change confined
    to unsampled elements below that rounding is not seen."""
    if first.shape != again.shape:
        return f"shape {list(again.shape)} instead of {list(first.shape)}"
    squares = max(first.stats["sum_sq"], again.stats["sum_sq"])
    allowed = (
        {"sum": ROUNDING * np.sqrt(first.stats["count"] * squares), "sum_sq": ROUNDING * squares}
        if first.on_device
        else {}
    )
    changed = [
        s
        for s in first.stats
        if abs(first.stats[s] - again.stats[s]) > allowed.get(s, 0.0)
        or np.isnan(first.stats[s]) != np.isnan(again.stats[s])
    ]
    if changed:
        return ", ".join(
            f"{s} {again.stats[s]:.9g} instead of {first.stats[s]:.9g}" for s in changed
        )
    if not np.array_equal(first.values, again.values, equal_nan=True):
        return "sampled values that differ"
    return None


ACTIVATION_GROUPS = ("activations", "activation_grads")


def with_second_pass(
    tensors: dict,
    run_dir: Path,
    run_id: str | None,
    name: str,
    section: str = "second_pass",
    groups=tuple(SUMMARIZED_GROUPS),
) -> dict:
    """`tensors` (read_tensors' groups of the run in `run_dir`, a run of backend `name` in compare
    run `run_id`: its second pass must be of the same) with the whole arrays of its second pass in
    place of the summaries they reproduce, in `groups`, and `tensors[section]`: {"whole": keys
    judged whole, "not_reproduced": {key: why}}. Unchanged when this run has no second pass.
    (`section` "activation_pass", `groups` ACTIVATION_GROUPS: the confirming capture of a location
    found on summaries, compare/runs/extra_runs.py.)"""
    path = run_dir / WHOLE_DIR / RECORD_FILE
    if not path.exists():
        return tensors
    try:
        record = read_record(path)
        if run_id is not None and record.run_id != run_id:
            raise RecordError(f"{path} belongs to run {record.run_id}, not to this run {run_id}")
        again = read_tensors(path, record)
    except RecordError as e:
        tensors[section] = {"whole": [], "not_reproduced": {}, "failed": str(e)}
        return tensors
    whole, not_reproduced = [], {}
    for group in groups:
        # nothing of it read from a file: nothing summarized
        if not hasattr(tensors.get(group), "summaries"):
            continue
        replaced = set()
        # read_tensors' LazyTensors: no array read
        for tensor, first in tensors[group].summaries.items():
            if tensor not in again[group]:
                continue
            key, kept = f"{group}/{tensor}", again[group][tensor]
            if isinstance(kept, TensorSummary):
                continue
            why = _differs(first, summarize(key, kept))
            if why:
                not_reproduced[key] = (
                    f"{name}'s second pass did not reproduce its run ({why}): judged by its "
                    "summary, since its values change from one run to the next"
                )
            else:
                replaced.add(tensor)
                whole.append(key)
        if replaced:
            tensors[group] = _Overlaid(tensors[group], again[group], replaced)
    tensors[section] = {"whole": sorted(whole), "not_reproduced": not_reproduced}
    return tensors


def activations_to_confirm(judged) -> dict[str, list[str]]:
    """{backend: activation keys} a confirming capture keeps whole: for every location found on
    summaries, the input and output (forward) or their gradients (backward) of its module still
    summarized (compare/judge/parity.py confirm_locations' `to_confirm`), on that backend and the
    reference; none once every one is whole or could not be reproduced."""
    wanted: dict[str, set[str]] = {}
    for name, parity in judged.pairs().items():
        done = parity.get("activation_pass") or {}
        if done.get("failed"):  # a confirming capture that cannot be read is not asked for again
            continue
        keys = {
            k
            for found in (
                parity.get("first_divergent_module"),
                parity.get("first_divergent_module_backward"),
            )
            for k in (found or {}).get("to_confirm", ())
        } - set(done.get("not_reproduced", {}))
        if keys:
            wanted.setdefault(judged.reference, set()).update(keys)
            wanted.setdefault(name, set()).update(keys)
    return {name: sorted(keys) for name, keys in wanted.items()}


def tensor_mode(opts: CompareOptions) -> tuple[dict, CompareOptions]:
    """How the backends keep their parameter-sized tensors ({mode, why}): --tensors, else by the
    model's size (the prepared spec's: a twin's parameters are known once it is described), and the
    options with it."""
    if opts.capture.tensors:
        return {"mode": opts.capture.tensors, "why": "--tensors"}, opts
    mode, why = default_mode(param_count(opts.spec_of(opts.names[0]).model))
    return {"mode": mode, "why": why}, opts.with_capture(tensors=mode)
