"""examples/clip through the door a user takes: Hugging Face's own CLIPModel, unchanged (two towers
returning ModelOutputs, a 0-d logit_scale), against an NNX port whose towers return their pooled
vectors alone, on its own image-caption batches with its own contrastive loss. The correct port
passes with no module named; each mis-port is named where it is: in the loss, at the text tower (its
pooled output against HF's pooler_output field), and in the model's own forward code (the
normalisation HF does there)."""

import pytest

from common.twin.modules import module_map
from tests.test_examples import compare

CLIP = "examples/clip/twin.py"


def test_a_rename_that_flattens_a_container_gives_the_nnx_module_to_the_outermost_torch_module():
    """`^text_model\\.embeddings\\.` -> `text.` makes both `text_model.embeddings` and `text_model`
    read `text`: the outer one holds it (the capture took the embeddings' output for the tower's
    before)."""
    names = module_map(
        ["", "text_model", "text_model.embeddings", "text_model.embeddings.token_embedding"],
        {"text.token_embedding.embedding": (4, 2)},
        {r"^text_model\.embeddings\.": "text.", r"^text_model": "text"},
    )
    assert names == {
        "": "(model)",
        "text_model": "text",
        "text_model.embeddings.token_embedding": "text.token_embedding",
    }


@pytest.mark.slow
def test_hugging_faces_clip_passes_with_every_module_compared_and_none_named(tmp_path):
    proc, report = compare(
        tmp_path / "run", "--twin", f"{CLIP}:clip_tiny", "--backend", "jax,torch", "--activations"
    )
    parity = report["parity"]["torch"]
    assert proc.returncode == 0, report["message"]
    forward, backward = parity["first_divergent_module"], parity["first_divergent_module_backward"]
    assert (
        forward["module"] is None
        and forward["modules_compared"] >= 50
        and forward["not_compared"] == {}
    )
    assert backward["module"] is None and not backward.get("in_loss")
    # the 0-d parameter, trained on both sides
    assert parity["tensors"]["params/logit_scale"]["within"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "twin", ["clip_one_directional_loss", "clip_pooled_first", "clip_text_not_normalised"]
)
def test_each_clip_mis_port_is_named_where_it_is(tmp_path, twin):
    proc, report = compare(tmp_path / "run", "--twin", f"{CLIP}:{twin}", "--backend", "jax,torch")
    parity = report["parity"]["torch"]
    assert proc.returncode == 1 and parity["first_divergent_step"] == 0
    forward, backward = parity["first_divergent_module"], parity["first_divergent_module_backward"]
    # every module agrees; the gradient the loss sends back does not
    if twin == "clip_one_directional_loss":
        assert forward["module"] is None and backward["in_loss"], (forward, backward)
        assert "first divergent in the loss" in report["message"]
    # HF's text tower returns (hidden states, pooled): its pooled field compared
    elif twin == "clip_pooled_first":
        assert forward["module"] == "text" and forward["input_agrees"], forward
        assert forward["output_error"]["field"] == "torch's pooler_output"
    # HF normalises the embeddings in CLIPModel.forward itself: the
    # model's own code, nothing below it
    else:
        assert forward["module"] == "(model)" and forward["modules_diverging"] == 1, forward


@pytest.mark.slow
@pytest.mark.parametrize("twin, code", [("clip_own_loss", 0), ("clip_own_loss_one_directional", 1)])
def test_clips_own_loss_is_compared_and_its_mis_port_named_in_the_loss(tmp_path, twin, code):
    """CLIPModel's own loss (`forward_kwargs={"return_loss": True}`, loss="model"), computed in its
    forward, the port's alike: a correct port passes (under summaries too: its 0-d logit_scale kept
    on the device), a one-directional loss is named in the loss, not at the model whose forward
    computes it."""
    proc, report = compare(
        tmp_path / "run",
        "--twin",
        f"{CLIP}:{twin}",
        "--backend",
        "jax,torch",
        *(["--tensors", "summary"] if code == 0 else []),
    )
    parity = report["parity"]["torch"]
    assert proc.returncode == code, report["message"]
    if code == 0:
        assert (
            parity["tensors"]["params/logit_scale"]["within"] and parity["loss"]["max_abs"] < 1e-4
        )
        return
    forward = parity["first_divergent_module"]
    assert (
        forward["in_loss"].startswith("the model's own loss, computed in its forward")
        and forward["modules_diverging"] == 1
    ), forward
    assert "first divergent in the loss: the model's own loss" in report["message"]
    # a located difference: no tolerance is offered
    assert "would pass with" not in report["message"]
    assert (
        "| first divergent module (step 0) | in the loss: the model's own loss"
        in (tmp_path / "run" / "report.md").read_text()
    )
