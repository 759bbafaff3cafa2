"""One warm interpreter per backend for every process of a compare run (preload/): a fork server per
backend to launch, importing what its row says its processes import first (common/backends.py
`preload`), started from that backend's interpreter with the environment its processes get, before
the twin is described. Every process of the run on that backend (the describe step, the main run,
the op check, captures, second pass, noise-floor, seed, generation and kernel floor runs) is then a
fork of it, its framework imported once. A process the server declines (an environment that differs
where a preloaded module reads it) or that comes while no server serves starts as a plain
interpreter, as it would without one; a run under servers already (the test suite's) starts none.
"""

from __future__ import annotations

import os

from common import backends
from common.spec import TwinSpec
from common.twin import twin_of
from compare.options import CompareOptions
from compare.runs.describe_steps import DESCRIBERS, FAMILY_OF_SIDE
from compare.runs.orchestrate import backend_env
from preload.client import MANIFEST_ENV
from preload.servers import Servers, ServerSpec, serving

# a server still importing after this (a loaded machine, an interpreter that is not one) serves no
# process that comes before it is done: they start plain, as without it
READY_S = 30.0
# the module that describes each family's side of a twin (compare/runs/describe_steps.py)
DESCRIBER_OF_FAMILY = {FAMILY_OF_SIDE[side]: module for side, module in DESCRIBERS.items()}


def server_specs(opts: CompareOptions) -> list[ServerSpec]:
    """A server for each backend this run launches whose row names its imports; each family's
    describe step goes to the first of that family on its describer's interpreter (a describe step
    that goes on to make its side's run, driver/describe_sides.py, goes where the first module it
    runs goes: preload/client.py)."""
    specs, undescribed = [], set(backends.FAMILIES)
    for name in opts.names:
        row = backends.info(name)
        python = opts.side(name).python
        if name in opts.reused or not row.preload:
            continue
        routes = [row.package]
        if python == opts.describer(row.family) and row.family in undescribed:
            undescribed.discard(row.family)
            routes.append(DESCRIBER_OF_FAMILY[row.family])
        specs.append(ServerSpec(name, python, imports_of(row, opts), tuple(routes)))
    return specs


def imports_of(row, opts: CompareOptions) -> tuple[str, ...]:
    """The backend's own imports, and transformers beside torch where the twin declares a Hugging
    Face model (~1-3 s of imports each of its processes would make; a plain torch.nn twin's make
    none, so a server that made them would only slow its start; common/backends.py
    `HF_IMPORTS`)."""
    spec = opts.spec_of(opts.names[0]) if opts.names else None
    declared = spec is not None and isinstance(spec.model, TwinSpec) and twin_of(spec.model).hf
    return (*row.preload, *(backends.HF_IMPORTS if declared and "torch" in row.preload else ()))


def start_servers(opts: CompareOptions, environ: dict) -> Servers | None:
    """The run's servers, started (still importing) and named in `environ` (MANIFEST_ENV) for the
    processes compare starts; None under servers already, or with none to start."""
    specs = [] if serving() else server_specs(opts)
    if not specs:
        return None
    servers = Servers(specs, backend_env(), ready_s=min(READY_S, opts.timeout_s))
    environ[MANIFEST_ENV] = str(servers.manifest)
    return servers


class WarmInterpreters:
    """A compare run's servers, started once its inputs are checked (`start`), ended on leaving the
    `with` however the run ends (a signal's KeyboardInterrupt, an exit); they also end with compare
    should it be killed (preload/server.py: they die with their parent)."""

    def __init__(self):
        self.servers: Servers | None = None

    def start(self, opts: CompareOptions) -> None:
        """The servers started, importing while compare goes on: a process for one waits for its
        own server only (preload/client.py); held here from the start, for __exit__ to end."""
        self.servers = start_servers(opts, os.environ)

    def counts(self) -> dict | None:
        """What the servers served so far, and how long processes waited for their imports
        (preload/servers.py counts); None without servers of this run's own."""
        return None if self.servers is None else self.servers.counts()

    def release(self) -> None:
        """The servers told to end once the run starts no process more (its extra runs made): they
        end while compare writes its report; leaving the `with` waits for them."""
        if self.servers is not None:
            self.servers.terminate()

    def __enter__(self) -> WarmInterpreters:
        return self

    def __exit__(self, *exc) -> None:
        if self.servers is not None:
            self.servers.stop()
            os.environ.pop(MANIFEST_ENV, None)
            self.servers = None
