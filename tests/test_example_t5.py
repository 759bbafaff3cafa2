"""examples/t5_seq2seq through the door a user takes: Hugging Face's own T5ForConditionalGeneration,
an encoder-decoder trained with teacher forcing, unchanged, against an NNX port with its own names
and its own placement of the relative position bias; padded sources, -100-padded targets; its
mis-port named where it is."""

import json

import numpy as np
import pytest
import torch

from common.data import make_dataset
from common.files.record import read_record
from common.spec.parse import run_spec_from_dict
from tests.test_examples import compare, losses_of_every_backend

T5 = "examples/t5_seq2seq/twin.py"


@pytest.mark.slow
def test_hugging_faces_t5_passes_with_teacher_forcing(tmp_path):
    """torch_xla and torchax are left out to keep the suite short (they pass: docs/findings.md); a
    model's own loss on a twin's own batches runs on torch_xla in tests/test_example_unet.py, on
    torchax in tests/test_example_bert.py."""
    proc, report = compare(tmp_path / "run", "--twin", f"{T5}:t5_tiny", "--backend", "jax,torch")
    assert proc.returncode == 0, report["message"]
    losses = losses_of_every_backend(report, steps=6, names=("jax", "torch"))  # 5.05710 at step 0
    # step 0's loss is Hugging Face's own, from the start weights, on the batch the source made
    from safetensors.torch import load_file

    from common.twin import resolve, twin_of

    run = tmp_path / "run" / "torch"
    spec = run_spec_from_dict(json.loads((run / "spec.json").read_text()))
    twin = twin_of(spec.model)
    model = resolve(twin.torch, twin.base_dir)(**spec.model.hparams)
    model.load_state_dict(
        load_file(tmp_path / "run" / "start" / "torch_init.safetensors"), strict=False
    )
    batch = make_dataset(spec).global_batch(0).inputs
    # padded on both sides
    assert (batch["labels"] == -100).any() and (batch["attention_mask"] == 0).any()
    with torch.no_grad():
        loss = model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}).loss
    for name in losses:
        assert read_record(tmp_path / "run" / name).losses[0] == pytest.approx(
            float(loss), rel=1e-5
        ), name


@pytest.mark.slow
def test_a_t5_decoder_that_buckets_offsets_both_ways_is_named_at_its_self_attention(tmp_path):
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{T5}:t5_bidirectional_decoder_buckets",
        "--backend",
        # captured by the runs themselves: no capture run
        "jax,torch",
        "--activations",
    )
    assert proc.returncode == 1, report["message"]
    assert (
        report["parity"]["torch"]["first_divergent_module"]["module"]
        == "decoder.layers.0.self_attn"
    )
