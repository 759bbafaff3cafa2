"""`--profile N` on PyTorch/XLA: N more steps under torch_xla's profiler, after N timed without
it."""

from __future__ import annotations

import time
from pathlib import Path

import torch_xla

from common.vocab import PROFILE_DIR, ProfileRange


def profiled_steps(trainer, first: int, n: int, out_dir: Path) -> dict | None:
    """`--profile N`: N more steps under torch_xla's profiler, annotated as
    common.vocab.ProfileRange says; the XProf trace goes to <run>/profile, after N steps timed
    without it (as in jax_impl.loop). The annotations are the profiler's bare TraceMe: xp.Trace also
    opens an IR scope, and a sync inside one fails ("Expecting scope to be empty")."""
    if n <= 0:
        return None
    import torch_xla.debug.profiler as xp

    trace_me = torch_xla._XLAC.profiler.TraceMe
    unprofiled, step_ms = [], []
    batches = iter(trainer.loader(first, 2 * n))
    for step in range(first, first + n):  # the same steps just before, without the profiler
        batch = next(batches)
        start = time.perf_counter()
        loss = trainer.step(step, batch)
        trainer.sync(step)
        trainer.wait()
        unprofiled.append((time.perf_counter() - start) * 1e3)
    first += n
    xp.start_trace(str(out_dir / PROFILE_DIR))
    try:
        for step in range(first, first + n):
            with trace_me(ProfileRange.INPUT):
                batch = next(batches)
            with trace_me(ProfileRange.STEP, step_num=step, _r=1):
                start = time.perf_counter()
                with trace_me(ProfileRange.CALL):
                    loss = trainer.step(step, batch)
                with trace_me(ProfileRange.WAIT):
                    trainer.sync(step)
                    trainer.wait()
                step_ms.append((time.perf_counter() - start) * 1e3)
            loss.item()
    finally:
        xp.stop_trace()
    return {
        "steps": n,
        "dir": PROFILE_DIR,
        "tool": f"torch_xla.debug.profiler (torch_xla {torch_xla.__version__})",
        "step_ms": step_ms,
        "unprofiled_step_ms": unprofiled,
    }
