"""examples/hf_qwen2 through the door a user takes: Hugging Face's own Qwen2ForCausalLM, unchanged,
against an NNX port that fuses q/k/v (`packed` keyed by the NNX module), started from a
save_pretrained directory; its mis-ports exit 1 named where the port differs."""

import json

import pytest

from common.files.record import RECORD_FILE, read_record
from common.files.tensor_file import read_tensors
from tests.helpers import processes_under
from tests.test_examples import compare

QWEN2 = "examples/hf_qwen2/twin.py"


@pytest.mark.slow
def test_hugging_faces_qwen2_passes_on_every_backend_from_save_pretrained(tmp_path):
    """Biases drawn away from their zero init so that the fused kernel's column order counts; every
    backend passes, every captured module agrees (the attention, called with keyword arguments only,
    among them), and torchax's eval-mode forward, which transformers' mask makes untraceable, ran op
    by op, said so."""
    import torch

    from common.twin import load_twin, resolve

    twin = load_twin(f"{QWEN2}:qwen2_tiny")
    torch.manual_seed(2)
    model = resolve(twin.torch, twin.base_dir)(**twin.hparams)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(std=0.5)
    model.save_pretrained(tmp_path / "hf")
    # the user's checkpoint directory
    users = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    (tmp_path / "tmp").mkdir()
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{QWEN2}:qwen2_tiny",
        "--backend",
        "all",
        "--steps",
        "6",
        "--checkpoint",
        f"hf:{tmp_path / 'hf'}",
        "--activations",
        env={"TMPDIR": str(tmp_path / "tmp")},
    )
    assert proc.returncode == 0, report["message"]
    # read, never written
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == users
    # every process (describe steps, backends) ended without the interpreter's teardown
    # (common.procs.exit_process): nothing of theirs is left in the temporary directory or running,
    # and each record and its tensors are whole and this run's
    assert list((tmp_path / "tmp").iterdir()) == [] and not processes_under(tmp_path)
    for name in ("jax", "torch", "torch_xla", "torchax"):
        record = read_record(tmp_path / "run" / name)
        assert record.run_id == report["run_id"] and len(record.losses) == 6, name
        assert read_tensors(tmp_path / "run" / name, record)["outputs"]["logits"].size > 0, name
    written = json.loads((tmp_path / "run" / "start" / "correspondence.json").read_text())
    links = {link["torch"]: link for link in written}
    assert links["model.layers.0.self_attn.k_proj.weight"] == {  # q is 4 heads x 16 wide, k 2 x 16
        "torch": "model.layers.0.self_attn.k_proj.weight",
        "canonical": ["layers.0.attn.qkv.kernel"],
        "layout": "transpose",
        "rows": [64, 96],
    }
    for name in ("torch", "torch_xla", "torchax"):
        parity = report["parity"][name]
        assert parity["passed"] and parity["loss"]["max_abs"] < 1e-4, name
        assert (
            parity["tensors"]["outputs/logits"]["abs"] < 1e-5
            and parity["tensors"]["eval/logits"]["within"]
        ), name
        found = parity["first_divergent_module"]
        assert found["module"] is None and found["modules_compared"] >= 15, (name, found)
        assert not any(m.endswith(".attn") for m in found["not_compared"]), (name, found)
    record = json.loads((tmp_path / "run" / "torchax" / RECORD_FILE).read_text())
    assert record["extra"]["eval_forward"].startswith("op by op")


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin, module",
    [
        ("qwen2_rope_base_misported", "layers.0.attn"),
        ("qwen2_norm_eps_misported", "layers.0.input_layernorm"),
    ],
)
def test_the_qwen2_misports_are_named_where_they_differ(tmp_path, twin, module):
    """Llama's rotary base and RMSNorm epsilon copied into the Qwen2 port: each named at its first
    module, whose input agrees."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{QWEN2}:{twin}",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
        "--activations",
    )  # captured by the runs themselves: no capture run
    assert proc.returncode == 1, report["message"]
    found = report["parity"]["torch"]["first_divergent_module"]
    assert found["module"] == module and found["input_agrees"], found
