"""Step 0's per-module activations, captured only where a divergence needs locating.

The activations name the first module where two ports part at step 0, and nothing else: in the
forward, or, when every activation agrees, in the backward pass (compare/judge/backward.py: each
side also takes the loss's gradient at every activation). Capturing them costs a forward through
every module's hooks, run eagerly (gpt-tiny on this CPU: 1.3 s on jax, 1.5 s on torchax, 0.55 s on
torch_xla, which computes every copy in one graph), and the gradients one backward more (jax: one
jitted program, a capture process 2.9 s instead of 2.1 s; torch: its autograd, no measurable cost),
so the backends run without it unless `--activations` asks for it. When a pair's step-0 tensors
leave tolerance, compare runs the reference and that backend once more with `--activations-only`
(from the start weights, no step trained), into `<run>/<backend>/activations/`; the report then
names the first divergent module from those runs. A reused record (`--<backend>-record`) is not run
again: its own activations are used when it has them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.data import in_first_capture
from common.files.record import RECORD_FILE, RecordError, read_record
from common.files.tensor_file import read_tensors
from compare.runs.orchestrate import BackendRun, run_backend

CAPTURE_DIR = "activations"


def parted_at_step0(judged, out: Path, captured: bool) -> tuple[list[str], tuple[int, int]]:
    """(the backends whose activations locate a divergence, the (row, token) their capture starts
    at): every one whose pair parts at step 0 with no module found yet, and the reference they are
    judged against, captured where the logits differ most (`worst_example`). `captured`: the runs
    captured their own (--activations) from the batch's first rows; those pairs are captured again
    only where the logits differ most elsewhere."""
    parity = judged.pairs()
    parted = [
        n
        for n, p in parity.items()
        if p.get("first_divergent_step") == 0
        and p.get("comparable")
        and (captured or p.get("first_divergent_module") is None)
    ]
    names = [judged.reference, *parted] if parted else []
    at = worst_example(judged, out, names) if names else (0, 0)
    if captured and in_first_capture(_task(judged) == "lm", at):
        return [], (0, 0)
    return names, at


def _task(judged) -> str:
    model = judged.inputs.spec.to_dict().get("model", {})
    return model.get("task") or ("lm" if model.get("family") == "gpt" else "classification")


def worst_example(judged, out: Path, names: list[str]) -> tuple[int, int]:
    """The (row, token) of step 0's batch where a parting pair's logits differ most (a language
    model's: the token too; any other task's: the row), so the capture looks where the difference
    is: a port that differs in one example only (a padded one, say) is invisible in another. (0, 0)
    when no pair's logits can be set side by side whole (kept as summaries, or of other shapes)."""
    task = _task(judged)
    # any record's: the judge has checked that those it judged belong to the run
    ref, worst, at = judged.reference, -1.0, (0, 0)
    a = _logits(out / ref)
    for name in names:
        b = _logits(out / name) if name != ref else None
        if a is None or b is None or a.shape != b.shape or a.ndim < 2:
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        per = (
            diff.reshape(*diff.shape[:2], -1).max(axis=-1)
            if task == "lm" and a.ndim >= 3
            else diff.reshape(diff.shape[0], -1).max(axis=-1)[:, None]
        )
        flat = int(np.nanargmax(per)) if np.isfinite(per).any() else 0
        if float(per.flat[flat]) > worst:
            worst, at = float(per.flat[flat]), (flat // per.shape[1], flat % per.shape[1])
    return at


def _logits(run_dir: Path):
    """A run's step-0 logits whole, or None (none, a summary)."""
    try:
        record = read_record(run_dir / RECORD_FILE)
        value = read_tensors(run_dir / RECORD_FILE, record)["outputs"].get("logits")
        return np.asarray(value) if isinstance(value, np.ndarray) else None
    except (RecordError, OSError, KeyError):
        return None


def capture(
    names: list[str], pythons: dict[str, str], launches: dict, out: Path, timeout_s: float
) -> dict[str, BackendRun]:
    """Run each backend once more with --activations into <out>/<name>/activations
    (KeyboardInterrupt propagates: run_backend has taken the running one's process group down)."""
    return {
        name: run_backend(name, pythons[name], launches[name], out / name / CAPTURE_DIR, timeout_s)
        for name in names
    }


# what a record says of its step-0 capture besides the arrays (common.capture.activations.Capture),
# by extra key
CAPTURE_FACTS = (
    "activations_skipped",
    "activations_more_inputs",
    "activations_more_outputs",
    "activations_replicas_differ",
)


# <backend>/activations/imposed: the capture with the reference's choices imposed
IMPOSED_DIR = "imposed"


def capture_facts(record) -> dict:
    """The capture's facts, and its decisions' (common/capture/decisions.py: module, op, k of each,
    in call order)."""
    return {
        **{k: getattr(record.extra, k) or {} for k in CAPTURE_FACTS},
        "decisions_facts": record.extra.decisions or [],
        "capture_at": record.extra.capture_at or [0, 0],
    }


def captured_activations(run_dir: Path, run_id: str | None, capture_dir: str = CAPTURE_DIR) -> dict:
    """What a capture run of this compare run left in `run_dir`/`capture_dir`: the activations, the
    loss's gradients at them, its decisions and the capture's facts (the modules it left out, the
    arrays besides the first each module took and returned), each empty when there is none, or not
    this run's."""
    path = run_dir / capture_dir / RECORD_FILE
    empty = {
        "activations": {},
        "activation_grads": {},
        "decisions": {},
        "decisions_facts": [],
        **{k: {} for k in CAPTURE_FACTS},
    }
    if not path.exists():
        return empty
    try:
        record = read_record(path)
        if run_id is not None and record.run_id != run_id:
            return empty
        tensors = read_tensors(path, record)
        return {
            "activations": tensors["activations"],
            "activation_grads": tensors["activation_grads"],
            "decisions": tensors["decisions"],
            **capture_facts(record),
        }
    except RecordError:
        return empty


# <backend>/activations/at-step-<s>: the choices at step s, where a pair's runs part
LATER_DIR = "at-step-"


def later_choices(run_dir: Path, run_id: str | None) -> dict[int, dict]:
    """{step: {"decisions", "decisions_facts"}} of the captures at a later step a backend made in
    this compare run (compare/runs/extra_runs.py choices_where_parted: that step's whole batch, from
    the weights its own steps left); {} when none."""
    found = {}
    for folder in sorted((run_dir / CAPTURE_DIR).glob(LATER_DIR + "*")):
        step = folder.name.removeprefix(LATER_DIR)
        captured = captured_activations(run_dir / CAPTURE_DIR, run_id, folder.name)
        if step.isdigit() and captured["decisions_facts"]:
            found[int(step)] = {
                "decisions": captured["decisions"],
                "decisions_facts": captured["decisions_facts"],
            }
    return found
