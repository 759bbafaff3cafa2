"""What each backend process is given: one spec file, its only spec input, and the flags that say how to run.

compare resolves every backend's spec once, here, from the run's spec (a preset, a spec file, or the start
prepared for a twin or a checkpoint) with the overrides of both sides and of its own (`--<name>-set`), and
`run_backend` writes it into the backend's run directory as `spec.json` (common.record.SPEC_FILE) before the
backend starts: a twin reaches a backend as data (its canonical tree and layouts filled in), never as flags
to resolve again. The flags carry no spec: parity tensors, activations, the start checkpoint, the compile
cache, profile, HLO, provoked recompiles, the run id and what a registry row passes through.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from dataclasses import dataclass

from common import backends
from common.cli import resolve_spec
from common.spec import RunSpec
from compare.runs.cache import backend_cache_dir
from compare.judge.noise_floor import JITTER_ULPS


@dataclass(frozen=True)
class Group:
    """The cooperating processes that run a backend (compare/runs/processes.py): `processes` on this host, of
    `hosts` hosts (this one is number `host`), joined through `coordinator` (None: one on 127.0.0.1)."""

    processes: int = 1
    hosts: int = 1
    host: int = 0
    coordinator: str | None = None

    @property
    def total(self) -> int:
        return self.processes * self.hosts


@dataclass(frozen=True)
class Launch:
    """One backend run: the spec it runs, its flags and the processes that run it."""

    spec: RunSpec
    flags: tuple[str, ...]
    group: Group = Group()


def group_of(args) -> Group:
    """--processes, --num-hosts, --host-id and --coordinator: every launch of a run but its capture runs."""
    return Group(args.processes, args.num_hosts, args.host_id, args.coordinator)


def side_spec(args, name: str, **changes) -> RunSpec:
    """The spec `name` runs: the run's, with every override and its side's (`changes`: run flags such as
    steps or seed, for a capture or a seed run)."""
    side = argparse.Namespace(**{**vars(args), **changes})
    side.overrides = list(side.overrides) + getattr(args, f"{name}_set")
    return resolve_spec(side)


def _flags(args, name: str) -> list[str]:
    flags = [a for provocation in args.provoke for a in ("--provoke-recompile", str(provocation))]
    if getattr(args, "checkpoint", None):
        flags += ["--checkpoint", str(args.checkpoint)]
    for option in backends.info(name).passthrough:
        flags += [option.backend_flag, getattr(args, option.compare_flag.lstrip("-").replace("-", "_"))]
    if args.compile_cache:
        flags += ["--compile-cache", str(backend_cache_dir(args.compile_cache, name))]
    if args.profile:
        flags += ["--profile", str(args.profile)]
    if args.no_hlo:
        flags.append("--no-hlo")
    # --tensors auto: the backends keep summaries, compare's second pass what it needs whole (compare/runs/second_pass.py)
    return flags + ["--tensors", "summary" if args.tensors == "auto" else args.tensors, "--run-id", args.run_id]


def main_launch(args, name: str) -> Launch:
    """The run itself: every step, with the parity tensors (and step 0's activations with --activations)."""
    return Launch(side_spec(args, name), (*_flags(args, name), "--parity", *(["--activations"] * args.activations)),
                  group_of(args))


def capture_launch(args, name: str, whole: tuple[str, ...] = (), impose: Path | None = None,
                   at: tuple[int, int] = (0, 0)) -> Launch:
    """Step 0's activations from the start weights, nothing trained (compare/runs/capture_runs.py): no parity tensors,
    provoked recompiles, HLO, profile or throughput; one process (its slice of step 0 is one example). `whole`:
    activation keys kept whole under summaries (a location's confirming capture, compare/runs/extra_runs.py);
    `impose`: the run directory whose decisions this capture takes instead of its own (compare/judge/decided.py);
    `at`: the (row, token) of step 0's batch it captures from (compare/runs/capture_runs.py worst_example)."""
    changes = {"steps": 1, "provoke": [], "profile": 0, "no_hlo": True}
    side = argparse.Namespace(**{**vars(args), **changes})
    kept = ("--whole-tensors", ",".join(whole)) if whole else ()
    imposed = ("--impose-decisions", str(impose)) if impose else ()
    where = ("--capture-at", f"{at[0]},{at[1]}") if tuple(at) != (0, 0) else ()
    return Launch(side_spec(args, name, **changes),
                  (*_flags(side, name), "--activations-only", *kept, *imposed, *where))


def floor_launch(args, name: str, dtype: str) -> Launch:
    """A backend's noise-floor run (compare/judge/noise_floor.py), with the parity tensors (no HLO, profile or
    throughput): of a bfloat16 comparison, the same spec, start and batches in float32; of a float32 one, the
    same from start weights JITTER_ULPS off (train.start_jitter_ulps)."""
    changes = {"profile": 0, "no_hlo": True, "provoke": []}
    if dtype == "bfloat16":
        changes["dtype"] = "float32"
    else:
        changes["overrides"] = [*args.overrides, f"train.start_jitter_ulps={JITTER_ULPS}"]
    side = argparse.Namespace(**{**vars(args), **changes})
    return Launch(side_spec(args, name, **changes), (*_flags(side, name), "--parity", "--throughput-steps", "0"),
                  group_of(args))


def whole_launch(args, name: str, keys: list[str], floor_dtype: str | None = None) -> Launch:
    """--tensors auto's second pass (compare/runs/second_pass.py) of a main run, or of a noise-floor run of
    `floor_dtype`: the same spec, start and batches, so the same values, keeping `keys` whole (no HLO, profile,
    throughput or activations, which change no value)."""
    if floor_dtype:
        base = floor_launch(args, name, floor_dtype)
    else:
        quiet = argparse.Namespace(**{**vars(args), "profile": 0, "no_hlo": True})
        base = Launch(side_spec(args, name), (*_flags(quiet, name), "--parity", "--throughput-steps", "0"),
                      group_of(args))
    return Launch(base.spec, (*base.flags, "--whole-tensors", ",".join(keys)), base.group)


def seed_launch(args, name: str, seed: int) -> Launch:
    """A statistical mode's extra seed run: the losses only (no parity tensors, HLO, profile, throughput)."""
    changes = {"seed": seed, "profile": 0, "no_hlo": True}
    side = argparse.Namespace(**{**vars(args), **changes})
    return Launch(side_spec(args, name, **changes), (*_flags(side, name), "--throughput-steps", "0"), group_of(args))
