"""What a runtime does by design where eager torch does otherwise: one table, each behaviour with
how it is found before anything trains and what the toolkit does of it (numpy-free).

`named` behaviours are left as the runtime does them: the runtime's op check (common/ops.py) finds
where the model meets one (ops.json's `behaviours`); where that runtime's parity then fails,
compare runs it once more with the behaviour matched to eager torch's (`--match-behaviours`, into
<run>/MATCHED_DIR/<backend>/) and judges that run too, so the report says whether the behaviour
explains the difference (the matched run passes: the port is not at fault) or not. `matched`
behaviours are made eager torch's in every run, and the report lists them: a user's own loop on
that runtime needs the same."""

from __future__ import annotations

from dataclasses import dataclass

MATCHED_DIR = "matched"  # a compare run's behaviour-matched runs: <run>/matched/<backend>/

NAMED, MATCHED = "named", "matched"


@dataclass(frozen=True)
class Behaviour:
    id: str
    runtime: str
    does: str  # what the runtime does
    torch_does: str  # what eager torch does instead
    found_by: str  # how the model is found to meet it
    handled: str  # NAMED or MATCHED


TABLE = (
    Behaviour(
        "embedding-padding-idx",
        "torchax",
        "differentiates an embedding through JAX and ignores its padding_idx: the padding row "
        "takes a gradient",
        "eager torch gives that row none",
        "an aten::embedding call with a padding_idx in the op check's traced step",
        NAMED,
    ),
    Behaviour(
        "batch-norm-running-statistics",
        "torchax",
        "never writes BatchNorm's running mean and variance back (0.0.13): they keep their "
        "initial values",
        "eager torch updates them in place with the unbiased batch variance",
        "every run (torchax_impl/batch_norm.py)",
        MATCHED,
    ),
)

BY_ID = {b.id: b for b in TABLE}


def of_runtime(runtime: str, handled: str | None = None) -> list[Behaviour]:
    return [b for b in TABLE if b.runtime == runtime and handled in (None, b.handled)]


def met(ops: dict) -> dict[str, dict]:
    """{behaviour id: what the op check saw of it} of a runtime's ops.json: the named behaviours the
    model meets."""
    seen = ops.get("behaviours") or {}
    return {k: v for k, v in seen.items() if k in BY_ID and BY_ID[k].handled == NAMED}


def words(behaviour_id: str) -> str:
    b = BY_ID[behaviour_id]
    return f"{b.runtime} {b.does} ({b.torch_does}; {behaviour_id})"
