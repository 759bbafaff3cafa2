"""Greedy generation, run the same way on every runtime (numpy only): the prompts, the loop over a
side's decode path, and what its run keeps.

A side's decode path is one function, `decode(tokens, positions, mask, cache) -> (logits, cache)`
(each runtime adapts its model's: jax_impl/generate.py, torch_impl/generate.py): `tokens` (B, T)
at rotary `positions` (B, T), `mask` (B, S) the real tokens of the whole sequence (the prompts are
left-padded; every generated token is real), `cache` None for the prefill, else what the last call
returned. The loop prefills the prompts, then feeds one token a step. Fed `forced` tokens (the
reference's), a side still records the token it would have chosen, so that every step is compared
from the same history (teacher forcing) and a flip is seen where it happens.

Each side checks itself too: the decode path's logits at every step against one prefill of the
whole sequence it fed (a cache bug: a position, a mask, a slot), and that prefill against the
model's training forward on the rows with no padding (the decode path is the model that trained).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from common.twin import TwinError

GROUP = "generation"  # the tensor file's group of a generation run
PAD_ID = 0
MIN_PROMPT = 4  # tokens the longest prompt has at least
MAX_ROWS = 4  # prompts generated from, at most
PROMPT_SHORTENED = (0, 1, 2, 3)  # row i's prompt is this many quarters of the longest shorter


def prompts(inputs: np.ndarray, n_new: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens (B, P), mask (B, P + n_new)) from a batch's token ids: up to MAX_ROWS rows of
    different lengths, left-padded with PAD_ID; the longest leaves room for `n_new` tokens within
    `seq_len`. Real tokens that equal PAD_ID stay real (the mask says which are padding)."""
    ids = np.asarray(inputs)
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise ValueError(
            f"--generate needs token ids (batch, tokens) as the model's input, not {ids.dtype} "
            f"{list(ids.shape)}"
        )
    longest = min(ids.shape[1], seq_len - n_new)
    if longest < MIN_PROMPT:
        raise ValueError(
            f"--generate {n_new}: the model's {seq_len} positions leave {longest} for the prompt; "
            f"ask for fewer tokens (at least {MIN_PROMPT} prompt tokens are needed)"
        )
    rows = min(MAX_ROWS, ids.shape[0])
    tokens = np.full((rows, longest), PAD_ID, dtype=np.int32)
    mask = np.ones((rows, longest + n_new), dtype=bool)
    for row in range(rows):
        length = longest - PROMPT_SHORTENED[row % len(PROMPT_SHORTENED)] * (longest // 4)
        tokens[row, longest - length :] = ids[row, :length]
        mask[row, : longest - length] = False
    return tokens, mask


def positions_of(mask: np.ndarray) -> np.ndarray:
    """Each slot's rotary position: its place among its row's real tokens (0 on the padding), as
    Hugging Face's generate derives position_ids from the attention mask."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)


def unpadded(tokens, positions, mask, cache):
    """A prefill's arguments of the prompts with no padding only: a module's outputs at padding
    positions are whatever each implementation leaves there, never compared."""
    rows = np.asarray(mask)[:, : np.shape(tokens)[1]].all(axis=1)
    return tokens[rows], positions[rows], mask[rows], cache


def generate(
    decode,
    to_numpy,
    tokens,
    mask,
    n_new: int,
    forced=None,
    forward=None,
    compiles=None,
    capture=None,
) -> dict:
    """Prefill and `n_new` decode steps of one side: {prefill (B, P, V), steps (n_new + 1, B, V):
    the logits each next token is chosen from (the prefill's last, then each decode step's),
    chosen (n_new, B): the side's own greedy choices, fed (n_new, B): what it was fed (`forced`, or
    its own choices), whole (B, P + n_new, V): one prefill of everything fed, forward: the training
    forward's logits of the same sequence (`forward(tokens)`, when given), seconds (n_new + 1,):
    each call's wall time to its logits on the host, and where the runtime counts its compiles
    (`compiles()`: how many so far) compiles (n_new + 3,): those of the prefill, each decode step,
    the whole sequence's prefill and the forward}. `capture` (step, capture(tokens, positions,
    mask, cache)): the call that makes that step's logits (0: the prefill, of its prompts with no
    padding) captured first, module by module, from the same arguments; its Capture under
    "capture"."""
    p = tokens.shape[1]
    positions = positions_of(mask)
    seconds, compiled = [], []  # of each call to its logits on the host
    captured = {}

    def timed(*args, call=decode):
        if capture and call is decode and len(seconds) == capture[0]:
            captured["capture"] = capture[1](*(unpadded(*args) if capture[0] == 0 else args))
        started, before = time.perf_counter(), compiles() if compiles else 0
        out = call(*args)
        if call is decode and not (isinstance(out, tuple) and len(out) == 2):
            raise TwinError(
                f"the decode path returned a {type(out).__name__}, not (logits, cache): "
                "decode(model, tokens, positions, mask, cache) -> (logits, cache)"
            )
        logits, cache = out if call is decode else (out, None)
        logits = to_numpy(logits)
        if logits.ndim != 3 or logits.shape[:2] != np.shape(args[0]):
            raise TwinError(
                f"the decode path returned logits of shape {list(logits.shape)} for tokens of "
                f"shape {list(np.shape(args[0]))}: one row of logits per token fed, (batch, "
                "tokens, vocabulary)"
            )
        seconds.append(time.perf_counter() - started)
        compiled.append((compiles() if compiles else 0) - before)
        return logits, cache

    prefill, cache = timed(tokens, positions[:, :p], mask, None)
    steps, chosen, fed = [prefill[:, -1]], [], []
    for s in range(n_new):
        own = np.argmax(steps[-1], axis=-1).astype(np.int32)
        token = own if forced is None else np.asarray(forced[s], np.int32)
        chosen.append(own)
        fed.append(token)
        logits, cache = timed(token[:, None], positions[:, p + s : p + s + 1], mask, cache)
        steps.append(logits[:, 0])
    sequence = np.concatenate([tokens, np.stack(fed, axis=1)], axis=1)
    out = {
        "prefill": prefill,
        "steps": np.stack(steps),
        "chosen": np.stack(chosen),
        "fed": np.stack(fed),
        "whole": timed(sequence, positions, mask, None)[0],
        "sequence": sequence,
        "mask": mask,
        "seconds": np.asarray(seconds[: n_new + 1]),
    }
    if forward is not None:
        out["forward"] = timed(sequence, call=forward)[0]
    if compiles:
        out["compiles"] = np.asarray(compiled, np.int64)
    return {**out, **captured}


def fed_tokens(run_dir, run_id: str | None = None) -> np.ndarray:
    """The tokens a generation run in `run_dir` was fed (n_new, B): what another side is fed to be
    compared with it step by step. ValueError naming what is wrong when there is none (or not this
    compare run's)."""
    from common.files.record import RECORD_FILE, read_record
    from common.files.tensor_file import read_tensors

    record = read_record(Path(run_dir) / RECORD_FILE)
    if run_id is not None and record.run_id != run_id:
        raise ValueError(f"{run_dir} is another compare run's ({record.run_id})")
    fed = read_tensors(Path(run_dir) / RECORD_FILE, record)[GROUP].get("fed")
    if fed is None:
        raise ValueError(f"{run_dir} holds no generation run (no {GROUP}/fed)")
    return np.asarray(fed)
