"""What one compare run was asked, typed and frozen: built once from the command line
(compare/__main__.py), the only thing the code below it reads of the flags. A change during the run
(its id and directory given, the prepared start standing in for the user's twin or checkpoint, the
tensor mode chosen) is a new object (`dataclasses.replace`), never a mutation."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from common import backends
from common.cli import SpecInputs
from common.generation import MIN_PROMPT
from common.spec import RunSpec, SpecError
from common.twin import twin_of, twin_words
from common.vocab import MaskSource, ParityMode
from common.weights.checkpoint_ref import CheckpointRef
from compare.judge.tolerances import PROFILES


@dataclass(frozen=True)
class Side:
    """One backend's side of the run: its interpreter, the spec overrides of its side alone
    (`--<flag>-set`), an existing run to reuse instead of running it (`--<flag>-record`), the flags
    its registry row passes through ((backend flag, value) pairs), and the spec it runs once derived
    (`CompareOptions.with_specs`)."""

    name: str
    python: str
    sets: tuple[str, ...] = ()
    record: Path | None = None
    passthrough: tuple[tuple[str, str], ...] = ()
    spec: RunSpec | None = None

    @property
    def flag(self) -> str:
        return backends.info(self.name).flag


@dataclass(frozen=True)
class Group:
    """The cooperating processes that run a backend (compare/runs/processes.py): `processes` on this
    host, of `hosts` hosts (this one is number `host`), joined through `coordinator` (None: one on
    127.0.0.1)."""

    processes: int = 1
    hosts: int = 1
    host: int = 0
    coordinator: str | None = None

    @property
    def total(self) -> int:
        return self.processes * self.hosts


@dataclass(frozen=True)
class Judging:
    """How the runs are judged: the tolerance profile, each dtype's noise-floor policy, the parity
    mode (and its seeds), and whether the backends must have run on one kind of device."""

    profile: str = "default"
    bf16: str = "noise-floor"
    fp32: str = "fixed"
    parity_mode: str = "deterministic"
    seeds: int = 5
    require_same_device: bool = False
    check_determinism: bool = False


@dataclass(frozen=True)
class Output:
    """Where the run goes and what is printed: its directory and id (given or made when the run
    starts), whether a finished run there may be replaced, and tables, JSON only, or nothing."""

    out: Path | None = None
    run_id: str | None = None
    overwrite: bool = False
    quiet: bool = False
    json: bool = False
    debug: bool = False


@dataclass(frozen=True)
class Capture:
    """What every backend keeps and measures beyond its losses: its parameter-sized tensors (full,
    summary or auto), step 0's activations, profiled steps, the HLO analysis, provoked recompiles,
    the compile cache."""

    tensors: str | None = None
    activations: bool = False
    profile: int = 0
    hlo: bool = True
    provoke: tuple = ()
    compile_cache: Path | None = None
    generate: int = 0  # --generate N: each backend's decode path run too (common/generation.py)


@dataclass(frozen=True)
class CompareOptions:
    names: tuple[str, ...]  # the backends, in the order they run
    reference: str
    sides: tuple[Side, ...]  # one per backend in `names`
    run: SpecInputs  # the run's spec (every side's before its own sets)
    checkpoint: CheckpointRef | None  # the start weights (the prepared start's, once it stands in)
    timeout_s: float
    hosts: Group
    judging: Judging
    output: Output
    capture: Capture
    # (family, interpreter): which describes that side of a twin
    describers: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, args: argparse.Namespace, names: list[str], reference: str) -> CompareOptions:
        """The options of a parsed compare command line, for the backends `names` judged against
        `reference` (a CheckpointError for a --checkpoint of no known format)."""
        sides, run = [], SpecInputs.of(args)
        # every backend's spec says it: recorded in each run record
        if args.parity_mode == ParityMode.EXACT:
            run = dataclasses.replace(
                run, overrides=(*run.overrides, f"train.dropout_masks={MaskSource.COMMON}")
            )
        for name in names:
            row = backends.info(name)
            passthrough = tuple(
                (o.backend_flag, getattr(args, o.compare_flag.lstrip("-").replace("-", "_")))
                for o in row.passthrough
            )
            sides.append(
                Side(
                    name,
                    getattr(args, f"{name}_python"),
                    tuple(getattr(args, f"{name}_set")),
                    getattr(args, f"{name}_record"),
                    passthrough,
                )
            )
        # a twin's side is described by the interpreter of the first backend running its family,
        # else of the first registered one (its environment has the framework)
        rows = [backends.info(n) for n in names] + list(backends.registry().values())
        describers = tuple(
            (family, getattr(args, f"{next(r.name for r in rows if r.family == family)}_python"))
            for family in backends.FAMILIES
        )
        checkpoint = CheckpointRef.parse(args.checkpoint) if args.checkpoint else None
        return cls(
            tuple(names),
            reference,
            tuple(sides),
            run,
            checkpoint,
            args.timeout,
            Group(args.processes, args.num_hosts, args.host_id, args.coordinator),
            Judging(
                args.tolerance_profile,
                args.bf16_tolerance,
                args.fp32_tolerance,
                args.parity_mode,
                args.seeds,
                args.require_same_device,
                args.check_determinism,
            ),
            Output(args.out, args.run_id, args.overwrite, args.quiet, args.json, args.debug),
            Capture(
                args.tensors,
                args.activations,
                args.profile,
                not args.no_hlo,
                tuple(args.provoke),
                args.compile_cache,
                args.generate,
            ),
            describers,
        )

    def paths_read(self) -> dict[str, Path]:
        """The paths this run reads, by flag: they must not lie in a run that --overwrite would
        remove."""
        inputs = {f"--{n.replace('_', '-')}-record": path for n, path in self.reused.items()}
        twin, checkpoint, profile = self.run.twin, self.checkpoint, self.judging.profile
        inputs["--spec"], inputs["--checkpoint"] = (
            self.run.path_read(),
            checkpoint.path if checkpoint else None,
        )
        inputs["--twin"] = Path(twin.rpartition(":")[0]) if twin and ".py:" in twin else None
        inputs["--tolerance-profile"] = Path(profile) if profile not in PROFILES else None
        return {flag: path for flag, path in inputs.items() if path}

    def check_tolerance_flags(self, spec: RunSpec) -> None:
        """A tolerance flag for another dtype than the run's is refused, never ignored: a float64
        run is judged by float64's bounds (every verdict's sensitivity stated), and
        --fp32-tolerance's noise floor is float32's."""
        if spec.train.dtype == "float64" and self.judging.fp32 == "noise-floor":
            raise SpecError(
                "--fp32-tolerance noise-floor: this run is float64, judged by float64's bounds "
                "with the sensitivity of every verdict stated; the float32 noise floor judges "
                "float32 runs: drop the flag, or run in float32"
            )

    def check_generate(self, spec: RunSpec) -> None:
        """--generate N: a language model whose twin declares its NNX decode path (the torch side's
        is a Hugging Face model's own, or declared), room in its positions for a prompt and N
        tokens, and a reference whose runtime runs decode paths."""
        n = self.capture.generate
        if not n:
            return
        twin = twin_of(spec.model)
        name = twin_words(spec.model)
        if spec.task != "lm":
            raise SpecError(f"--generate: takes a language model (task lm); {name} is {spec.task}")
        if "nnx" not in twin.decode and any(backends.info(b).family == "nnx" for b in self.names):
            raise SpecError(
                f"--generate: {name} names no NNX decode path; give "
                "decode={'nnx': 'file.py:decode'}, decode(model, tokens, positions, mask, cache) "
                "-> (logits, cache) (docs/reference/twin.md)"
            )
        if n > spec.model.seq_len - MIN_PROMPT:
            raise SpecError(
                f"--generate {n}: the model's {spec.model.seq_len} positions leave no room for a "
                f"prompt of {MIN_PROMPT} tokens; ask for at most {spec.model.seq_len - MIN_PROMPT}"
            )
        reused = [f"--{self.side(n).flag}-record" for n in self.reused]
        if reused:
            raise SpecError(
                f"--generate: {reused[0]} reuses a run that has no decode path run; run that "
                "backend here (drop the flag), or compare without --generate"
            )
        if not backends.info(self.reference).generates:
            able = [b for b in self.names if backends.info(b).generates]
            raise SpecError(
                f"--generate: the reference {self.reference} runs no decode path yet; judge "
                "against " + (f"--reference {able[0]}" if able else "jax or torch (--backend)")
            )

    def check_parity_mode(self, spec: RunSpec) -> None:
        """A run with randomness cannot be judged bit by bit; the statistical mode needs runs of its
        own."""
        mode, seeds = self.judging.parity_mode, self.judging.seeds
        dropout = getattr(spec.model, "dropout", 0) or dict(
            getattr(spec.model, "hparams", {}) or {}
        ).get("dropout", 0)
        if (
            mode == ParityMode.DETERMINISTIC
            and dropout
            and spec.train.dropout_masks != MaskSource.COMMON
        ):
            raise SpecError(
                f"model.dropout={dropout} makes every run random (each framework draws its own "
                "masks): "
                "judge it with --parity-mode statistical, feed every backend the same masks with "
                "--parity-mode exact, or set model.dropout=0"
            )
        reused = [self.side(n).flag for n in self.reused]
        if mode == ParityMode.STATISTICAL:
            if seeds < 3:
                raise SpecError(
                    f"--seeds {seeds}: the statistical parity mode needs at least 3 seeds per "
                    "backend"
                )
            if reused:
                raise SpecError(
                    f"--parity-mode statistical runs every backend --seeds times; it cannot reuse "
                    f"--{reused[0]}-record"
                )
        # a reused run is not run again: nothing would be checked
        if self.judging.check_determinism and reused:
            raise SpecError(
                f"--check-determinism runs each backend twice; it cannot reuse "
                f"--{reused[0]}-record (run that backend here instead)"
            )

    def describer(self, family: str) -> str:
        """The interpreter that describes the `family` side of a twin."""
        return dict(self.describers)[family]

    def side(self, name: str) -> Side:
        return next(s for s in self.sides if s.name == name)

    @property
    def reused(self) -> dict[str, Path]:
        """The backends not run here: {name: the run directory reused}."""
        return {s.name: s.record for s in self.sides if s.record}

    def side_inputs(self, name: str) -> SpecInputs:
        """What `name`'s spec is resolved from: the run's, with its side's own overrides after the
        run's."""
        return dataclasses.replace(self.run, overrides=self.run.overrides + self.side(name).sets)

    def with_specs(self, specs: dict[str, RunSpec]) -> CompareOptions:
        """Every side with the spec it runs (derived once before a twin or checkpoint is prepared,
        once after)."""
        return dataclasses.replace(
            self, sides=tuple(dataclasses.replace(s, spec=specs[s.name]) for s in self.sides)
        )

    def spec_of(self, name: str) -> RunSpec:
        spec = self.side(name).spec
        assert spec is not None, (
            f"{name}'s spec is derived before it is read (CompareOptions.with_specs)"
        )
        return spec

    def with_output(self, **changes) -> CompareOptions:
        return dataclasses.replace(self, output=dataclasses.replace(self.output, **changes))

    def with_capture(self, **changes) -> CompareOptions:
        return dataclasses.replace(self, capture=dataclasses.replace(self.capture, **changes))

    def with_start(self, spec_file: Path, init_file: Path) -> CompareOptions:
        """The backends run the prepared start: its spec file (the twin's canonical tree filled in)
        and its weights, in place of the user's twin, spec or checkpoint."""
        return dataclasses.replace(
            self,
            run=dataclasses.replace(self.run, spec=str(spec_file), twin=None),
            checkpoint=CheckpointRef.parse(init_file),
        )
