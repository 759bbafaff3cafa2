"""Bad values and malformed inputs (docs/errors.md): non-finite values by rule, a report strict JSON
and always written, any JSON/TOML shape refused in one line (the CLI, before any backend), one
meaning of a checkpoint's dtype."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from common.files.record import RunRecord, StepRecord, write_record
from common.files.tensor_file import write_tensors
from common.presets import load_spec
from common.vocab import BackendStatus, ExitCode, ReportStatus
from common.weights import CheckpointError, init_params, load_checkpoint, save_checkpoint
from compare.judge import distribution, messages, parity
from compare.judge.tensor_error import tensor_error
from compare.judge.tolerances import load_policy
from compare.reporting.report import ReportInputs, build_report, strict_json, strict_report
from tests.helpers import run_cli

MASKED = "tests/data/masked_logits/twins.py:masked"


def _policy():
    return load_policy("default", "float32")


def compare(*args, timeout=600):
    return run_cli("compare", "--quiet", *args, timeout=timeout)


def one_error(proc) -> str:  # the one `error:` line of a refused run (no traceback)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


# --- refused before any backend runs: exit 2, one line naming the file and the field, no run
# directory ---


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    return path


def _mlp() -> dict:
    return init_params(load_spec("mlp-tiny").model, 0)


def _checkpoint(d: Path, params: dict) -> list[str]:
    path = d / "ckpt.safetensors"
    save_checkpoint(path, params)
    return ["--spec", "mlp-tiny", "--checkpoint", f"canonical:{path}"]


def _record_dir(d: Path, change, tensors: dict | None = None) -> list[str]:
    """--jax-record of a record.json a backend would have written, then changed by `change(raw)`."""
    spec = load_spec("mlp-tiny", ["train.steps=2"])
    write_record(
        d / "rec",
        RunRecord(
            backend="jax",
            spec=spec.to_dict(),
            tensors="tensors.npz" if tensors else None,
            steps=[StepRecord(0, 2.3, 1.0), StepRecord(1, 2.2, 1.0)],
        ),
    )
    np.savez(d / "rec" / "tensors.npz", **(tensors or {}))
    raw = json.loads((d / "rec" / "record.json").read_text())
    (d / "rec" / "record.json").write_text(json.dumps(change(raw)))
    return ["--spec", "mlp-tiny", "--steps", "2", "--jax-record", str(d / "rec")]


def _spec(name: str, text) -> callable:
    return lambda d: ["--spec", str(_write(d / name, text))]


def _tolerance(text: str | bytes) -> callable:
    return lambda d: [
        "--spec",
        "mlp-tiny",
        "--tolerance-profile",
        str(_write(d / "tol.json", text)),
    ]


def _truncated(d: Path) -> list[str]:
    args = _checkpoint(d, _mlp())
    data = (d / "ckpt.safetensors").read_bytes()
    (d / "ckpt.safetensors").write_bytes(data[: len(data) // 2])
    return args


SPEC_SHAPES = [  # a spec file of any JSON / TOML shape
    (
        _spec("run.json", "[1]"),
        r"spec file .*run.json holds a list; a spec file holds a table with "
        r"model/train/mesh/data sections",
    ),
    (_spec("run.json", '"mlp"'), r"run.json holds a string; a spec file holds a table"),
    (_spec("run.json", "3"), r"run.json holds a number; a spec file holds a table"),
    (_spec("run.json", "null"), r"run.json holds null; a spec file holds a table"),
    (
        _spec("run.toml", "model = [1, 2]\n"),
        r"spec file .*run.toml: section model is a list \(\[1, 2\]\); it must be a table of fields",
    ),
    (
        _spec("run.json", '{"model": {"family": "mlp"}, "train": [1]}'),
        r"run.json: section train is a list",
    ),
    (
        _spec("run.json", '{"model": {"family": "mlp"}, "train": {"steps": [2]}}'),
        r"spec file .*run.json: train.steps=\[2\] must be an integer",
    ),
    (
        _spec("run.json", '{"model": {"family": ["mlp"]}}'),
        r"run.json: model.family=\['mlp'\] is unknown; choose one of mlp, cnn, gpt, twin",
    ),
    (
        _spec("run.json", '{"model": {"family": "mlp"}, "data": {"path": {"x": 1}}}'),
        r"run.json: data.path=\{'x': 1\} must be a string",
    ),
    (_spec("run.toml", b"\xff\xfe model"), r"run.toml is not UTF-8 text \(a binary file\?\)"),
]
TOLERANCE_SHAPES = [  # a tolerance file of any shape
    (
        _tolerance("[]"),
        r"--tolerance-profile .*tol.json holds a list; a tolerance file is a JSON object "
        r"\{dtype: \{kind: \{atol, rtol\}\}\}",
    ),
    (
        _tolerance('{"float32": 3}'),
        r"tol.json: float32 is a number; it must be an object \{kind: \{atol, rtol\}\}",
    ),
    (
        _tolerance('{"float32": {"logits": "x"}}'),
        r"tol.json: float32.logits must be one of forward, grad, loss, params with atol/rtol "
        r"numbers",
    ),
    (
        _tolerance('{"float16": {"loss": {"atol": 1}}}'),
        r"tol.json: unknown dtype 'float16'; the dtypes are float32, "
        r"bfloat16",
    ),
    (
        _tolerance(b"\xff\xfe{}"),
        r"--tolerance-profile .*tol.json is not UTF-8 text \(a binary file\?\)",
    ),
]
TOLERANCE_VALUES = [  # and its values
    (
        _tolerance('{"float32": {"forward": {"atol": NaN}}}'),
        r"tol.json: float32.forward.atol=nan must be a finite "
        r"number >= 0",
    ),
    (
        _tolerance('{"bfloat16": {"loss": {"rtol": Infinity}}}'),
        r"tol.json: bfloat16.loss.rtol=inf must be a finite "
        r"number >= 0",
    ),
    (
        _tolerance('{"float32": {"grad": {"atol": -1e-6}}}'),
        r"tol.json: float32.grad.atol=-1e-06 must be a finite "
        r"number >= 0",
    ),
    (
        _tolerance('{"float32": {"params": {"atol": "1e-3"}}}'),
        r'tol.json: float32.params.atol="1e-3" must be a '
        r"finite number >= 0",
    ),
    (
        _tolerance('{"float32": {"distribution": {"top1": 2}}}'),
        r"tol.json: float32.distribution.top1=2 must be a "
        r"share from 0 to 1",
    ),
]
RECORDS = [  # a run record of the wrong shape given with --jax-record
    (
        lambda d: _record_dir(d, lambda raw: [raw]),
        r"--jax-record: run record .*record.json is not a run record of this toolkit \(it holds a "
        r"list\); give the "
        r"record.json \(or the run directory\) a backend of this toolkit wrote",
    ),
    (
        lambda d: _record_dir(d, lambda raw: {"backend": "jax", "steps": []}),
        r"is not a run record of this toolkit \(it holds a JSON object without schema_version\)",
    ),
    (
        lambda d: _record_dir(d, lambda raw: {k: v for k, v in raw.items() if k != "spec"}),
        r"is not a run record of this toolkit: it lacks the field 'spec'",
    ),
    (
        lambda d: _record_dir(d, lambda raw: {**raw, "platform": ["cpu"]}),
        r"is not a run record of this toolkit: platform is a list, not dict",
    ),
    (
        lambda d: _record_dir(
            d, lambda raw: {**raw, "steps": [{**raw["steps"][0], "loss": "2.3"}, raw["steps"][1]]}
        ),
        r"has a malformed entry: steps\[0\].loss is a string, not float \| None",
    ),
    (
        lambda d: _record_dir(
            d,
            lambda raw: {**raw, "steps": [{**raw["steps"][0], "loss": math.nan}, raw["steps"][1]]},
        ),
        r"steps\[0\].loss is nan, which this toolkit never writes \(a non-finite loss is null\)",
    ),
    (
        lambda d: _record_dir(d, lambda raw: raw, tensors={"outputs/logits": np.array(["a", "b"])}),
        r"--jax-record: tensor file .*tensors.npz: entry 'outputs/logits' holds <U1 values, not "
        r"numbers",
    ),
]
CHECKPOINT_DTYPES = [  # a canonical checkpoint whose tensors are not floating point
    (
        lambda d: _checkpoint(d, {k: (v * 100).astype(np.int32) for k, v in _mlp().items()}),
        r"checkpoint .*ckpt.safetensors: tensor \S+ has dtype int32; parameters must be float32, "
        r"bfloat16, float16, "
        r"float64 \(converted to float32 once\)",
    ),
    (
        lambda d: _checkpoint(d, {**_mlp(), "head.bias": np.ones(10, bool)}),
        r"tensor head.bias has dtype bool; parameters must be",
    ),
]
CHECKPOINT_VALUES = [  # or whose values a model cannot start from
    (
        lambda d: _checkpoint(d, {**_mlp(), "head.bias": np.full(10, np.nan, np.float32)}),
        r"ckpt.safetensors: tensor head.bias holds 10 NaN and 0 infinite values; parameters must "
        r"be finite",
    ),
    (
        lambda d: _checkpoint(d, {**_mlp(), "head.bias": np.full(10, 1e300)}),
        r"tensor head.bias holds 10 float64 values beyond float32's range; parameters must be "
        r"finite in float32",
    ),
]
CHECKPOINT_FILES = [  # or that is not a safetensors file
    (
        lambda d: [
            "--spec",
            "mlp-tiny",
            "--checkpoint",
            f"canonical:{_write(d / 'x.safetensors', b'not a checkpoint')}",
        ],
        r"checkpoint .*x.safetensors is not a readable safetensors file: its header claims \d+ "
        r"bytes; the file has 16",
    ),
    (
        lambda d: _truncated(d),
        r"ckpt.safetensors is not a readable safetensors file: tensor \S+ lies outside the file "
        r".*truncated\?",
    ),
]
REFUSED = [
    pytest.param(a, m, marks=mark, id=f"{mark.args[0]}-{i}")
    for mark, cases in (
        (pytest.mark.error_case("spec-file-shape"), SPEC_SHAPES),
        (pytest.mark.error_case("tolerance-file-shape"), TOLERANCE_SHAPES),
        (pytest.mark.error_case("tolerance-file-value"), TOLERANCE_VALUES),
        (pytest.mark.error_case("record-not-ours"), RECORDS),
        (pytest.mark.error_case("checkpoint-dtype"), CHECKPOINT_DTYPES),
        (pytest.mark.error_case("checkpoint-nonfinite"), CHECKPOINT_VALUES),
        (pytest.mark.error_case("checkpoint-canonical-unreadable"), CHECKPOINT_FILES),
    )
    for i, (a, m) in enumerate(cases)
]


@pytest.mark.parametrize("args, message", REFUSED)
def test_malformed_inputs_are_one_line_exit_2_before_any_backend(tmp_path, args, message):
    out = tmp_path / "run"
    proc = compare("--backend", "jax,torch", "--out", str(out), *args(tmp_path))
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert re.search(message, one_error(proc)), one_error(proc)
    assert not out.exists()  # refused before a run directory, a backend or a temporary file


@pytest.mark.error_case("set-twin-hparam-shape")
def test_set_of_a_twin_hyperparameter_that_is_not_a_plain_value(tmp_path):
    from common.spec import RunSpec, SpecError, TwinSpec
    from common.spec.parse import apply_overrides

    spec = RunSpec(
        model=TwinSpec(
            twin="t.py:net",
            task="classification",
            hparams={"input_shape": 4, "num_classes": 2, "act": None, "widths": [0.5, 0.25]},
        )
    )
    with pytest.raises(SpecError) as err:
        apply_overrides(spec, ["model.act=relu"])
    assert str(err.value) == (
        "--set model.act: hyperparameter 'act' of twin t.py:net is None (null); --set reaches "
        "numbers, booleans, strings and lists of integers: change it in the twin's hparams "
        "instead"
    )
    with pytest.raises(
        SpecError, match=r"hyperparameter 'widths' of twin t.py:net is \[0.5, 0.25\] \(a list\)"
    ):
        apply_overrides(spec, ["model.widths=1,2"])
    assert apply_overrides(spec, ["model.num_classes=3"]).model.hparams["num_classes"] == 3


# --- non-finite values compared by rule (in this process, numpy only) ---


@pytest.mark.error_case("values-masked-inf")
def test_equal_non_finite_values_are_equal_and_add_no_error():
    logits = np.random.default_rng(0).standard_normal((4, 8, 6)).astype(np.float32)
    logits[..., -1] = -np.inf  # a masked class, on both sides
    other = logits + np.float32(1e-7) * (logits != -np.inf)
    error = tensor_error(logits, other, 1e-5, 1e-4, ("jax", "torch"))
    assert (
        error["within"]
        and error["nonfinite"] == {"equal": 32, "mismatched": 0}
        and "note" not in error
    )
    assert 0 < error["abs"] < 1e-6 and math.isfinite(error["rel"])  # over the finite pairs only
    nan = np.array([1.0, np.nan, np.inf, -np.inf])  # NaN against NaN at one position: equal too
    assert tensor_error(nan, nan.copy(), 0, 0)["within"]
    masked_everywhere = np.full((2, 3), -np.inf)
    assert tensor_error(masked_everywhere, masked_everywhere, 0, 0) == {
        "abs": 0.0,
        "rel": 0.0,
        "tolerance_used": 0.0,
        "within": True,
        "over": 0,
        "elements": 0,
        # no finite value: no relative change
        "sensitivity": None,
        "nonfinite": {"equal": 6, "mismatched": 0},
    }
    # masked entries: probability 0 on both sides, 0 KL
    agreement = distribution.logit_agreement(logits, other)
    assert agreement["top1"] == 1.0 and 0 <= agreement["kl_max"] < 1e-10
    a, b = _records(2.0, 2.0)
    verdict = parity.check_parity(
        a, b, {"outputs": {"logits": logits}}, {"outputs": {"logits": other}}, _policy(), []
    )
    assert verdict["passed"] and verdict["distribution"]["within"]
    json.dumps(strict_json(verdict), allow_nan=False)


@pytest.mark.error_case("values-nonfinite-mismatch")
def test_a_non_finite_value_on_one_side_fails_its_tensor_and_is_counted():
    ref = np.zeros((2, 5))
    ref[:, 4] = -np.inf
    other = np.zeros((2, 5))
    other[0, 4] = -np.inf  # one masked position finite on the other side
    other[1, 0] = np.nan
    other[0, 0] = np.inf
    error = tensor_error(ref, other, 1e-5, 1e-4, ("jax", "torch"))
    assert not error["within"] and error["tolerance_used"] is None  # unmeasurable: ranked first
    assert error["note"] == (
        "1 element is -inf on jax and finite on torch; 1 element is finite on jax and inf on "
        "torch; 1 element is finite on jax and nan on torch"
    )
    assert error["nonfinite"] == {"equal": 1, "mismatched": 3} and error["abs"] == 0.0
    ref3, other3 = np.full(3, -np.inf), np.zeros(3)
    assert (
        tensor_error(ref3, other3, 1, 1)["note"]
        == "3 elements are -inf on the reference and finite on the other side"
    )
    a, b = _records(2.0, 2.0)
    verdict = parity.check_parity(
        a, b, {"outputs": {"logits": ref}}, {"outputs": {"logits": other}}, _policy(), []
    )
    assert (
        not verdict["passed"]
        and verdict["first_divergent_step"] == 0
        and verdict["distribution"] is None
    )
    assert verdict["worst"][0]["name"] == "outputs/logits"
    assert messages.failure_message("torch", verdict) == (
        "torch: parity failed: first divergent step 0; worst tensor outputs/logits (1 element is "
        "-inf on jax and "
        "finite on torch; 1 element is finite on jax and inf on torch; 1 element is finite on jax "
        "and nan on "
        "torch, within=False)"
    )


def _records(*losses):
    spec = load_spec("mlp-tiny", [f"train.steps={len(losses)}"])
    steps = [StepRecord(i, v, 1.0) for i, v in enumerate(losses)]
    return [
        RunRecord(
            backend=n,
            spec=spec.to_dict(),
            steps=steps,
            run_id="r1",
            numerics={"dtype": "float32", "matmul_precision": "highest"},
        )
        for n in ("jax", "torch")
    ]


# --- the report: strict JSON, written whole whatever part fails ---


@pytest.mark.error_case("report-nonfinite-number")
def test_non_finite_numbers_are_strings_by_one_rule_and_the_report_is_checked():
    problems = []
    clean = strict_json(
        {
            "t": math.inf,
            "p": [math.nan, -math.inf, 1.5],
            "n": np.float32(2.5),
            "i": np.int64(3),
            "a": np.array([1.0, np.inf]),
            "path": Path("x"),
            "obj": object(),
        },
        "report",
        problems,
    )
    assert (
        clean["t"] == "inf"
        and clean["p"] == ["nan", "-inf", 1.5]
        and clean["n"] == 2.5
        and clean["i"] == 3
    )
    assert (
        clean["a"] == [1.0, "inf"] and clean["path"] == "x" and clean["obj"].startswith("<object")
    )
    assert problems == [
        {"part": "report.obj", "why": "object is not a JSON value: kept as its repr"}
    ]
    report = {"status": ReportStatus.OK, "exit_code": ExitCode.OK, "statistical": {"t": -math.inf}}
    assert strict_report(report) is report and report["statistical"]["t"] == "-inf"
    assert json.loads(json.dumps(report, allow_nan=False))["exit_code"] == 0
    assert float(report["statistical"]["t"]) == -math.inf  # float() reads it back


def _finished_runs(out: Path, logits: dict) -> dict:
    from compare.runs.orchestrate import BackendRun

    runs = {}
    for record in _records(2.0, 1.5):
        record.tensors = write_tensors(
            out / record.backend, {"outputs": {"logits": logits[record.backend]}}
        )
        write_record(out / record.backend, record)
        runs[record.backend] = BackendRun(
            record.backend, out / record.backend, BackendStatus.OK, 0, "", 1.0, ["x"]
        )
    return runs


def _report(spec, runs, out):
    return build_report(
        ReportInputs(spec, _policy(), ["jax", "torch"], "jax", out, "r1"), runs, False
    )


@pytest.mark.error_case("report-part-fails")
def test_a_part_that_cannot_be_built_leaves_every_file_and_the_verdicts_code(
    tmp_path, monkeypatch, capsys
):
    from compare.__main__ import write_report
    from compare.reporting.plots import PLOT_FILES

    logits = np.zeros((4, 3), np.float32)
    runs = _finished_runs(tmp_path, {"jax": logits, "torch": logits})
    spec = load_spec("mlp-tiny", ["train.steps=2"])

    def broken(*args, **kwargs):
        raise TypeError("unsupported format string passed to NoneType.__format__")

    # no verdict: exit 6, still written
    monkeypatch.setattr("compare.reporting.report.check_parity", broken)
    report = _report(spec, runs, tmp_path)
    assert (
        report["status"] == ReportStatus.INTERNAL_ERROR
        and report["exit_code"] == ExitCode.INTERNAL == 6
    )
    assert report["not_built"] == [
        {
            "part": "parity.torch",
            "why": "TypeError: unsupported format string passed to NoneType.__format__",
        }
    ]
    assert (
        "could not build parity.torch (TypeError" in report["message"] and report["parity"] is None
    )
    assert "warning: report: parity.torch could not be built" in capsys.readouterr().err
    write_report(report, tmp_path)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["exit_code"] == 6 and written["not_built"][0]["part"] == "parity.torch"
    assert "Not built, and why" in (tmp_path / "report.md").read_text()
    assert {"loss.png", "step_time.png"} <= {p.name for p in tmp_path.iterdir()}
    # a backend's tensors unread: no pass either
    monkeypatch.setattr("compare.reporting.evidence.read_tensors", broken)
    report = _report(spec, runs, tmp_path)
    assert report["exit_code"] == 6 and [p["part"] for p in report["not_built"]] == [
        "backends.jax",
        "backends.torch",
    ]
    monkeypatch.undo()

    # a plot that cannot be drawn: the verdict is made (pass), the report
    # and the other plots are written
    monkeypatch.setattr("compare.reporting.plots._loss_plot", broken)
    report = _report(spec, runs, tmp_path)
    # a value added after build_report: made strict before any write
    report["statistical"] = {"t": math.inf}
    for name in ("report.json", "report.md", *PLOT_FILES):
        (tmp_path / name).unlink(missing_ok=True)
    write_report(report, tmp_path)
    written = json.loads((tmp_path / "report.json").read_text())
    assert (
        written["status"] == "ok"
        and written["exit_code"] == 0
        and written["statistical"]["t"] == "inf"
    )
    assert written["not_built"] == [
        {
            "part": "plots.loss.png",
            "why": "TypeError: unsupported format string passed to NoneType.__format__",
        }
    ]
    assert written["plots"] == ["loss_diff.png", "step_time.png"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "loss_diff.png",
        "report.json",
        "report.md",
        "step_time.png",
    ]

    # the tables render what they can: a value of a shape they do not expect says so in its place
    from compare.reporting.render import markdown

    report["parity"]["torch"]["tensors"] = {"outputs/logits": "???"}
    text = markdown(report)
    assert "parity: could not be rendered" in text and "Compiles" in text


# --- a checkpoint's dtype: one meaning on every backend ---


@pytest.mark.error_case("checkpoint-converted")
def test_float16_bfloat16_float64_checkpoints_are_converted_once_in_common(tmp_path):
    from common.weights.carried import start_info

    model = load_spec("mlp-tiny").model
    params = init_params(model, 0)
    halves = {k: v.astype(np.float16) for k, v in params.items()}
    save_checkpoint(tmp_path / "f16.safetensors", halves)
    loaded = load_checkpoint(tmp_path / "f16.safetensors", model)
    assert all(
        loaded[k].dtype == np.float32 and np.array_equal(loaded[k], halves[k].astype(np.float32))
        for k in params
    )
    save_checkpoint(
        tmp_path / "f64.safetensors", {k: v.astype(np.float64) for k, v in params.items()}
    )
    assert all(
        np.array_equal(load_checkpoint(tmp_path / "f64.safetensors", model)[k], params[k])
        for k in params
    )
    import torch

    # bfloat16, which numpy (and safetensors.numpy) cannot read
    from safetensors.torch import save_file

    save_file(
        {k: torch.from_numpy(v).bfloat16() for k, v in params.items()},
        str(tmp_path / "bf16.safetensors"),
    )
    bf16 = load_checkpoint(tmp_path / "bf16.safetensors", model)
    assert all(
        np.array_equal(bf16[k], torch.from_numpy(v).bfloat16().float().numpy())
        for k, v in params.items()
    )
    info = start_info(f"canonical:{tmp_path / 'f16.safetensors'}", 0.1)
    assert info["converted"].startswith("checkpoint float16 -> float32 (6 of 6 tensors")
    assert start_info(tmp_path / "bf16.safetensors", 0.1)["converted"].startswith(
        "checkpoint bfloat16 -> float32"
    )
    with pytest.raises(
        CheckpointError, match=r"tensor head.bias has dtype int8; parameters must be float32"
    ):
        from common.weights.checkpoints import float32_of  # the torch side's check is the same rule

        float32_of("head.bias", "int8", "checkpoint x.pt")


# --- end to end: jax and torch ---


@pytest.mark.slow
@pytest.mark.error_case("values-masked-inf")
def test_a_twin_that_masks_a_class_with_minus_inf_passes(tmp_path):
    out = tmp_path / "run"
    proc = compare("--twin", MASKED, "--backend", "jax,torch", "--steps", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (out / "report.json").read_text()
    report = json.loads(text)  # strict JSON: no NaN / Infinity
    assert "Infinity" not in text and "NaN" not in text
    assert report["status"] == "ok" and report["not_built"] == []
    logits = report["parity"]["torch"]["tensors"]["outputs/logits"]
    # 16 rows, 1 masked class
    assert logits["within"] and logits["nonfinite"] == {"equal": 16, "mismatched": 0}
    assert report["parity"]["torch"]["distribution"]["top1"] == 1.0
    assert {"report.md", "loss.png", "loss_diff.png", "step_time.png"} <= {
        p.name for p in out.iterdir()
    }


@pytest.mark.slow
@pytest.mark.error_case("checkpoint-converted", "checkpoint-dtype")
def test_a_float16_checkpoint_starts_jax_and_torch_alike_and_an_int32_one_is_refused(tmp_path):
    params = init_params(load_spec("mlp-tiny").model, 0)
    save_checkpoint(
        tmp_path / "f16.safetensors", {k: v.astype(np.float16) for k, v in params.items()}
    )
    out = tmp_path / "run"
    proc = compare(
        "--spec",
        "mlp-tiny",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
        "--checkpoint",
        f"canonical:{tmp_path / 'f16.safetensors'}",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    jax, torch = (report["backends"][n]["losses"] for n in ("jax", "torch"))
    # both in float32
    assert all(math.isfinite(v) for v in jax + torch) and abs(jax[0] - torch[0]) < 1e-5
    for name in ("jax", "torch"):
        converted = report["backends"][name]["extra"]["start"]["converted"]
        assert converted.startswith("checkpoint float16 -> float32 (6 of 6 tensors")
    save_checkpoint(
        tmp_path / "i32.safetensors", {k: (v * 100).astype(np.int32) for k, v in params.items()}
    )
    refused = compare(
        "--spec",
        "mlp-tiny",
        "--backend",
        "jax,torch",
        "--steps",
        "2",
        "--checkpoint",
        f"canonical:{tmp_path / 'i32.safetensors'}",
        "--out",
        str(tmp_path / "refused"),
    )
    assert refused.returncode == 2 and "has dtype int32; parameters must be float32" in one_error(
        refused
    )
    assert not (tmp_path / "refused").exists()  # before any backend ran
