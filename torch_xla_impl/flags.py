"""torch_xla's own flags (`python -m torch_xla_impl --mode ... --trace-mode ...`), read into
XlaFlags (driver.harness.RunOptions.own)."""

from __future__ import annotations

from dataclasses import dataclass

from common.backends import DECODE_CACHE
from common.vocab import TRACE_MODE_MEANINGS, TraceMode, values


@dataclass(frozen=True)
class XlaFlags:
    """torch_xla's own flags (driver.harness.RunOptions.own)."""

    mode: str = "spmd"
    trace_mode: str = TraceMode.LAZY.value  # a TraceMode
    decode_cache: str = DECODE_CACHE.default  # --generate: HF's StaticCache or DynamicCache


def add_flags(parser) -> type[XlaFlags]:
    parser.add_argument(
        "--mode",
        choices=("spmd", "spawn"),
        default="spmd",
        help="multi-device: one process over all devices (SPMD) or one replica per device "
        "(xmp.spawn, data parallel)",
    )
    parser.add_argument(
        "--trace-mode",
        choices=values(TraceMode),
        default=TraceMode.LAZY.value,
        help="how the step becomes a graph: "
        + "; ".join(f"{m.value}: {meaning}" for m, meaning in TRACE_MODE_MEANINGS.items()),
    )
    parser.add_argument(
        DECODE_CACHE.backend_flag,
        choices=DECODE_CACHE.choices,
        default=DECODE_CACHE.default,
        help=DECODE_CACHE.help,
    )
    return XlaFlags
