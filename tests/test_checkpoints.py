"""`--checkpoint FORMAT:PATH`: Hugging Face GPT-2 and Llama checkpoints (transformers builds them
from a config, nothing downloaded) and torch state_dicts start every backend; bad checkpoints are
one line."""

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from common.data import make_dataset  # noqa: E402
from common.files.record import read_record  # noqa: E402
from common.files.tensor_file import read_tensors  # noqa: E402
from common.presets import load_spec  # noqa: E402
from tests.helpers import run_cli  # noqa: E402
from tests.test_hostile_twins import assert_refused  # noqa: E402
from tests.test_hostile_twins import compare as compare_refused  # noqa: E402

LLAMA = "examples/llama/twin.py:llama_tiny"
STEPS = 5


def hf_gpt2(path, **overrides):
    torch.manual_seed(0)
    config = dict(
        vocab_size=256,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**config, **overrides}))
    model.save_pretrained(path)
    return model


def hf_llama(path):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    )
    model.save_pretrained(path)
    return model


def hf_reference(model, spec):
    """HF's own step-0 logits and its per-step losses under torch.optim.AdamW on the spec's
    batches."""
    data = make_dataset(spec)
    batches = [
        tuple(torch.from_numpy(a).long() for a in data.global_batch(s)) for s in range(STEPS)
    ]
    t = spec.train
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=t.lr,
        betas=(t.beta1, t.beta2),
        eps=t.eps,
        weight_decay=t.weight_decay,
    )
    model.train()
    with torch.no_grad():
        logits0 = model(batches[0][0]).logits.numpy()
    losses = []
    for step, (inputs, targets) in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = t.lr_at(step)
        logits = model(inputs).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return logits0, losses


def compare(tmp_path, *args, env=None):
    return run_cli(
        "compare",
        "--quiet",
        "--backend",
        "jax,torch",
        "--steps",
        str(STEPS),
        "--out",
        str(tmp_path / "run"),
        *args,
        timeout=900,
        env=env,
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_both_twins_reproduce_the_hf_model(tmp_path, family):
    model = hf_gpt2(tmp_path / "hf") if family == "gpt2" else hf_llama(tmp_path / "hf")
    twin = [] if family == "gpt2" else ["--twin", LLAMA]
    proc = compare(tmp_path, *twin, "--checkpoint", f"hf:{tmp_path / 'hf'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec = load_spec("gpt-tiny", [f"train.steps={STEPS}"], twin=LLAMA if twin else None)
    logits0, losses = hf_reference(model, spec)
    for backend in ("jax", "torch"):
        run = tmp_path / "run" / backend
        record = read_record(run)
        assert np.max(np.abs(read_tensors(run, record)["outputs"]["logits"] - logits0)) <= 1e-5, (
            backend
        )
        assert np.max(np.abs(np.array(record.losses) - np.array(losses))) <= 1e-4, (
            backend,
            record.losses,
            losses,
        )
    assert json.loads((tmp_path / "run" / "report.json").read_text())["verdict"] == "pass"


@pytest.mark.slow
def test_a_torch_state_dict_starts_every_backend_bitwise(tmp_path):
    from common.weights import init_params, load_checkpoint
    from torch_impl.convert import load_canonical
    from torch_impl.models import build_model

    spec = load_spec("gpt-tiny")
    canonical = init_params(spec.model, seed=3)
    model = load_canonical(build_model(spec.model), canonical, spec.model)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    proc = compare(tmp_path, "--checkpoint", f"torch:{tmp_path / 'model.pt'}", "--steps", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    start = load_checkpoint(tmp_path / "run" / "start" / "init.safetensors", spec.model)
    assert all(np.array_equal(start[k], v) for k, v in canonical.items())


def bad_checkpoints(tmp_path) -> list[tuple[list[str], str]]:
    from torch_impl.models import build_model

    spec = load_spec("gpt-tiny")
    state = {k: torch.randn(v.shape) for k, v in build_model(spec.model).state_dict().items()}
    cases = []

    def save(name, obj):
        torch.save(obj, tmp_path / name)
        return f"torch:{tmp_path / name}"

    missing = dict(state)
    missing.pop("blocks.1.mlp.fc.weight")
    cases.append(
        (
            [save("missing.pt", missing)],
            r"1 tensor\(s\) missing: blocks.1.mlp.fc.weight \[256, 64\]",
        )
    )
    cases.append(
        (
            [save("extra.pt", {**state, "blocks.9.attn.qkv.weight": torch.zeros(3, 3)})],
            r"1 tensor\(s\) the model does not have: blocks.9.attn.qkv.weight \[3, 3\]",
        )
    )
    cases.append(
        (
            [save("shape.pt", {**state, "wte.weight": torch.zeros(300, 64)})],
            r"wte.weight is \[300, 64\], the model's is \[256, 64\]",
        )
    )
    cases.append(
        (
            [save("dtype.pt", {**state, "ln_f.weight": torch.ones(64, dtype=torch.int64)})],
            r"tensor ln_f.weight has dtype int64; parameters must be float32, bfloat16, float16",
        )
    )
    cases.append(([save("list.pt", [state["wte.weight"]])], r"holds a list, not a state_dict"))
    cases.append(([save("model.pt", torch.nn.Linear(2, 2))], r"holds objects other than tensors"))
    truncated = tmp_path / "truncated.pt"
    torch.save(state, truncated)
    truncated.write_bytes(truncated.read_bytes()[:5000])
    cases.append(
        (
            [f"torch:{truncated}"],
            r"truncated.pt is not a readable torch file \(truncated or corrupt\)",
        )
    )
    hf_gpt2(tmp_path / "wide", n_embd=96)
    cases.append(
        (
            [f"hf:{tmp_path / 'wide'}"],
            r"config.json does not match the spec: n_embd=96 but "
            r"model.d_model=64; n_inner=384 but model.d_ff=256",
        )
    )
    hf_llama(tmp_path / "llama")
    cases.append(
        ([f"hf:{tmp_path / 'llama'}"], r"is a 'llama' model; this twin loads 'gpt2' checkpoints")
    )
    cases.append(
        (
            [f"pickle:{tmp_path / 'x'}"],
            r"unknown format 'pickle'; use canonical \| torch \| hf \| orbax",
        )
    )
    return cases


@pytest.mark.parametrize("index", range(10))
@pytest.mark.error_case(
    "checkpoint-format-unknown",
    "checkpoint-torch-misfit",
    "checkpoint-dtype",
    "checkpoint-unreadable",
    "checkpoint-hf-other",
)
def test_each_bad_checkpoint_is_refused_naming_file_and_tensor(tmp_path, index):
    """What the torch describe step runs on a --checkpoint (checkpoint_io.load_torch_side), in this
    process."""
    from common.cli import INPUT_ERRORS
    from torch_impl.checkpoint_io import load_torch_side as load
    from torch_impl.models import build_model

    (ref,), message = bad_checkpoints(tmp_path)[index]
    spec = load_spec("gpt-tiny")
    shapes = {n: tuple(p.shape) for n, p in build_model(spec.model).named_parameters()}
    with pytest.raises(INPUT_ERRORS) as caught:
        load(ref, spec, shapes)
    assert re.search(message, str(caught.value)) and "\n" not in str(caught.value), str(
        caught.value
    )


@pytest.mark.slow
def test_bad_checkpoints_through_compare_are_one_line_exit_2_and_write_nothing(tmp_path):
    # compare's own temporary folders: this test's alone (other tests run beside it)
    temp = tmp_path / "tmp"
    temp.mkdir()
    cases = bad_checkpoints(tmp_path)
    # one found by the torch process, one by compare itself
    for args, message in (cases[0], cases[7]):
        proc = compare(tmp_path, "--checkpoint", *args, env={"TMPDIR": str(temp)})
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, (
            args,
            proc.stderr,
        )
        assert re.search(message, errors[0]), (message, errors[0])
        assert not (tmp_path / "run").exists()
    assert list(temp.iterdir()) == []  # nothing left behind


def convert(*args):
    proc = run_cli("compare.convert", *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("twin", [None, LLAMA])
def test_torch_state_dict_to_orbax_nnx_and_back_is_bitwise(tmp_path, twin):
    """torch state_dict -> canonical -> orbax (NNX state, nnx.update restores it) -> torch
    state_dict."""
    from torch_impl.models import build_model

    spec = load_spec("gpt-tiny", twin=twin)
    torch.manual_seed(1)
    model = build_model(spec.model, seed=1) if twin else None
    if model is None:  # the built-in gpt: random values in its own torch layout
        from common.weights import init_params
        from torch_impl.convert import load_canonical

        model = load_canonical(build_model(spec.model), init_params(spec.model, 1), spec.model)
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.save(state, tmp_path / "sd.pt")
    which = ["--twin", twin] if twin else ["--spec", "gpt-tiny"]
    convert(*which, "--from", f"torch:{tmp_path / 'sd.pt'}", "--to", f"orbax:{tmp_path / 'nnx'}")
    assert (tmp_path / "nnx" / "state").is_dir()
    convert(*which, "--from", f"orbax:{tmp_path / 'nnx'}", "--to", f"torch:{tmp_path / 'back.pt'}")
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert list(back) == list(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())


@pytest.mark.slow
@pytest.mark.error_case("checkpoint-framework-cannot-read")
def test_each_backend_alone_reads_what_its_framework_can(tmp_path):
    """torch runtimes read torch: and hf:, jax reads orbax:; the same start, the same first
    losses."""
    hf_gpt2(tmp_path / "hf")
    convert("--from", f"hf:{tmp_path / 'hf'}", "--to", f"orbax:{tmp_path / 'nnx'}")
    losses = {}
    for backend, ref in (
        ("torch_impl", f"hf:{tmp_path / 'hf'}"),
        ("jax_impl", f"orbax:{tmp_path / 'nnx'}"),
    ):
        proc = run_cli(
            backend,
            "--checkpoint",
            ref,
            "--steps",
            "2",
            "--throughput-steps",
            "0",
            "--out",
            str(tmp_path / backend),
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        record = read_record(tmp_path / backend)
        assert record.extra.start["from"] == ref
        losses[backend] = record.losses
    assert np.max(np.abs(np.array(losses["torch_impl"]) - np.array(losses["jax_impl"]))) < 1e-5
    proc = run_cli(
        "jax_impl", "--checkpoint", f"hf:{tmp_path / 'hf'}", "--out", str(tmp_path / "no")
    )
    assert (
        proc.returncode == 2
        and "the jax backend reads canonical and orbax checkpoints" in proc.stderr
    )


@pytest.mark.error_case("checkpoint-hf-meta-layout")
def test_metas_original_llama_layout_is_refused_with_what_to_do():
    from common.twin import load_twin
    from common.twin.hf import to_torch_names
    from common.weights import CheckpointError
    from tests.helpers import REPO

    twin = load_twin(f"{REPO}/examples/llama/twin.py:llama_tiny")
    meta = {
        "tok_embeddings.weight": np.zeros((256, 64), np.float32),
        "layers.0.attention.wq.weight": np.zeros((64, 64), np.float32),
    }
    with pytest.raises(CheckpointError) as err:
        to_torch_names(meta, twin, "hf checkpoint consolidated")
    assert str(err.value).startswith(
        "hf checkpoint consolidated is in Meta's original Llama layout (tok_embeddings, "
        "attention.wq, ...: interleaved rotary pairs); convert it to Hugging Face's "
        "rotate-half layout first"
    )


GPT_TINY_HF = {
    "model_type": "gpt2",
    "vocab_size": 256,
    "n_positions": 64,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "layer_norm_epsilon": 1e-05,
    "n_inner": 256,
    "activation_function": "gelu_new",
}


@pytest.mark.parametrize(
    "index, message",
    [
        ('{"weight_map": {', r"model.safetensors.index.json is not JSON \(Expecting property name"),
        ("[1]", r"model.safetensors.index.json has no weight_map of tensor names to shard files"),
        (
            '{"weight_map": {"wte.weight": 3}}',
            r"model.safetensors.index.json has no weight_map of tensor names",
        ),
    ],
)
@pytest.mark.slow  # the index is read where the weights are: the describe step and the backends
@pytest.mark.error_case("checkpoint-hf-index-bad")
def test_a_hugging_face_shard_index_that_is_not_one_is_refused_naming_it(tmp_path, index, message):
    (tmp_path / "tmp").mkdir()
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(GPT_TINY_HF))
    (checkpoint / "model.safetensors.index.json").write_text(index)
    before = {p: p.read_bytes() for p in checkpoint.iterdir()}
    proc = compare_refused(
        tmp_path,
        "--spec",
        "gpt-tiny",
        "--checkpoint",
        f"hf:{checkpoint}",
        "--backend",
        "jax,torch",
        "--out",
        str(tmp_path / "run"),
    )
    assert_refused(tmp_path, proc, message + r".*; give the index save_pretrained writes")
    assert {p: p.read_bytes() for p in checkpoint.iterdir()} == before  # the user's files untouched


@pytest.mark.slow
@pytest.mark.error_case("checkpoint-hf-index-bad")
def test_a_tensor_in_two_hugging_face_shards_is_refused_naming_both(tmp_path):
    """from_pretrained would take one of them, whichever it reads last: neither is taken."""
    from safetensors.numpy import save_file

    (tmp_path / "tmp").mkdir()
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(GPT_TINY_HF))
    wte = np.zeros((256, 64), np.float32)
    save_file({"transformer.wte.weight": wte}, str(checkpoint / "model-1.safetensors"))
    save_file({"transformer.wte.weight": wte + 1}, str(checkpoint / "model-2.safetensors"))
    index = {
        "weight_map": {"transformer.wte.weight": "model-1.safetensors", "x": "model-2.safetensors"}
    }
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    proc = compare_refused(
        tmp_path,
        "--spec",
        "gpt-tiny",
        "--checkpoint",
        f"hf:{checkpoint}",
        "--backend",
        "jax,torch",
        "--out",
        str(tmp_path / "run"),
    )
    assert_refused(
        tmp_path,
        proc,
        r"tensor transformer.wte.weight is in two shards \(model-1.safetensors and "
        r"model-2.safetensors\); save the checkpoint again with save_pretrained",
    )
