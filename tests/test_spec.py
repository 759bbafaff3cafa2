import json
import math

import pytest

from common.presets import PRESETS, load_spec
from common.spec import SpecError, TransformerSpec


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_validate(name):
    spec = load_spec(name)
    assert spec.name == name


def test_required_presets_exist():
    assert {"mlp-tiny", "cnn-digits", "gpt-tiny", "gpt2-small"} <= set(PRESETS)


def test_overrides_are_parsed_to_field_types():
    spec = load_spec(
        "gpt-tiny",
        [
            "model.d_model=128",
            "model.n_heads=8",
            "model.seq_len=128",
            "train.lr=3e-4",
            "mesh.data=2",
            "model.tied_embeddings=false",
        ],
    )
    assert spec.model.d_model == 128 and spec.model.n_heads == 8 and spec.model.seq_len == 128
    assert spec.train.lr == pytest.approx(3e-4) and isinstance(spec.train.lr, float)
    assert spec.mesh.data == 2 and spec.mesh.device_count == 2
    assert spec.model.tied_embeddings is False
    mlp = load_spec("mlp-tiny", ["model.hidden_sizes=32,16"])
    assert mlp.model.hidden_sizes == (32, 16)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.n_heads=5"], "model.n_heads=5 does not divide model.d_model=64"),
        (["model.d_model=0"], "model.d_model=0 must be positive"),
        (["train.lr=0"], "train.lr=0.0 must be positive"),
        (["train.lr=fast"], "train.lr=fast must be a number"),
        (["model.n_layers=2.5"], "model.n_layers=2.5 must be an integer"),
        (["train.optimizer=lamb"], "train.optimizer=lamb is not one of adamw, sgd"),
        (["model.foo=1"], "unknown key model.foo"),
        (["optim.lr=1"], "unknown section 'optim'"),
        (["train.lr"], "must look like section.field=value"),
        (
            ["data.seq_len=65"],
            "data.seq_len=65 is longer than the positional table model.seq_len=64",
        ),
        (
            ["mesh.data=3"],
            "train.global_batch_size=16 is not divisible by the data-parallel size "
            "mesh.data*mesh.fsdp=3",
        ),
        (["mesh.tensor=8"], "mesh.tensor=8 does not divide model.n_heads=4"),
        (["model.family=mlp"], "cannot switch model families"),
        (["train.nesterov=true"], "train.nesterov=true needs train.momentum > 0"),
        (["train.bf16_mode=half"], "train.bf16_mode=half must be one of autocast, loaded"),
    ],
)
@pytest.mark.error_case("mesh-tensor-heads")
def test_validation_errors_are_one_line_and_name_the_field(overrides, message):
    with pytest.raises(SpecError) as err:
        load_spec("gpt-tiny", overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_preset_and_unreadable_file(tmp_path):
    with pytest.raises(SpecError, match="unknown spec 'gpt-huge'"):
        load_spec("gpt-huge")
    with pytest.raises(SpecError, match="cannot read spec file"):
        load_spec(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(SpecError, match="is not valid TOML"):
        load_spec(str(bad))


def test_spec_files_toml_and_json_round_trip(tmp_path):
    toml = tmp_path / "small.toml"
    toml.write_text(
        '[model]\nfamily = "gpt"\nvocab_size = 128\nseq_len = 32\nd_model = 32\nn_heads = 2\n'
        "n_layers = 1\nd_ff = 64\n[train]\nlr = 0.01\nglobal_batch_size = 8\n"
        '[data]\ndataset = "synthetic-tokens"\n'
    )
    spec = load_spec(str(toml), ["train.steps=7"])
    assert isinstance(spec.model, TransformerSpec) and spec.model.vocab_size == 128
    assert spec.train.lr == 0.01 and spec.train.steps == 7 and spec.name == "small"
    as_json = tmp_path / "again.json"
    as_json.write_text(json.dumps(spec.to_dict()))
    assert load_spec(str(as_json)).to_dict() == spec.to_dict()


def test_warmup_cosine_schedule_values():
    t = load_spec("gpt-tiny").train  # lr 3e-3, 5 warm-up steps, 50 steps, min ratio 0.1
    assert t.lr_at(0) == pytest.approx(3e-3 / 5)
    assert t.lr_at(4) == pytest.approx(3e-3)
    assert t.lr_at(5) == pytest.approx(3e-3)
    assert t.lr_at(49) == pytest.approx(3e-4)
    assert t.lr_at(27) == pytest.approx(3e-4 + 0.9 * 3e-3 * 0.5 * (1 + math.cos(math.pi * 22 / 44)))
    assert load_spec("mlp-tiny").train.lr_at(30) == 1e-3


@pytest.mark.error_case("twin-task-hparam")
def test_a_twin_task_missing_a_hyperparameter_its_data_needs():
    from common.spec import TwinSpec

    spec = TwinSpec(twin="twins.py:t", task="lm", hparams={"vocab_size": 256})
    with pytest.raises(SpecError) as err:
        spec.validate()
    assert str(err.value) == (
        "twin twins.py:t: task lm needs the hyperparameter 'seq_len' (seq_len); add it to "
        "hparams or map it in io"
    )
