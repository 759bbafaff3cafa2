"""The processes that describe a twin's sides before any backend trains (compare/runs/prepare.py):
started, waited for, stopped.

Each side describes itself in its own interpreter (`python -m torch_impl.describe`, `python -m
jax_impl.describe`); sides that share one are described by one process (driver/describe_sides.py),
and a side whose process goes on to make a backend's run (`runs`) is described alone, by a process
that then waits for that run (`--wait-for-run`): compare/runs/orchestrate.py run_backend hands it
its run, or stops it.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from common.procs import kill_group, start_group
from common.protocol import FROM_OUTSIDE, THEN, WAIT_FOR_RUN, error_line
from common.spec import RunSpec, TwinSpec
from common.twin import TwinError
from compare.runs.backend_output import BackendOutput
from compare.runs.guard import GUARD
from compare.runs.orchestrate import backend_env

# what each side's describe step writes; a step that exits 0 without them
# was stopped by the user's code
SIDE_FILES = {
    "torch": (
        "torch_params.json",
        "torch_modules.json",
        "torch_weights.json",
        "torch_init.safetensors",
    ),
    "NNX": ("nnx_params.json", "nnx_modules.json"),
}

# the module that describes each side, run as `python -m` in that side's interpreter
DESCRIBERS = {"torch": "torch_impl.describe", "NNX": "jax_impl.describe"}

# the backends that run each side: common.backends.FAMILIES
FAMILY_OF_SIDE = {"torch": "torch", "NNX": "nnx"}


@dataclass
class Step:
    proc: subprocess.Popen
    stderr: IO[str]  # an unnamed file
    sides: tuple[str, ...]  # the sides it describes, in order
    output: BackendOutput  # its stdout, read to its end
    # the backend whose run it waits to make once described (--wait-for-run)
    runs: str | None = None
    # epoch seconds at launch: a run it makes paid its interpreter start and imports here
    started_at: float = 0.0

    def stop(self) -> None:
        """The step's whole group killed (also after it exited: children its user code left),
        reaped."""
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        kill_group(self.proc)
        self.stderr.close()
        GUARD.unwatch(self.proc.pid)


def start_step(
    python: str,
    sides: list[tuple[str, list[str]]],
    spec_path: Path,
    out: Path,
    runs: str | None = None,
) -> Step:
    """A describe step in its own process group (it runs the user's factories: whatever they start
    goes with it), watched by compare's guard should compare itself be killed. `sides`: [(side, its
    own flags)]; several are described one after the other in one process
    (driver/describe_sides.py), which, given `runs`, then waits to make that backend's run. Its
    stderr goes to an unnamed file, not a pipe, which a process the user's code starts could hold
    open after the step exits; its stdout is read to its end."""
    commands = [
        [DESCRIBERS[side], "--spec", str(spec_path), "--out", str(out), *extra]
        for side, extra in sides
    ]
    command = (
        ["-m", *commands[0]]
        if len(commands) == 1 and not runs
        else [
            "-m",
            "driver.describe_sides",
            *[WAIT_FOR_RUN] * bool(runs),
            *[arg for c in commands for arg in [THEN, *c]][1:],
        ]
    )
    err, started_at = tempfile.TemporaryFile("w+", errors="replace"), time.time()
    try:
        proc = start_group(
            [python, *command],
            stdin=subprocess.PIPE if runs else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env=backend_env(),
            text=True,
            errors="replace",
            on_start=GUARD.watch,  # before a signal can act
        )
    except OSError as e:
        err.close()
        raise TwinError(
            f"cannot start {python} to describe the twin ({', '.join(c[0] for c in commands)}): "
            f"{e.strerror or e}"
        ) from None
    return Step(
        proc, err, tuple(side for side, _ in sides), BackendOutput(proc.stdout), runs, started_at
    )


def model_name(spec: RunSpec) -> str:
    return (
        f"twin {spec.model.twin!r}"
        if isinstance(spec.model, TwinSpec)
        else f"{spec.model.family} ({spec.name})"
    )


def _ended_or_described(step: Step, timeout_s: float) -> bool:
    """Whether the step exited, or said it is described and waits for its run, within
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while step.proc.poll() is None and not step.output.described.is_set():
        if time.monotonic() > deadline:
            return False
        step.output.described.wait(0.05)
    return True


def _missing(side: str, folder: Path) -> list[str]:
    return [f for f in SIDE_FILES[side] if not (folder / f).is_file()]


def wait_step(step: Step, folder: Path, spec: RunSpec, timeout_s: float) -> None:
    """Waits `timeout_s` per side the step describes, until it exits or, described, waits for its
    run; a failure is told of the side it was describing: the first whose files are not all
    written."""
    proc = step.proc
    stderr = None
    if _ended_or_described(step, timeout_s * len(step.sides)):
        if proc.poll() is None:  # described, waiting for its run
            return
        step.stderr.seek(0)
        stderr = step.stderr.read()
    side = next((s for s in step.sides if _missing(s, folder)), step.sides[-1])
    what = f"describing the {side} side of {model_name(spec)}"
    if stderr is None:
        raise TwinError(
            f"{what} (building its model) did not finish within --timeout {timeout_s:g} s; killed "
            "with "
            "its process group"
        )
    if proc.returncode < 0:
        raise TwinError(
            f"{what} was killed by {signal.Signals(-proc.returncode).name}"
            + (
                f": {said}"
                if (said := error_line(stderr, -proc.returncode in FROM_OUTSIDE))
                else ""
            )
        )
    if proc.returncode != 0:
        raise TwinError(error_line(stderr) or f"{what} exited with code {proc.returncode}")
    if _missing(side, folder):  # sys.exit(0) / os._exit(0) in the user's factory or forward
        raise TwinError(
            f"{what} exited with code 0 before writing {', '.join(_missing(side, folder))} "
            "(sys.exit "
            f"or os._exit in the {side} factory or its model?); a factory must return the model"
        )
