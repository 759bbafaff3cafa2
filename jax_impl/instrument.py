"""Compile events, recompile causes and HLO statistics, gathered in-process.

Compiles are seen through `jax.monitoring` duration events
(`/jax/core/compile/backend_compile_duration`, which carries `fun_name`),
each tagged with the phase and step that were running. Recompile causes are
the messages `jax_explain_cache_misses` logs. Both cost nothing per step:
they fire only when something compiles.
"""
from __future__ import annotations

import logging

import jax

from common.hlo import op_histogram, reported_ops
from common.record import CompileEvent

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileMonitor(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.phase, self.step, self.paused = "setup", -1, False
        self.events: list[CompileEvent] = []
        self.causes: list[dict] = []
        self.installed = False
        self.install()

    def install(self) -> None:
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.config.update("jax_explain_cache_misses", True)
        self._logger.addHandler(self)
        self._logger.propagate = False  # keep the explanations out of the user's terminal; they go to the record
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

    def at(self, phase: str, step: int) -> None:
        self.phase, self.step = phase, step

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT and not self.paused:
            self.events.append(CompileEvent(str(kwargs.get("fun_name", "?")), float(duration), self.step, self.phase))

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        # Only re-traces of a function seen before explain a recompile.
        if self.paused or self.phase != "loop" or "never seen function" in message:
            return
        if "CACHE MISS" in message:
            fun = next((ln.split("for ", 1)[1].split(" defined")[0] for ln in message.splitlines()
                        if ln.strip().startswith("for ")), "?")
            cause = "; ".join(ln.strip() for ln in message.splitlines()[1:] if ln.strip())
            self.causes.append({"step": self.step, "fun_name": fun, "cause": cause})


def hlo_statistics(jitted, args, hlo_path) -> dict:
    """Lower and compile `jitted` for `args` (ahead of time) and read the optimized HLO."""
    compiled = jitted.lower(*args).compile()
    text = compiled.as_text()
    hlo_path.write_text(text)
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    memory = compiled.memory_analysis()
    mem = {}
    for key in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes",
                "generated_code_size_in_bytes"):
        value = getattr(memory, key, None)
        if value is not None:
            mem[key] = int(value)
    histogram = op_histogram(text)
    return {"flops": float(cost.get("flops", 0.0)), "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "op_histogram": histogram, "reported_ops": reported_ops(histogram), "memory": mem,
            "hlo_file": hlo_path.name}
