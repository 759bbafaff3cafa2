"""`--tensors summary`: the parameter-sized tensors kept as statistics and a fixed sample
(common/files/tensor_summary.py), judged on the sample and by what the statistics prove; a correct
pair passes and a perturbed parameter fails, even where the perturbed element is not in the
sample."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from common.files.record import RecordError, read_record
from common.files.tensor_file import read_tensors, write_tensors
from common.files.tensor_summary import (
    LOGIT_ROWS,
    SAMPLE_SIZE,
    TensorSummary,
    sample_indices,
    summarize,
)
from compare.judge.parity import compare_tensors
from compare.judge.tolerances import load_policy
from tests.helpers import run_cli

POLICY = load_policy("default", "float32")


def _groups(tmp_path, name: str, groups: dict, mode: str = "summary") -> dict:
    """`groups` written as a backend writes them in `mode`, and read back as compare reads them."""
    folder = tmp_path / name
    folder.mkdir()
    return read_tensors(folder, SimpleNamespace(tensors=write_tensors(folder, groups, mode)))


def _tensor_file(tmp_path, name: str, params: dict, mode: str) -> dict:
    return _groups(tmp_path, name, {"params": params}, mode)


def test_a_summary_keeps_the_statistics_and_the_same_sample_on_every_side(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 96)).astype(np.float32)
    w[3, 5] = np.inf
    s = summarize("params/w", w)
    finite = w[np.isfinite(w)].astype(np.float64)
    assert s.shape == (128, 96) and s.values.size == SAMPLE_SIZE and s.stats["count"] == w.size
    assert s.stats["nonfinite"] == 1 and s.stats["sum"] == pytest.approx(finite.sum(), rel=1e-12)
    assert s.stats["sum_sq"] == pytest.approx(np.dot(finite, finite), rel=1e-12)
    assert s.stats["max_abs"] == float(np.abs(finite).max())
    # the name decides, not the values
    assert np.array_equal(s.indices, sample_indices("params/w", w.shape))
    assert np.array_equal(s.values, w.reshape(-1)[s.indices])
    assert not np.array_equal(sample_indices("params/v", w.shape), s.indices)
    # through the tensor file: a tensor no larger than the sample stays
    # whole; a larger one is its summary
    small = np.arange(SAMPLE_SIZE, dtype=np.float32)
    read = _tensor_file(tmp_path, "run", {"w": w, "small": small}, "summary")["params"]
    assert isinstance(read["w"], TensorSummary) and read["w"].stats == s.stats
    assert np.array_equal(read["w"].indices, s.indices) and np.array_equal(read["small"], small)
    # 2 MiB kept as 4,096 values and indices: 32 KiB and its headers
    big = np.zeros((1024, 512), np.float32)
    _tensor_file(tmp_path, "big", {"big": big}, "summary")
    assert (tmp_path / "big" / "tensors.npz").stat().st_size < 0.02 * big.nbytes


# the other side kept whole: summarized to compare
@pytest.mark.parametrize("mode", ["summary", "full"])
def test_a_correct_pair_passes_and_a_perturbed_parameter_fails(tmp_path, mode):
    rng = np.random.default_rng(1)
    # 16,384 elements; fp32's params bound: 5e-3 + 1e-2 max|w|
    w = rng.standard_normal((256, 64)).astype(np.float32)
    ref = _tensor_file(tmp_path, "ref", {"w": w}, "summary")
    unsampled = np.setdiff1d(np.arange(w.size), sample_indices("params/w", w.shape))[17]
    outlier = w.copy()
    # one element, not in the sample, beyond every other magnitude
    outlier.reshape(-1)[unsampled] = 9.0
    cases = {
        "close": (w + rng.uniform(-1e-6, 1e-6, w.shape).astype(np.float32), True),
        # a whole tensor off
        "noisy": (w + rng.normal(0, 0.1, w.shape).astype(np.float32), False),
        "outlier": (outlier, False),
    }
    found = {}
    for name, (other, within) in cases.items():
        entry = compare_tensors(
            ref,
            _tensor_file(tmp_path, f"{name}-{mode}", {"w": other}, mode),
            POLICY,
            ("jax", "torch"),
        )["params/w"]
        assert (
            entry["judged_by"] == "summary"
            and entry["sampled"] == f"{SAMPLE_SIZE} of 16384 elements"
        )
        assert entry["within"] is within, (name, entry)
        found[name] = entry
    # the noisy tensor fails on its sample; the outlier only by the largest magnitude,
    # which is also the lower bound the entry gives of the whole tensor's error
    assert found["noisy"]["over"] > 2000
    assert (
        found["outlier"]["over"] == 0
        and not found["outlier"]["summary_checks"]["max_abs"]["within"]
    )
    assert "its whole-tensor statistics leave the bound: max_abs" in found["outlier"]["note"]
    true_error = abs(9.0 - w.reshape(-1)[unsampled])
    assert found["outlier"]["abs"] == pytest.approx(9.0 - np.abs(w).max(), rel=1e-6)
    assert found["outlier"]["abs"] <= true_error


def test_a_summary_that_sampled_other_elements_is_never_judged_equal(tmp_path):
    w = np.ones((100, 100), np.float32)
    a, b = summarize("params/w", w), summarize("params/w", w)
    b = TensorSummary(b.shape, b.stats, b.indices[::-1].copy(), b.values)
    entry = compare_tensors({"params": {"w": a}}, {"params": {"w": b}}, POLICY)["params/w"]
    assert entry["within"] is False and "sampled other elements" in entry["note"]
    # a tensor file whose sample another sampler drew (its indices'
    # checksum) is refused as it is read
    _tensor_file(tmp_path, "run", {"w": w}, "summary")
    with np.load(tmp_path / "run" / "tensors.npz") as npz:
        entries = dict(npz)
    # the count and checksum, not 4,096 indices
    assert entries["params/w@indices"].tolist()[0] == SAMPLE_SIZE
    entries["params/w@indices"] = entries["params/w@indices"] + np.array([0, 1])
    np.savez(tmp_path / "run" / "tensors.npz", **entries)
    with pytest.raises(
        RecordError,
        match=r"the summary of params/w is malformed: its sample is not the one this "
        r"toolkit draws for it",
    ):
        read_tensors(tmp_path / "run", SimpleNamespace(tensors="tensors.npz"))


@pytest.mark.slow
def test_compare_with_summaries_passes_gpt_tiny_and_says_what_was_judged_by_summary(tmp_path):
    proc = run_cli(
        "compare",
        "--quiet",
        "--out",
        str(tmp_path),
        "--backend",
        "jax,torch",
        "--steps",
        "3",
        "--tensors",
        "summary",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    tensors = report["parity"]["torch"]["tensors"]
    summarized = {k for k, v in tensors.items() if v.get("judged_by") == "summary"}
    assert summarized and summarized <= {k for k in tensors if k.startswith(("grads/", "params/"))}
    assert all(
        tensors[k]["within"] and tensors[k]["summary_checks"]["l2_norm"]["within"]
        for k in summarized
    )
    # batch-sized: whole
    assert "outputs/logits" in tensors and "judged_by" not in tensors["outputs/logits"]
    for name in ("jax", "torch"):
        record = read_record(tmp_path / name)
        assert record.extra.tensors == "summary"
        kept = read_tensors(tmp_path / name, record)
        assert {
            f"{g}/{k}"
            for g in ("grads", "params")
            for k, v in kept[g].items()
            if isinstance(v, TensorSummary)
        } == summarized
        assert all(
            v.size > SAMPLE_SIZE
            for g in ("grads", "params")
            for v in kept[g].values()
            if isinstance(v, TensorSummary)
        )


def test_a_tensor_file_read_lazily_gives_what_was_checked_even_if_another_run_replaces_it(tmp_path):
    """compare reads each array when it asks for it (common.files.record.LazyTensors): a run that
    replaces the file meanwhile (written atomically, as every backend writes) cannot slip its values
    into this judgement, since the open file is the one that was checked."""
    first = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    folder = tmp_path / "run"
    folder.mkdir()
    record = SimpleNamespace(tensors=write_tensors(folder, {"params": first}))
    opened = read_tensors(folder, record)
    # another run's, same name
    write_tensors(folder, {"params": {"w": -np.ones((3, 4), np.float32)}})
    assert np.array_equal(opened["params"]["w"], first["w"])
    # a new read: the new file
    assert np.array_equal(read_tensors(folder, record)["params"]["w"], -np.ones((3, 4)))


@pytest.mark.parametrize(
    "argv, mode",
    [
        (["--spec", "gpt2-small"], "auto"),
        (["--spec", "gpt-tiny"], "full"),
        (["--spec", "gpt2-small", "--tensors", "full"], "full"),
    ],
)
def test_the_tensor_mode_defaults_to_auto_above_its_size_and_says_why(argv, mode):
    from compare.__main__ import check_inputs, parse_options
    from compare.runs.second_pass import AUTO_ABOVE_PARAMS, tensor_mode

    _, _, opts = check_inputs(parse_options([*argv, "--backend", "jax,torch"]))
    chosen, opts = tensor_mode(opts)
    assert chosen["mode"] == opts.capture.tensors == mode
    if "--tensors" in argv:
        assert chosen["why"] == "--tensors"
    else:  # gpt2-small: 124,439,808 parameters (GPT-2's 124M, its lm_head tied)
        assert chosen["why"].startswith(
            f"the default {'above' if mode == 'auto' else 'up to'} {AUTO_ABOVE_PARAMS:,} "
        )
        assert ("124,439,808" in chosen["why"]) == (mode == "auto")


def test_large_logits_keep_whole_rows_and_their_distributions_are_judged_on_them(tmp_path):
    """Logits larger than 4 MiB are kept as LOGIT_ROWS whole rows (each a distribution over the
    classes) and their statistics; smaller ones whole. KL and top-1 are judged on the kept rows, the
    same on both sides."""
    from compare.judge.distribution import judge_distribution, logit_agreement

    rng = np.random.default_rng(2)
    logits = rng.standard_normal((8, 256, 600)).astype(np.float32)  # 1,228,800 elements: over 2**20
    shifted = logits + rng.normal(0, 1e-4, logits.shape).astype(np.float32)
    ref, other = (
        _groups(tmp_path, name, {"outputs": {"logits": x}})
        for name, x in (("a", logits), ("b", shifted))
    )
    kept = ref["outputs"]["logits"]
    assert isinstance(kept, TensorSummary) and kept.values.size == LOGIT_ROWS * 600
    rows = np.unique(kept.indices // 600)
    assert rows.size == LOGIT_ROWS and np.array_equal(
        kept.values.reshape(LOGIT_ROWS, 600), logits.reshape(-1, 600)[rows]
    )
    assert (tmp_path / "a" / "tensors.npz").stat().st_size < 0.01 * logits.nbytes
    rows_table = compare_tensors(ref, other, POLICY)
    assert (
        rows_table["outputs/logits"]["judged_by"] == "summary"
        and rows_table["outputs/logits"]["within"]
    )
    agreement = judge_distribution(ref, other, POLICY["distribution"], "float32", rows_table)
    assert (
        agreement["sampled"] == f"{LOGIT_ROWS} of 2048 positions"
        and agreement["positions"] == LOGIT_ROWS
    )
    assert agreement == {
        **logit_agreement(logits.reshape(-1, 600)[rows], shifted.reshape(-1, 600)[rows]),
        "sampled": agreement["sampled"],
        "within": True,
    }
    # 153,600 elements: kept whole
    small = _groups(tmp_path, "c", {"outputs": {"logits": logits[:1]}})
    assert isinstance(small["outputs"]["logits"], np.ndarray)


def test_a_tensor_file_lists_its_tensors_in_the_order_written_whole_or_summarized(tmp_path):
    """Step 0's activations are searched in the order the modules finished: a summary keeps its
    place among the whole tensors (a parent module listed before its summarized child would be
    blamed for the child)."""
    rng = np.random.default_rng(0)
    small, big = (
        rng.normal(size=(4, 8)).astype(np.float32),
        rng.normal(size=(64, 256)).astype(np.float32),
    )
    arrays = {"mlp.fc:in": small, "mlp.fc": big, "mlp.proj": small, "mlp": small, "head": big}
    write_tensors(tmp_path, {"activations": arrays}, "summary")
    read = read_tensors(tmp_path, SimpleNamespace(tensors="tensors.npz"))["activations"]
    assert list(read) == list(arrays) and sorted(read.summaries) == ["head", "mlp.fc"]
