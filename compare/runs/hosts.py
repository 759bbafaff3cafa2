"""compare across processes and hosts: every backend run as cooperating processes
(compare/runs/processes.py).

`--processes N` runs each backend as N processes on this machine. A multi-host run is the same
command on every host with `--num-hosts H --host-id I --coordinator HOST:PORT` (host 0's address):
each host starts its N processes, with ids from I x N, and all H x N join one JAX multi-controller
run. Process 0, on host 0, writes each record, and host 0 alone writes the report; the other hosts
write their processes' logs and exit with their backends' status. Every host makes the same launches
in the same order (each on its own port, from PORT up), so the extra runs whose need only the report
shows (step 0's activation capture, auto's second pass) are not made across hosts: rerun the pair on
one host to locate a divergence.
"""

from __future__ import annotations

import sys

from common import backends
from common.cli import bounded_int
from common.multiprocess import refuse_per_rank_processes
from common.spec import SpecError
from common.twin import twin_of
from common.vocab import BackendStatus, ExitCode
from compare.options import CompareOptions, Group


def add_flags(parser) -> None:
    parser.add_argument(
        "--processes",
        type=bounded_int(1, 64, "processes"),
        default=1,
        metavar="N",
        help="run every backend as N cooperating processes on this machine (per host), the mesh's "
        "devices split evenly over them: what a pod slice runs, tried on one machine (jax and "
        "torchax by jax.distributed, eager torch data parallel by torch.distributed; runs as "
        f"several: {', '.join(n for n in backends.names() if backends.info(n).processes)})",
    )
    parser.add_argument(
        "--num-hosts",
        type=bounded_int(1, 4096, "hosts"),
        default=1,
        metavar="H",
        help="a multi-host run: the same command on every host, with --host-id and --coordinator",
    )
    parser.add_argument(
        "--host-id",
        type=int,
        default=0,
        metavar="I",
        help="this host's number, 0 .. H-1 (host 0 writes the report)",
    )
    parser.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="host 0's address, where every backend's processes meet (ports from PORT up)",
    )


def check(opts: CompareOptions, spec) -> None:
    """The processes and hosts asked for: backends that run as several processes, a mesh they
    divide."""
    hosts = opts.hosts
    if not 0 <= hosts.host < hosts.hosts:
        raise SpecError(
            f"--host-id {hosts.host}: a run of --num-hosts {hosts.hosts} has hosts 0 to "
            f"{hosts.hosts - 1}"
        )
    if hosts.hosts > 1 and not hosts.coordinator:
        raise SpecError(
            f"--num-hosts {hosts.hosts}: give every host --coordinator HOST:PORT, host 0's address"
        )
    if hosts.coordinator:
        check_coordinator(hosts.coordinator)
    total = hosts.total
    if total == 1:
        return
    what = f"--processes {hosts.processes}" + (
        f" on {hosts.hosts} hosts" if hosts.hosts > 1 else ""
    )
    single = [n for n in opts.names if not backends.info(n).processes and n not in opts.reused]
    if single:
        several = [n for n in backends.names() if backends.info(n).processes]
        raise SpecError(
            f"{what}: the {single[0]} backend runs as one process (runs as several: "
            f"{', '.join(several)}); drop --processes or leave {single[0]} out of --backend"
        )
    if spec.mesh.device_count % total:
        raise SpecError(
            f"{what}: the mesh's {spec.mesh.device_count} device(s) cannot be split evenly over "
            f"{total} processes; {mesh_hint(spec, total, opts)}"
        )
    if "torch" in opts.names and "torch" not in opts.reused:
        refuse_per_rank_processes(spec, total)


def mesh_hint(spec, total: int, opts: CompareOptions) -> str:
    """A way out the next check does not refuse: a per-rank twin's torch side wants one process per
    device; otherwise a mesh of `total` data-parallel devices, with a batch they split."""
    devices = spec.mesh.device_count
    if "torch" in opts.names and twin_of(spec.model).nnx_mesh_arg is not None:
        return f"give --processes {devices} (one per device of the mesh), or a --mesh of {total}"
    batch = spec.train.global_batch_size
    split = "" if batch % total == 0 else f" and a train.global_batch_size {total} divides"
    return f"give a --mesh whose device count they divide, e.g. --mesh data={total}{split}"


# a run's launches each take the next port from the coordinator's (compare/runs/orchestrate.py
# coordinator_of): room for this many above it
LAUNCH_PORTS = 256


def check_coordinator(address: str) -> None:
    """HOST:PORT with a host and a port the launches can count up from: refused now, not after the
    processes waited to meet (an empty host or a port past 65535 failed only in the backends, after
    a minute)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SpecError(f"--coordinator {address}: give it as HOST:PORT, e.g. 10.0.0.2:12355")
    if not 1024 <= int(port) <= 65535 - LAUNCH_PORTS:
        raise SpecError(
            f"--coordinator {address}: port {port} is not one to count up from (a run takes the "
            "ports "
            f"from PORT up, one per launch); give a port from 1024 to {65535 - LAUNCH_PORTS}"
        )


def section(hosts: Group) -> dict | None:
    """report.json's `hosts` of a multi-host run (None on one host): its layout, and what it did not
    run."""
    if hosts.hosts == 1:
        return None
    return {
        "hosts": hosts.hosts,
        "processes_per_host": hosts.processes,
        "coordinator": hosts.coordinator,
        "not_made": "step 0's activation capture and --tensors auto's second pass need every "
        "host: a pair that "
        "parts at step 0 is not located here; rerun it on one host (--processes) to locate it",
    }


def follows(hosts: Group) -> bool:
    """Whether this compare is a host other than 0 of a multi-host run: it runs its processes, no
    report."""
    return hosts.host != 0


def followed(hosts: Group, runs: dict) -> int:
    """A host other than 0, its processes done: one line, and the exit code of its backends'
    status."""
    failed = [n for n, run in runs.items() if run.status != BackendStatus.OK]
    print(
        f"host {hosts.host} of {hosts.hosts}: ran {', '.join(runs) or 'nothing'}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + "; host 0 writes the report",
        flush=True,
    )
    for name in failed:  # the failures where a failure is looked for, as on host 0
        run = runs[name]
        print(f"error: {name}: {run.status}: {run.message} (logs: {run.run_dir})", file=sys.stderr)
    return ExitCode.BACKEND if failed else ExitCode.OK
