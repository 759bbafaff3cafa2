"""examples/bert_mlm through the door a user takes: Hugging Face's own BertForMaskedLM, unchanged,
against an NNX port, on padded sentence pairs from the twin's numpy batch function, each side
computing its own masked-LM loss from `labels`. The padding is honoured: every backend's step-0 loss
and gradients equal those of the same sequences run unpadded, one by one, computed here by hand."""

import json
from pathlib import Path

import numpy as np
import pytest

from common.data import make_dataset
from common.files.record import read_record
from common.spec.parse import run_spec_from_dict
from tests.test_examples import compare

BERT = "examples/bert_mlm/twin.py"


def unpadded_by_hand(run) -> tuple[float, dict[str, np.ndarray]]:
    """Step 0's masked-LM loss and two gradients (canonical names) of the run's start weights, each
    sequence of step 0's batch run alone at its own length, no padding and no mask: the mean over
    every labelled token."""
    import torch
    from safetensors.torch import load_file

    from common.twin import resolve, twin_of

    spec = run_spec_from_dict(json.loads((run / "spec.json").read_text()))
    twin = twin_of(spec.model)
    model = resolve(twin.torch, twin.base_dir)(**spec.model.hparams)
    model.load_state_dict(load_file(run.parent / "start" / "torch_init.safetensors"), strict=False)
    batch = make_dataset(spec).global_batch(0).inputs
    total = torch.zeros((), dtype=torch.float64)
    count = int((batch["labels"] != -100).sum())
    for row in range(len(batch["input_ids"])):
        length = int(batch["attention_mask"][row].sum())
        ids, types, labels = (
            torch.from_numpy(batch[k][row : row + 1, :length].astype(np.int64))
            for k in ("input_ids", "token_type_ids", "labels")
        )
        logits = model(input_ids=ids, token_type_ids=types).logits
        total = total + torch.nn.functional.cross_entropy(
            logits[0].float(), labels[0], ignore_index=-100, reduction="sum"
        )
    loss = total / count
    loss.backward()
    grads = {
        "embed.tok.embedding": model.bert.embeddings.word_embeddings.weight.grad.numpy(),
        "layers.0.attn.q.kernel": model.bert.encoder.layer[0]
        .attention.self.query.weight.grad.numpy()
        .T,
    }
    return float(loss.detach()), grads


@pytest.mark.slow
def test_hugging_faces_bert_passes_on_every_jax_runtime_and_its_padding_is_honoured(tmp_path):
    """torch_xla is left out to keep the suite short: it runs a Hugging Face class in
    test_example_qwen2.py and a twin's own loss on its own batches in test_example_unet.py."""
    proc, report = compare(
        tmp_path / "run", "--twin", f"{BERT}:bert_tiny", "--backend", "jax,torch,torchax"
    )
    assert proc.returncode == 0, report["message"]
    assert set(report["backends"]) == {"jax", "torch", "torchax"}
    run = tmp_path / "run" / "torch"
    batch = (
        make_dataset(run_spec_from_dict(json.loads((run / "spec.json").read_text())))
        .global_batch(0)
        .inputs
    )
    assert (batch["attention_mask"] == 0).sum() > 20  # padded: rows of several lengths
    loss, grads = unpadded_by_hand(run)
    for name in report["backends"]:
        assert read_record(tmp_path / "run" / name).losses[0] == pytest.approx(loss, rel=2e-6), name
        with np.load(tmp_path / "run" / name / "tensors.npz") as f:
            for key, expected in grads.items():
                got = f[f"grads/{key}"]
                assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), (name, key)


@pytest.mark.slow
def test_a_bert_port_that_attends_to_padding_is_named_at_its_layer(tmp_path):
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{BERT}:bert_mask_ignored",
        "--backend",
        "jax,torch",
        "--activations",
    )  # captured by the runs themselves: no capture run
    assert proc.returncode == 1, report["message"]
    parity = report["parity"]["torch"]
    assert (
        parity["first_divergent_step"] == 0
        and parity["first_divergent_module"]["module"] == "layers.0"
    )


@pytest.mark.slow
def test_a_difference_only_in_later_examples_is_captured_where_the_logits_differ_most(tmp_path):
    """The padding mis-port on a batch whose first two sequences are unpadded: those agree, so a
    capture of the batch's first rows would find every module agreeing beside failing logits.
    compare captures from the row where the two sides' step-0 logits differ most, and the mis-port
    is named at layers.0 there."""
    example = Path("examples/bert_mlm").resolve()
    (tmp_path / "rows.py").write_text(
        "import importlib.util\n"
        "spec = importlib.util.spec_from_file_location('bert_batches', "
        f"{str(example / 'batches.py')!r})\n"
        "batches = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(batches)\n\n\n"
        "def full_first_rows(seed, step, batch_size, vocab_size, seq_len):\n"
        "    batch = batches.mlm_batch(seed, step, batch_size, vocab_size, seq_len)\n"
        "    full = batches.mlm_batch(seed + 1, step, 64, vocab_size, seq_len)\n"
        "    rows = [i for i in range(64) if full['attention_mask'][i].all()][:2]  # unpadded "
        "sequences\n"
        "    for key in batch:\n"
        "        batch[key][:2] = full[key][rows]\n"
        "    return batch\n"
    )
    (tmp_path / "twin.py").write_text(
        "import dataclasses\nfrom common.spec import DataSpec\nfrom common.twin import "
        "load_twin\n\n"
        f"base = load_twin({str(example / 'twin.py')!r} + ':bert_mask_ignored')\n"
        "twin = dataclasses.replace(base, torch=base.base_dir + '/hf_bert.py:bert',\n"
        "                           nnx=base.base_dir + '/nnx_bert.py:bert_mask_ignored',\n"
        "                           data=DataSpec(dataset='batches', "
        "path='rows.py:full_first_rows'))\n"
    )
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{tmp_path / 'twin.py'}:twin",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
    )
    parity = report["parity"]["torch"]
    assert proc.returncode == 1, report["message"]
    found = parity["first_divergent_module"]
    assert found["module"] == "layers.0" and found["input_agrees"], found
    row = found["captured_at"][0]
    assert row >= 2  # not the unpadded rows the capture used to take
    capture = read_record(tmp_path / "run" / "torch" / "activations")
    assert capture.extra.capture_at[0] == row
