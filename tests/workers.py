"""How many test processes `make test` runs (python3 -m tests.workers prints it; plain python, no
package needed): one per core and one more, as many as the memory holds at GIB_PER_PROCESS each
(the suite's peak on the developers' machines: 6.7 GiB in use for 3 processes, each starting
backends of their own)."""

from __future__ import annotations

import os

GIB_PER_PROCESS = 3


def available_gib() -> float | None:
    """The memory the kernel says is available (Linux: MemAvailable), or None where not said."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def count() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    wanted = (cores or 2) + 1
    memory = available_gib()
    return wanted if memory is None else max(1, min(wanted, int(memory // GIB_PER_PROCESS)))


if __name__ == "__main__":
    print(count())
