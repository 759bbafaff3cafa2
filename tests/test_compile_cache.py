"""Persistent compile caches: a second run loads what the first compiled, every hit is counted as a
compile (a recompile is never hidden by a hit), and a cache that cannot serve is said to be so."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli, train

pytestmark = pytest.mark.slow


@pytest.mark.error_case("cache-hit-counted")
def test_jax_second_run_hits_for_every_compile_and_keeps_the_recompile(tmp_path):
    cache = tmp_path / "cache"
    args = (
        "--spec",
        "mlp-tiny",
        "--steps",
        "6",
        "--provoke-recompile",
        "input-shape@4",
        "--compile-cache",
        str(cache),
    )
    cold = train("jax_impl", tmp_path / "cold", *args)
    warm = train("jax_impl", tmp_path / "warm", *args)
    assert (
        cold.compile_cache["hits"] == 0
        and cold.compile_cache["misses"] == len(cold.compile_events) > 0
    )
    assert not any(e.cache_hit for e in cold.compile_events)
    # the same compiles at the same steps, each loaded from the cache
    assert [(e.fun_name, e.step, e.phase) for e in warm.compile_events] == [
        (e.fun_name, e.step, e.phase) for e in cold.compile_events
    ]
    assert all(e.cache_hit for e in warm.compile_events)
    assert (
        warm.compile_cache["hits"] == len(warm.compile_events) and warm.compile_cache["misses"] == 0
    )
    # a run of other steps and another lr compiles the same train step (the lr table is an input of
    # it, jax_impl/optim.py): loaded from the cache
    other = train(
        "jax_impl",
        tmp_path / "other",
        *args[:2],
        "--steps",
        "9",
        "--set",
        "train.lr=2e-3",
        *args[-2:],
    )
    steps_compiled = [e for e in other.compile_events if e.fun_name == "jit(_train_step)"]
    assert len(steps_compiled) == 1 and steps_compiled[0].cache_hit, other.compile_events
    # the batch shape change at step 4 is a steady-state recompile in both runs, cause and all
    for rec in (cold, warm):
        steady = [e for e in rec.compile_events if e.phase == "loop" and e.step >= rec.settle_steps]
        assert [e.step for e in steady] == [4]
        assert rec.recompile_causes[0]["kind"] == "input-shape"
        assert "now f32[64,784] and before f32[128,784]" in rec.recompile_causes[0]["framework"]
    assert warm.losses == cold.losses  # a cached executable computes the same bits
    assert sum(e.duration_s for e in warm.compile_events) < sum(
        e.duration_s for e in cold.compile_events
    )
    # the HLO is read from a cached executable too
    assert warm.hlo_stats["flops"] == cold.hlo_stats["flops"] > 0


@pytest.mark.error_case("cache-torch-xla-unreadable")
def test_compare_uses_the_cache_by_default_and_says_what_torch_xla_did(tmp_path):
    cache = tmp_path / "cache"
    flags = (
        "--backend",
        "both",
        "--spec",
        "mlp-tiny",
        "--steps",
        "6",
        "--quiet",
        "--compile-cache",
        str(cache),
    )
    reports, home = [], tmp_path / "home"  # the user's cache folder, where the CPU peak is kept
    # cold: each backend also run again
    for name, more in (("cold", ["--check-determinism"]), ("warm", [])):
        proc = run_cli(
            "compare",
            "--out",
            str(tmp_path / name),
            *flags,
            *more,
            env={"XDG_CACHE_HOME": str(home)},
        )
        assert proc.returncode == 0, proc.stderr
        reports.append(json.loads((tmp_path / name / "report.json").read_text()))
    cold, warm = reports
    # the second run of each gives the same bits (its report entry: the first)
    for name in ("jax", "torch_xla"):
        assert cold["determinism"][name] == {"bitwise_equal": True, "max_abs": 0.0, "steps": 6}
        assert (tmp_path / "cold" / f"{name}-repeat" / "record.json").exists()
    assert warm["compile_cache"] == str(cache)
    jax_cold, jax_warm = cold["backends"]["jax"], warm["backends"]["jax"]
    assert jax_cold["compiles"]["cache_hits"] == 0
    assert (
        jax_warm["compiles"]["cache_hits"]
        == jax_warm["compiles"]["setup"] + jax_warm["compiles"]["loop"]
        > 0
    )
    jax_dir = Path(jax_warm["compile_cache"]["dir"])  # <cache>/<cpu kind>/jax
    assert jax_dir.name == "jax" and jax_dir.parent.parent == cache
    assert jax_dir.parent.name.startswith(platform.machine())
    # torch_xla 2.9 writes its executables but cannot load them back here:
    # counted and said, never claimed
    torch_warm = warm["backends"]["torch_xla"]
    assert torch_warm["compiles"]["cache_hits"] == 0
    assert (
        torch_warm["compile_cache"]["unreadable"]
        == torch_warm["compiles"]["setup"] + torch_warm["compiles"]["loop"]
    )
    assert "could not load its cached executables" in torch_warm["compile_cache"]["note"]
    for name in ("jax", "torch_xla"):
        assert warm["backends"][name]["losses"] == cold["backends"][name]["losses"]
    # the CPU peak measured by the cold run is reused, unless this run measured more (then it is
    # replaced); it is kept in the user's cache folder, not in the compile cache --compile-cache
    # names (a machine's, not a cache's)
    assert (
        "(cached, measured" in jax_warm["peak_source"]
        or jax_warm["peak_flops"] > jax_cold["peak_flops"]
    )
    assert (
        json.loads((home / "xla-twins" / "cpu_peak.json").read_text())["flops"]
        >= jax_warm["peak_flops"]
        > 0
    )
    assert not list(cache.rglob("cpu_peak.json"))
    assert "| of these, persistent-cache hits |" in (tmp_path / "warm" / "report.md").read_text()


def test_no_compile_cache_turns_it_off(tmp_path):
    proc = run_cli(
        "compare",
        "--out",
        str(tmp_path),
        "--backend",
        "jax",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--quiet",
        "--no-compile-cache",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["compile_cache"] is None
    assert report["backends"]["jax"]["compile_cache"] == {"enabled": False}
    # measured afresh, not read from a cache (a busy machine adds why it
    # reads below the run's own rate)
    assert report["backends"]["jax"]["peak_source"].startswith(
        "measured numpy float32 matmul peak of this CPU"
    )
    assert "cached" not in report["backends"]["jax"]["peak_source"]


@pytest.mark.error_case("cache-dir-unusable", "cache-entries-corrupt")
def test_an_unusable_or_corrupt_cache_never_fails_a_run(tmp_path):
    not_a_dir = tmp_path / "cache-file"
    not_a_dir.write_text("not a directory")
    out = tmp_path / "run"
    proc = run_cli(
        "compare",
        "--out",
        str(out),
        "--quiet",
        "--spec",
        "mlp-tiny",
        "--steps",
        "3",
        "--compile-cache",
        str(not_a_dir),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    for name in ("jax", "torch_xla"):
        cache = report["backends"][name]["compile_cache"]
        assert (
            cache["enabled"] is False
            and "is not a usable directory (Not a directory)" in cache["note"]
        )
    # every entry of a filled cache overwritten with garbage: JAX
    # misses and recompiles, the same bits
    cache = tmp_path / "cache"
    args = ("--spec", "mlp-tiny", "--steps", "3", "--compile-cache", str(cache))
    first = train("jax_impl", tmp_path / "first", *args)
    for entry in (p for p in cache.rglob("*") if p.is_file()):
        entry.write_bytes(b"garbage")
    again = train("jax_impl", tmp_path / "again", *args)
    assert again.compile_cache["hits"] == 0 and again.losses == first.losses


def test_the_suites_kept_cache_is_emptied_once_past_its_bound_and_a_users_folder_refused(
    tmp_path, monkeypatch
):
    from tests import helpers

    kept = tmp_path / "kept"
    caches = kept / "xla-twins" / "compile-cache"
    caches.mkdir(parents=True)
    (caches / "entry").write_bytes(b"x" * 100)
    (kept / "xla-twins" / "cpu_peak.json").write_text("{}")
    monkeypatch.setattr(helpers, "CACHE_HOME", str(kept))
    monkeypatch.setattr(helpers, "KEPT_CACHE_BOUND", 100)
    helpers.bound_kept_cache()  # at the bound: kept
    assert (caches / "entry").read_bytes() == b"x" * 100
    monkeypatch.setattr(helpers, "KEPT_CACHE_BOUND", 99)
    helpers.bound_kept_cache()  # past it: the compile caches emptied, nothing else
    assert not caches.exists() and (kept / "xla-twins" / "cpu_peak.json").read_text() == "{}"
    # a folder of someone's files named as the suite's cache: refused, untouched
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-c", "import tests.helpers"],
        cwd=REPO,
        env={**os.environ, "XLA_TWINS_TEST_CACHE_HOME": str(users)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 4 and proc.stderr.strip() == (
        f"error: XLA_TWINS_TEST_CACHE_HOME={users} holds files the suite did not write: name a "
        "new or empty folder (make test TEST_CACHE=...)"
    )
    assert os.listdir(users) == ["notes.txt"] and (users / "notes.txt").read_text() == "mine"
