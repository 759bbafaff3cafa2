"""--generate (common/generation.py, compare/judge/generation.py): Hugging Face's Llama with its own
cache against an NNX port with its own, on every runtime; a decode-only mis-port named at its step
and its side while its training step passes; the pieces in this process."""

import json
import re

import numpy as np
import pytest

from common.generation import positions_of, prompts
from compare.judge.generation import Bounds, pair_check, self_check
from tests.helpers import run_cli

LLAMA = "examples/llama/twin.py"
BOUND = Bounds({"atol": 1e-5, "rtol": 1e-4})


def compare(out, *args):
    return run_cli("compare", "--out", str(out), "--quiet", *args, timeout=900)


def test_prompts_are_left_padded_rows_of_different_lengths_with_their_own_positions():
    ids = np.arange(1, 8 * 20 + 1, dtype=np.int64).reshape(8, 20)
    tokens, mask = prompts(ids, 6, 24)
    # the longest leaves room for 6 tokens in 24 positions; then 3/4, 1/2, 1/4 of it
    assert tokens.shape == (4, 18) and mask.shape == (4, 24)
    assert mask[:, :18].sum(1).tolist() == [18, 14, 10, 6] and mask[:, 18:].all()
    # each row's real tokens are its own first ones, right-aligned after the padding
    assert tokens[1, 4:].tolist() == ids[1, :14].tolist() and (tokens[1, :4] == 0).all()
    positions = positions_of(mask)
    assert positions[1, 4] == 0 and positions[1, 17] == 13 and positions[1, 18] == 14
    assert (positions[1, :4] == 0).all()
    with pytest.raises(ValueError, match="leave 2 for the prompt"):
        prompts(ids, 22, 24)
    with pytest.raises(ValueError, match="needs token ids"):
        prompts(np.zeros((2, 3, 4), np.float32), 2, 24)


def _run(rng, rows=2, p=5, n=3, vocab=11):
    steps = rng.standard_normal((n + 1, rows, vocab)).astype(np.float32)
    mask = np.ones((rows, p + n), bool)
    mask[1, :2] = False
    whole = rng.standard_normal((rows, p + n, vocab)).astype(np.float32)
    whole[:, p - 1 :] = steps.transpose(1, 0, 2)
    fed = np.argmax(steps[:n], -1).astype(np.int32)
    return {
        "prefill": whole[:, :p].copy(),
        "steps": steps,
        "whole": whole,
        "forward": whole.copy(),
        "mask": mask,
        "fed": fed,
        "chosen": fed.copy(),
    }


def test_a_side_is_judged_against_itself_and_a_flip_at_a_near_tie_is_said_as_one():
    rng = np.random.default_rng(0)
    ref = _run(rng)
    own = self_check(ref, BOUND)
    assert own["passed"] and own["first_divergent_step"] is None
    assert own["forward"]["prompts"] == 1 and own["forward"]["within"]
    # a cache bug from step 2 on: the decode path parts from its own prefill of everything
    broken = {**ref, "steps": ref["steps"].copy()}
    broken["steps"][2:] += 1e-2
    assert self_check(broken, BOUND)["first_divergent_step"] == 2
    # the other side chose otherwise at step 1, prompt 0, where the reference's two best logits are
    # 1e-6 apart: a flip within rounding, and every step still compared
    other = {k: v.copy() for k, v in ref.items()}
    top = int(ref["fed"][1][0])
    second = int(np.argsort(ref["steps"][1][0])[-2])
    for run in (ref, other):
        run["steps"][1][0][second] = run["steps"][1][0][top] - 1e-6
    other["chosen"][1][0] = second
    pair = pair_check(ref, other, BOUND)
    flip = pair["first_flip"]
    assert pair["passed"] and len(pair["steps"]) == 4
    assert flip["step"] == 1 and flip["prompt"] == 0 and flip["token"] == second
    assert flip["within_rounding"] and flip["margin_reference"] == pytest.approx(1e-6, rel=0.1)
    # equal logits: no KL; step 1 differs in one row by 1e-6 of a logit, its KL a float64 speck
    assert pair["steps"][0]["kl"] == 0.0 and pair["steps"][0]["rel"] == 0.0
    # what every step's bound would have caught, relative to the reference's logits
    scale = max(float(np.max(np.abs(s))) for s in ref["steps"])
    assert pair["sensitivity"] >= BOUND.of(ref["steps"][0], (None, None)) / scale
    # the same choice where the margin is wide is no tie
    ref["steps"][1][0][second] = ref["steps"][1][0][top] - 1.0
    wide = pair_check(ref, other, BOUND)
    assert not wide["first_flip"]["within_rounding"]
    # the other side's logits a whole unit apart there: its next-token distribution moved
    assert wide["steps"][1]["kl"] > 1e-3 and wide["steps"][1]["rel"] > 0.1


def self_checks(port: str, model, ids: np.ndarray, seq_len: int, names: tuple) -> dict:
    """{decode function of `port`: its self_check} on NNX side alone, eagerly, 6 new tokens."""
    import jax.numpy as jnp

    from common.generation import generate
    from common.twin import resolve
    from jax_impl.generate import host_logits

    tokens, mask = prompts(ids, 6, seq_len)
    found = {}
    for name in names:
        decode = resolve(f"{port}:{name}")
        run = generate(
            lambda t, p, m, c, decode=decode: decode(model, jnp.asarray(t), p, m, c),
            host_logits,
            tokens,
            mask,
            6,
            forward=lambda t: model(jnp.asarray(t)),
        )
        found[name] = self_check(run, BOUND)
    return found


def test_the_nnx_side_alone_finds_its_decode_only_misports():
    """Each of the Llama port's decode-only mis-ports, on its side alone (no other framework): a new
    token's rotary position one off and the left padding seen by the new tokens part from the
    side's own prefill of the whole sequence at step 1 (step 0's logits are the prefill's); a KV
    cache kept in bfloat16 agrees with a prefill through that same cache, and parts from the
    training forward."""
    from flax import nnx

    from common.twin import resolve

    port = LLAMA.replace("twin.py", "nnx_llama.py")
    hparams = {"vocab_size": 64, "seq_len": 32, "d_model": 32, "n_layers": 2, "n_heads": 4}
    model = resolve(f"{port}:Llama")(**hparams, n_kv_heads=2, d_ff=64, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(1, 64, (4, 32))
    names = ("decode", "decode_position_off", "decode_padding_seen", "decode_cache_bfloat16")
    found = self_checks(port, model, ids, 32, names)
    assert found["decode"]["passed"] and found["decode"]["forward"]["max_abs"] < 1e-5
    assert found["decode_position_off"]["first_divergent_step"] == 1
    assert found["decode_padding_seen"]["first_divergent_step"] == 1
    bf16 = found["decode_cache_bfloat16"]
    assert bf16["first_divergent_step"] is None and bf16["forward"]["within"] is False


def test_gemma2s_sliding_window_over_the_cache_is_checked_on_its_side_alone():
    """Gemma 2's port decodes past its sliding window (8) from prompts longer than it: its decode
    path agrees with its own forward; with the window left out for the new tokens it parts at step
    1 (the prompt's prefill applies it)."""
    from flax import nnx

    from common.twin import resolve
    from examples.gemma2.twin import HPARAMS

    port = "examples/gemma2/nnx_gemma2.py"
    model = resolve(f"{port}:Gemma2")(**HPARAMS, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(1, HPARAMS["vocab_size"], (4, 32))
    assert prompts(ids, 6, HPARAMS["seq_len"])[0].shape[1] > HPARAMS["sliding_window"]
    found = self_checks(
        port, model, ids, HPARAMS["seq_len"], ("decode", "decode_window_not_over_cache")
    )
    assert found["decode"]["passed"] and found["decode"]["forward"]["max_abs"] < 1e-5
    assert found["decode_window_not_over_cache"]["first_divergent_step"] == 1


@pytest.mark.slow
def test_hugging_faces_llama_decodes_as_its_nnx_port_on_every_runtime(tmp_path):
    """HF's LlamaForCausalLM with its own cache (DynamicCache; torch_xla and torchax a StaticCache,
    of fixed shapes) against the port's own KV cache, in float64 (the proof; float32 agrees to 2e-7
    at every step, measured in docs/findings.md): left-padded prompts of four lengths, 16 greedy
    tokens, every step's logits within float64's forward bound against jax and against the side's
    own forward; torch_xla's decode step and jax's jitted one compile once."""
    proc = compare(
        tmp_path,
        "--twin",
        f"{LLAMA}:llama_hf",
        "--backend",
        "all",
        "--generate",
        "16",
        "--steps",
        "2",
        "--dtype",
        "float64",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    # its training first: HF's float32 casts widened (the default), the correct port agrees to
    # float64's rounding on every runtime (tests/test_float64.py's rotary mis-port fails beside it)
    for name in ("torch", "torch_xla", "torchax"):
        parity = report["parity"][name]
        assert parity["float32_islands"] == {} and parity["loss"]["max_abs"] < 1e-12, name
        # float64's bounds applied (torch_xla's own float64 allowance, 3e-8, included)
        assert parity["sensitivity"]["logits"]["every"] < 1e-7, name
    section = report["generation"]
    assert report["verdict"] == "pass" and section["passed"] and section["not_run"] == {}
    assert section["new_tokens"] == 16 and len(set(section["prompt_lengths"])) == 4
    assert set(section["pairs"]) == {"torch", "torch_xla", "torchax"}
    for name, pair in section["pairs"].items():
        assert pair["first_flip"] is None and pair["prefill"]["max_abs"] < 1e-12, name
        assert len(pair["steps"]) == 17 and all(s["top1"] == 1.0 for s in pair["steps"]), name
        # measured 1.7e-16..4.4e-16 (float64's casts widened on both sides): float64's bound is
        # 5e-10..6e-10 here, and float32's rounding (1e-7) would be far outside it
        assert max(s["max_abs"] for s in pair["steps"]) < 1e-12, name
    for name, own in section["self"].items():
        assert own["passed"] and own["forward"]["prompts"] == 1, name
        assert own["forward"]["max_abs"] < 1e-12, name
    # a static cache on torch_xla and the jitted decode step on jax: one program each, compiled
    # by the first decode step and never again
    for name in ("jax", "torch_xla"):
        compiles = section["runtime"][name]["compiles"]
        assert compiles["first_decode_step"] >= 1 and compiles["later_decode_steps"] == 0, name
    assert section["runtime"]["jax"]["how"].startswith("jitted")
    assert section["runtime"]["torchax"]["how"].endswith("a StaticCache (fixed shapes)")
    assert all(f["prefill_ms"] > 0 for f in section["runtime"].values())
    md = (tmp_path / "report.md").read_text()
    assert "## Generation: 16 greedy tokens after prompts of" in md and "## Generation cost" in md


@pytest.mark.slow
def test_hugging_faces_qwen2_decodes_16_tokens_as_its_nnx_port_in_float32(tmp_path):
    """HF's Qwen2ForCausalLM as it ships (its DynamicCache; grouped-query attention, q/k/v biases,
    tied embeddings) against the port's own KV cache, 16 greedy tokens after four left-padded
    prompts, float32, on jax, eager torch and torchax (Llama's float64 proof on every runtime is
    the test above)."""
    proc = compare(
        tmp_path,
        "--twin",
        "examples/hf_qwen2/twin.py:qwen2_tiny",
        "--backend",
        "jax,torch,torchax",
        "--generate",
        "16",
        "--steps",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    section = json.loads((tmp_path / "report.json").read_text())["generation"]
    assert section["passed"] and section["new_tokens"] == 16
    lengths = section["prompt_lengths"]
    assert len(set(lengths)) == 4 and min(lengths) < max(lengths)  # the shorter ones left-padded
    for name, pair in section["pairs"].items():
        assert pair["first_flip"] is None and len(pair["steps"]) == 17, name
        assert all(s["top1"] == 1.0 for s in pair["steps"]), name
        # measured 1.8e-7..2.4e-7: float32's rounding, within its forward bound at every step
        assert max(s["max_abs"] for s in pair["steps"]) < 1e-5, name
    assert set(section["pairs"]) == {"torch", "torchax"}
    assert all(own["passed"] for own in section["self"].values())
    assert section["runtime"]["jax"]["compiles"]["later_decode_steps"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin,step",
    [
        # (a) the new tokens' rotary position one past their place
        (f"{LLAMA}:llama_hf_decode_position_off", 1),
        # (b) Gemma 2's sliding window (layer 0's) left out for the new tokens over its cache
        ("examples/gemma2/twin.py:gemma2_decode_window_not_over_cache", 1),
        # (c) the left padding of the shorter prompts seen by the new tokens
        (f"{LLAMA}:llama_hf_decode_padding_seen", 1),
        # (d) a KV cache kept in bfloat16 in a float32 run: the prefill reads it already
        (f"{LLAMA}:llama_hf_decode_cache_bfloat16", 0),
    ],
)
def test_a_decode_only_misport_is_named_at_its_step_and_side_while_training_passes(
    tmp_path, twin, step
):
    """A decode-only mis-port: the training step agrees; the decode path parts from jax's own
    forward at its step (step 0 is the prefill's), torch's agreement with its own forward puts the
    difference on jax's side, and both sides' decode calls at that step, captured module by module,
    name the attention of layer 0."""
    proc = compare(
        tmp_path, "--twin", twin, "--backend", "jax,torch", "--generate", "6", "--steps", "1"
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["parity"]["torch"]["passed"]
    section = report["generation"]
    assert section["self"]["torch"]["passed"]
    assert section["pairs"]["torch"]["first_divergent_step"] == (step or "prefill")
    found = section["pairs"]["torch"]["first_divergent_module"]
    assert found["module"] == "layers.0.attn" and found["input_agrees"] and found["step"] == step
    where = "at the prefill" if step == 0 else f"at step {step}"
    own = (
        "jax's prefill differs from its training forward"
        if step == 0
        else f"jax's decode path differs from its own forward from step {step}"
    )
    assert report["message"] == (
        f"generation: {own}; torch's decode differs from jax's {where}, first at module "
        "layers.0.attn, its input agreeing (on jax's side: its decode path differs from its own "
        "forward)"
    )
    if step:
        assert section["self"]["jax"]["first_divergent_step"] == step
        assert section["pairs"]["torch"]["steps"][0]["max_abs"] < 1e-5  # the prefill agrees
        md = (tmp_path / "report.md").read_text()
        assert f"| verdict | fail from step {step}, first at layers.0.attn (its input agrees)" in md
        assert "generation.png" in report["plots"] and "![generation.png](generation.png)" in md


@pytest.mark.slow
def test_torch_xla_with_a_dynamic_cache_recompiles_at_every_token_and_says_so(tmp_path):
    """HF's DynamicCache grows a token a step: on torch_xla each decode step is a new graph, every
    one after the first compiled again (counted), where the static cache compiles once; its decode
    path still agrees with its own forward."""
    proc = compare(
        tmp_path,
        "--twin",
        f"{LLAMA}:llama_hf",
        "--backend",
        "torch_xla",
        "--generate",
        "5",
        "--steps",
        "1",
        "--torch-xla-decode-cache",
        "dynamic",
    )
    assert proc.returncode == 0, proc.stderr
    section = json.loads((tmp_path / "report.json").read_text())["generation"]
    facts = section["runtime"]["torch_xla"]
    assert "DynamicCache" in facts["how"] and facts["compiles"]["later_decode_steps"] == 4
    assert section["passed"] and section["self"]["torch_xla"]["passed"]


@pytest.mark.slow
@pytest.mark.error_case("generate-refused")
@pytest.mark.error_case("bf16-without-bfloat16")
def test_generate_is_refused_before_anything_runs_where_it_cannot_work(tmp_path):
    for args, message in (
        (
            ("--spec", "gpt-tiny"),
            "--generate: the built-in gpt model names no NNX decode path; give "
            "decode={'nnx': 'file.py:decode'}",
        ),
        (
            ("--twin", f"{LLAMA}:llama_hf", "--generate", "61"),
            "--generate 61: the model's 64 positions leave no room for a prompt of 4 tokens; "
            "ask for at most 60",
        ),
        (
            ("--spec", "cnn-digits"),
            "--generate: takes a language model (task lm); the built-in cnn model is "
            "classification",
        ),
        (
            ("--twin", f"{LLAMA}:llama_hf", "--torch-record", str(tmp_path)),
            "--generate: --torch-record reuses a run that has no decode path run; run that "
            "backend here (drop the flag), or compare without --generate",
        ),
        (("--generate", "5000"), "argument --generate: '5000' is not a whole number of tokens"),
        (
            ("--generate", "0", "--bf16", "loaded"),
            "--bf16 loaded: says how a bfloat16 run holds the model; this run is float32: add "
            "--dtype bfloat16, or drop --bf16",
        ),
    ):
        out = tmp_path / str(len(message))
        proc = compare(out, "--backend", "jax,torch", "--generate", "4", *args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert not out.exists()


@pytest.mark.slow
@pytest.mark.error_case("decode-path-malformed")
def test_a_decode_path_that_is_not_one_is_refused_in_one_line(tmp_path):
    """A decode named but not in its file is refused by the describe step before anything runs;
    a decode function that returns logits alone, or one row of logits for several tokens fed, is
    refused at its first call naming the contract."""
    out = tmp_path / "run"
    proc = compare(out, "--twin", "tests/data/decode_paths/twin.py:missing_name", "--generate", "4")
    assert proc.returncode == 2 and "has no 'no_such'" in proc.stderr, proc.stderr
    assert "decode['nnx']" in proc.stderr and not out.exists()
    from common.generation import generate
    from common.twin import TwinError, resolve

    tokens, mask = prompts(np.ones((2, 8), np.int64), 2, 8)
    for name, message in (
        ("logits_only", "the decode path returned a ndarray, not (logits, cache)"),
        ("last_token_only", "returned logits of shape [2, 5] for tokens of shape [2, 6]"),
    ):
        decode = resolve(f"tests/data/decode_paths/decodes.py:{name}")
        with pytest.raises(TwinError, match=re.escape(message)):
            generate(
                lambda t, p, m, c, decode=decode: decode(
                    lambda x: np.ones((*x.shape, 5)), t, p, m, c
                ),
                np.asarray,
                tokens,
                mask,
                2,
            )


@pytest.mark.slow
@pytest.mark.error_case("generate-flags")
def test_a_backends_generation_flags_are_refused_in_one_line(tmp_path):
    """A backend run by hand: --generate-tokens and --capture-decode-step without --generate, a
    step out of range, a runtime that does not capture its decode path, a tokens folder that holds
    no generation run; each one line, exit 2, no run folder left."""
    for backend, args, message in (
        ("jax_impl", ("--capture-decode-step", "1"), "take --generate N (the run they are of)"),
        (
            "jax_impl",
            ("--generate", "4", "--capture-decode-step", "5"),
            "--capture-decode-step 5: a step from 0 (the prefill) to 4",
        ),
        (
            "torchax_impl",
            ("--generate", "4", "--capture-decode-step", "1"),
            "the torchax backend does not capture its decode path",
        ),
        (
            "torch_impl",
            ("--generate", "4", "--generate-tokens", str(tmp_path / "none")),
            f"--generate-tokens {tmp_path / 'none'}: run record {tmp_path / 'none'}/record.json "
            "does not exist; give the directory of a generation run (--generate) of this spec",
        ),
    ):
        out = tmp_path / f"{backend}-{len(args)}"
        proc = run_cli(backend, "--spec", "gpt-tiny", "--out", str(out), *args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and not out.exists()


def test_a_generation_run_of_another_compare_run_is_never_judged(tmp_path):
    """Two runs never mix: a generation folder left by another compare run (another run id) is not
    read; that side is said not run and the check does not pass, where this run's own is judged."""
    from common.files.record import RunRecord, write_record
    from common.files.tensor_file import write_tensors
    from common.presets import load_spec
    from compare.judge.generation import GENERATION_DIR, generation_check

    run = _run(np.random.default_rng(0))
    arrays = {k: run[k] for k in ("prefill", "steps", "whole", "mask", "fed", "chosen")}
    for name, run_id in (("jax", "this-run"), ("torch", "another-run")):
        folder = tmp_path / name / GENERATION_DIR
        folder.mkdir(parents=True)
        record = RunRecord(backend=name, spec=load_spec("gpt-tiny").to_dict(), run_id=run_id)
        record.tensors = write_tensors(folder, {"generation": arrays})
        write_record(folder, record)
    policy = {"forward": {"atol": 1e-5, "rtol": 1e-4}}
    check = generation_check(tmp_path, ["jax", "torch"], "jax", policy, "this-run", 3)
    section = check.section
    assert list(section["self"]) == ["jax"] and section["pairs"] == {}
    assert list(section["not_run"]) == ["torch"] and section["passed"] is False
