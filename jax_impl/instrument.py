"""Compile events, recompile causes and HLO statistics, gathered in-process.

Compiles are seen through `jax.monitoring` duration events
(`/jax/core/compile/backend_compile_duration`, which carries `fun_name`),
each tagged with the phase and step that were running. Recompile causes are
the messages `jax_explain_cache_misses` logs. Both cost nothing per step:
they fire only when something compiles.

Persistent compile cache (`enable_compile_cache`): JAX emits the same
backend-compile event when it loads an executable from the cache, just
after a `/jax/compilation_cache/cache_hits` event, so a hit is still counted
as a compile (at its step and phase: a steady-state recompile stays one)
and marked `cache_hit`.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import jax

from analysis.hlo import op_histogram, reported_ops
from analysis.recompile import classify_jax
from analysis.recompile import entry as recompile_entry
from common.files.fsutil import unusable_cache_dir
from common.files.record import CompileEvent
from common.vocab import Phase

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_REQUEST_EVENT = "/jax/compilation_cache/compile_requests_use_cache"


def enable_compile_cache(path: Path | None) -> dict:
    """Turn on JAX's persistent compilation cache in `path` for every compile, however short or
    small (JAX's defaults skip compiles under 1 s). Returns the record's `compile_cache` entry."""
    if path is None:
        return {"enabled": False}
    unusable = unusable_cache_dir(path)
    if unusable:
        return unusable
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return {"enabled": True, "dir": str(path)}


class CompileMonitor(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.phase, self.step, self.paused = Phase.SETUP, -1, False
        self.events: list[CompileEvent] = []
        self.causes: list[dict] = []
        self.cache_requests = 0
        self._hit_pending = False
        self.installed = False
        jax.monitoring.register_event_listener(self._on_event)  # cache hits: never unregistered
        self.install()

    @contextlib.contextmanager
    def analysis(self):
        """Compiles inside are analysis (a summary, an eval forward, the HLO statistics), not the
        run's."""
        paused, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = paused

    def install(self) -> None:
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.config.update("jax_explain_cache_misses", True)
        self._logger.addHandler(self)
        # keep the explanations out of the user's terminal; they go to the record
        self._logger.propagate = False
        self.installed = True

    def close(self) -> None:
        """Remove every hook (the benchmark times the same step with and without them)."""
        if not self.installed:
            return
        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.config.update("jax_explain_cache_misses", False)
        self._logger.removeHandler(self)
        self._logger.propagate = True
        self.installed = False

    @property
    def _logger(self) -> logging.Logger:
        return logging.getLogger("jax._src.interpreters.partial_eval")

    def at(self, phase: Phase, step: int) -> None:
        self.phase, self.step = phase, step

    def _on_event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            self._hit_pending = True
        elif event == CACHE_REQUEST_EVENT and not self.paused:
            self.cache_requests += 1

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event != BACKEND_COMPILE_EVENT:
            return
        hit, self._hit_pending = self._hit_pending, False
        if not self.paused:
            self.events.append(
                CompileEvent(
                    str(kwargs.get("fun_name", "?")),
                    float(duration),
                    self.step,
                    self.phase,
                    cache_hit=hit,
                )
            )

    def cache_summary(self, cache: dict) -> dict:
        """The record's `compile_cache` entry: hits and misses among the counted compiles."""
        if not cache.get("enabled"):
            return cache
        hits = sum(e.cache_hit for e in self.events)
        return {**cache, "hits": hits, "misses": self.cache_requests - hits}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        # Only re-traces of a function seen before explain a recompile.
        if self.paused or self.phase != Phase.LOOP or "never seen function" in message:
            return
        if "CACHE MISS" in message:
            fun = next(
                (
                    ln.split("for ", 1)[1].split(" defined")[0]
                    for ln in message.splitlines()
                    if ln.strip().startswith("for ")
                ),
                "?",
            )
            words = "; ".join(ln.strip() for ln in message.splitlines()[1:] if ln.strip())
            self.causes.append(recompile_entry(self.step, fun, *classify_jax(message), words))


def hlo_statistics(jitted, args, hlo_path, **static) -> dict:
    """The optimized HLO, cost and memory analysis of the executable `jitted` runs for `args` and
    `static`."""
    # the static arguments exactly as the run passed them: JAX then hands back the executable the
    # run compiled (1.1 s of gpt-tiny's 5 s process when `python_value=None` was left out and it
    # compiled again)
    compiled = jitted.lower(*args, **static).compile()
    text = compiled.as_text()
    hlo_path.write_text(text)
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    memory = compiled.memory_analysis()
    mem = {}
    for key in (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "temp_size_in_bytes",
        "alias_size_in_bytes",
        "generated_code_size_in_bytes",
    ):
        value = getattr(memory, key, None)
        if value is not None:
            mem[key] = int(value)
    histogram = op_histogram(text)
    return {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "op_histogram": histogram,
        "reported_ops": reported_ops(histogram),
        "memory": mem,
        "memory_source": "compiled.memory_analysis()",
        "hlo_file": hlo_path.name,
    }
