"""Files the toolkit opens or writes, when they are not what it expects: the real CLIs in
subprocesses.

`python -m compare.convert --to` never removes or replaces what the user had (refused, exit 2, every
byte where it was); a checkpoint of ours is replaced only with --overwrite, and only its own entries
go; a failed write is exit 7 with the target as it was. A file read (spec, tolerance, data,
checkpoint, record, HLO) that is a FIFO, a device or a directory is one line and exit 2, never a
hang; `python -m compare.hlo` refuses what is not HLO.
"""

import os
import random
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from common.data.targets import MARKER
from common.files.fsutil import dangerous_dir, require_regular_file
from common.presets import load_spec
from common.weights import init_params, save_checkpoint
from tests.helpers import REPO, run_cli

UMASK = os.umask(0o022)
os.umask(UMASK)
TIMEOUT = 120  # a FIFO read would block forever: the test fails on the timeout instead of hanging
# any file over 100 KiB fails with EFBIG, as a full disk with ENOSPC
DISK_FULL = "trap '' XFSZ; ulimit -f 200"
WRITE_FAILED = (
    "(disk full, or a path that cannot be written); nothing was written: free space or give "
    "another "
    "target"
)


def cli(module: str, *args: str, **kwargs):
    return run_cli(module, *args, timeout=TIMEOUT, **kwargs)


def only_error(proc, code: int) -> str:
    """The one line on stderr (an `error:` line, no traceback, nothing else), after checking the
    exit code."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), (
        proc.returncode,
        proc.stderr[-3000:],
    )
    return lines[0].removeprefix("error: ")


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under `top` (not following links): its kind, and a file's bytes and mode."""
    out = {}
    for root, dirs, files in os.walk(top):
        for path in (Path(root, name) for name in dirs + files):
            mode = path.lstat().st_mode
            out[str(path.relative_to(top))] = (
                ("file", path.read_bytes(), stat.S_IMODE(mode))
                if stat.S_ISREG(mode)
                else ("dir" if stat.S_ISDIR(mode) else "fifo" if stat.S_ISFIFO(mode) else "other",)
            )
    return out


def user_files(top: Path, seed: int, count: int = 12) -> None:
    """A user's own files: random names (some hidden, some nested, spaces) and random bytes."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_ ."
    for i in range(count):
        name = (
            "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 14))).strip(" .") or f"f{i}"
        )
        parts = [f"{name}-{i}"] if i % 3 else [f"dir {i}", f".{name}-{i}"]
        top.joinpath(*parts).parent.mkdir(parents=True, exist_ok=True)
        top.joinpath(*parts).write_bytes(rng.randbytes(rng.randint(0, 5000)))
    (top / ".hidden").write_text("the user's notes\n")
    (top / "empty-dir").mkdir()


def canonical(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A gpt-tiny canonical checkpoint written without any framework."""
    params = init_params(load_spec("gpt-tiny").model, seed)
    save_checkpoint(path, params)
    return params


def convert(*args: str, **kwargs):
    return cli("compare.convert", "--spec", "gpt-tiny", *args, **kwargs)


def our_checkpoint(tmp_path: Path, seed: int = 0) -> Path:
    source = tmp_path / f"src-{seed}.safetensors"
    canonical(source, seed)
    target = tmp_path / "ours"
    proc = convert("--from", f"canonical:{source}", "--to", f"orbax:{target}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(os.listdir(target)) == [MARKER, "state"]
    return target


def restored(tmp_path: Path, orbax: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    back = tmp_path / f"back-{len(list(tmp_path.glob('back-*')))}.safetensors"
    proc = convert("--from", f"orbax:{orbax}", "--to", f"canonical:{back}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_file(str(back))


def no_temporaries(parent: Path) -> None:
    assert not [
        p.name for p in parent.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")
    ]


# -- convert --to: what it writes into
# --------------------------------------------------------------------------


@pytest.mark.error_case("convert-to-dangerous")
@pytest.mark.parametrize("where", [".", "..", "/", "checkout", "home", "home-tilde"])
def test_a_dangerous_target_directory_is_refused_whatever_it_holds(tmp_path, where):
    canonical(tmp_path / "src.safetensors")
    home = tmp_path / "home"
    home.mkdir()
    user_files(home, seed=7)
    target = {"checkout": str(REPO), "home": str(home), "home-tilde": "~"}.get(where, where)
    watched = {".": REPO, "..": REPO.parent, "/": Path("/"), "checkout": REPO}.get(where, home)
    names = set(os.listdir(watched))
    before = snapshot(home)
    proc = convert(
        "--from",
        f"canonical:{tmp_path / 'src.safetensors'}",
        "--to",
        f"orbax:{target}",
        "--overwrite",
        env={"HOME": str(home)},
    )
    why = {
        ".": "is this toolkit's checkout",
        "..": "is a parent of this toolkit's checkout",
        "/": "is the filesystem root",
        "checkout": "is this toolkit's checkout",
    }.get(where, "is the home directory")
    assert (
        only_error(proc, 2) == f"--to orbax:{target}: {why}; give a new or empty directory, e.g. "
        "runs/my-checkpoint"
    )
    assert snapshot(home) == before
    # (others may write in the checkout meanwhile: nothing of ours)
    new = set(os.listdir(watched)) - names
    assert MARKER not in new and "state" not in new and not [n for n in new if n.endswith(".tmp")]


@pytest.mark.error_case("convert-to-foreign-dir")
@pytest.mark.parametrize(
    "kind", ["user-files", "hidden-only", "orbax-of-someone-else", "hostile-marker"]
)
def test_a_directory_of_the_users_files_is_never_touched(tmp_path, kind):
    """The required case: a directory full of the user's own files (random names and bytes) stays
    byte for byte."""
    canonical(tmp_path / "src.safetensors")
    target = tmp_path / "project"
    target.mkdir()
    if kind == "user-files":
        user_files(target, seed=11)
    elif kind == "hidden-only":
        (target / ".git").mkdir()
        (target / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    # an orbax checkpoint this toolkit did not write (no marker)
    elif kind == "orbax-of-someone-else":
        (target / "state" / "d").mkdir(parents=True)
        (target / "state" / "_METADATA").write_bytes(os.urandom(300))
        (target / "state" / "d" / "chunk").write_bytes(os.urandom(3000))
    else:  # a marker that would make us remove what is not ours
        (target / MARKER).write_text(
            '{"written_by": "xla-twins", "entries": ["../victim", "/etc"]}'
        )
        (target / "keep.txt").write_text("mine")
    before, around = snapshot(target), sorted(os.listdir(tmp_path))
    for extra in ([], ["--overwrite"]):
        proc = convert(
            "--from", f"canonical:{tmp_path / 'src.safetensors'}", "--to", f"orbax:{target}", *extra
        )
        message = only_error(proc, 2)
        assert message.startswith(f"--to orbax:{target}: {target} is not empty (holds ")
        assert message.endswith(
            ") and is not a checkpoint this toolkit wrote; give a new or empty directory"
        )
        assert snapshot(target) == before
        assert sorted(os.listdir(tmp_path)) == around


@pytest.mark.slow
def test_a_new_or_empty_directory_receives_the_checkpoint(tmp_path):
    params = canonical(source := tmp_path / "src.safetensors", seed=3)
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new" / "nested"):
        proc = convert("--from", f"canonical:{source}", "--to", f"orbax:{target}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert sorted(os.listdir(target)) == [MARKER, "state"]
        assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~UMASK  # not mkdtemp's private 0700
        no_temporaries(target.parent)
    back = restored(tmp_path, tmp_path / "empty")
    assert sorted(back) == sorted(params) and all(
        np.array_equal(back[k], params[k]) for k in params
    )


@pytest.mark.slow
@pytest.mark.error_case("convert-to-own-checkpoint")
def test_our_checkpoint_is_replaced_only_with_overwrite_and_only_its_own_entries(tmp_path):
    target = our_checkpoint(tmp_path, seed=0)
    user_files(target, seed=5)  # the user's files beside our checkpoint
    mine = {
        k: v for k, v in snapshot(target).items() if not (k == MARKER or k.split("/")[0] == "state")
    }
    before = snapshot(target)
    source = tmp_path / "src-1.safetensors"
    params = canonical(source, seed=1)
    proc = convert("--from", f"canonical:{source}", "--to", f"orbax:{target}")
    assert only_error(proc, 2) == (
        f"--to orbax:{target}: {target} already holds a checkpoint this toolkit wrote; "
        "pass --overwrite to replace it, or give another directory"
    )
    assert snapshot(target) == before
    proc = convert("--from", f"canonical:{source}", "--to", f"orbax:{target}", "--overwrite")
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = snapshot(target)
    assert {k: v for k, v in after.items() if k in mine} == mine  # every user file, byte for byte
    assert set(after) - set(mine) - {MARKER} == {k for k in after if k.split("/")[0] == "state"}
    no_temporaries(tmp_path)
    back = restored(tmp_path, target)
    assert all(np.array_equal(back[k], params[k]) for k in params)


@pytest.mark.error_case("convert-to-existing-file")
@pytest.mark.parametrize(
    "fmt,name",
    [("canonical", "w.safetensors"), ("torch", "model.pt"), ("torch", "model.safetensors")],
)
def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path, fmt, name):
    source = tmp_path / "src.safetensors"
    canonical(source, seed=2)
    work = tmp_path / "work"
    work.mkdir()
    user_files(work, seed=3)
    (work / name).write_bytes(b"the user's own model, not ours")
    before = snapshot(work)
    proc = convert("--from", f"canonical:{source}", "--to", f"{fmt}:{work / name}")
    assert only_error(proc, 2) == (
        f"--to {fmt}:{work / name}: {work / name} already exists; pass --overwrite to "
        "replace it, or give another file"
    )
    assert snapshot(work) == before
    # (the torch side's replacement is the same code: common.data.targets.file_target)
    if fmt == "canonical":
        proc = convert(
            "--from", f"canonical:{source}", "--to", f"{fmt}:{work / name}", "--overwrite"
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        after = snapshot(work)
        assert after[name][0] == "file" and after[name][1] != before[name][1]
        assert {k: v for k, v in after.items() if k != name} == {
            k: v for k, v in before.items() if k != name
        }


@pytest.mark.error_case("convert-to-wrong-kind")
@pytest.mark.parametrize(
    "fmt,kind", [("canonical", "dir"), ("torch", "fifo"), ("orbax", "file"), ("orbax", "fifo")]
)
def test_a_target_of_the_wrong_kind_is_refused_even_with_overwrite(tmp_path, fmt, kind):
    canonical(tmp_path / "src.safetensors")
    target = tmp_path / ("thing.pt" if fmt == "torch" else "thing")
    if kind == "dir":
        target.mkdir()
        (target / "a").write_text("a")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.write_text("a user's file")
    before = snapshot(tmp_path)
    proc = convert(
        "--from",
        f"canonical:{tmp_path / 'src.safetensors'}",
        "--to",
        f"{fmt}:{target}",
        "--overwrite",
    )
    what = {"dir": "a directory", "fifo": "not a regular file (a FIFO)", "file": "a file"}[kind]
    want = (
        ", not a directory; give a new or empty directory"
        if fmt == "orbax"
        else "; give the path of a file to write"
    )
    assert only_error(proc, 2) == f"--to {fmt}:{target}: {target} is {what}{want}"
    assert snapshot(tmp_path) == before


@pytest.mark.slow
@pytest.mark.error_case("convert-write-fails")
@pytest.mark.parametrize(
    "case",
    [
        "canonical",
        "torch-pt",
        "torch-safetensors",
        "orbax",
        "orbax-overwrite",
        "canonical-overwrite",
        "under-a-file",
        "orbax-under-a-file",
    ],
)
def test_a_write_that_fails_is_exit_7_and_leaves_the_target_as_it_was(tmp_path, case):
    source = tmp_path / "src.safetensors"
    canonical(source, seed=4)
    work = tmp_path / "work"
    work.mkdir()
    user_files(work, seed=9)
    extra, prefix = [], DISK_FULL
    target = {
        "canonical": "new.safetensors",
        "torch-pt": "new.pt",
        "torch-safetensors": "t.safetensors",
        "orbax": "ckpt",
        "canonical-overwrite": "old.safetensors",
        "under-a-file": "a-file/new.safetensors",
        "orbax-under-a-file": "a-file/ckpt",
    }.get(case)
    fmt = "orbax" if "orbax" in case else "torch" if case.startswith("torch") else "canonical"
    if case == "orbax-overwrite":
        shutil.move(our_checkpoint(tmp_path, seed=0), work / "ckpt")
        target, extra = "ckpt", ["--overwrite"]
    elif case == "canonical-overwrite":
        canonical(work / target, seed=5)
        extra = ["--overwrite"]
    elif "under-a-file" in case:
        (work / "a-file").write_text("a file where the target needs a directory")
        prefix = ""
    before = snapshot(work)
    proc = convert(
        "--from",
        f"canonical:{source}",
        "--to",
        f"{fmt}:{work / target}",
        *extra,
        shell_prefix=prefix,
    )
    why = f"Not a directory: {work / 'a-file'}" if "under-a-file" in case else "File too large"
    assert (
        only_error(proc, 7)
        == f"cannot write the checkpoint to {work / target}: {why} {WRITE_FAILED}"
    )
    assert snapshot(work) == before  # no temporary, no half file, the old target whole
    no_temporaries(tmp_path)


# -- every file the toolkit reads: a FIFO, a device or a directory is one line, never a hang
# ------------------------


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _dir(path: Path) -> Path:
    return path.mkdir(parents=True) or path


# (id, module, argv from the directory of the test, the message after `error:
# ` with {d} for that directory)
READS = [
    (
        "spec-fifo",
        "compare",
        lambda d: ["--spec", str(_fifo(d / "spec.json"))],
        "spec file {d}/spec.json is not a regular file (a FIFO); give a file",
    ),
    (
        "spec-dir",
        "compare",
        lambda d: ["--spec", str(_dir(d / "spec.toml"))],
        "spec file {d}/spec.toml is not a regular file (a directory); give a file",
    ),
    (
        "spec-fifo-backend",
        "jax_impl",
        lambda d: ["--spec", str(_fifo(d / "spec.json"))],
        "spec file {d}/spec.json is not a regular file (a FIFO); give a file",
    ),
    (
        "tolerance-fifo",
        "compare",
        lambda d: ["--spec", "mlp-tiny", "--tolerance-profile", str(_fifo(d / "tol.json"))],
        "--tolerance-profile {d}/tol.json is not a regular file (a FIFO); give a file",
    ),
    (
        "tolerance-device",
        "compare",
        lambda d: ["--spec", "mlp-tiny", "--tolerance-profile", "/dev/zero"],
        "--tolerance-profile /dev/zero is not a regular file (a character device); give a file",
    ),
    (
        "tokens-fifo",
        "compare",
        lambda d: [
            "--spec",
            "gpt-tiny",
            "--set",
            "data.dataset=tokens-file",
            "--set",
            f"data.path={_fifo(d / 'train.bin')}",
        ],
        "tokens file {d}/train.bin is not a regular file (a FIFO); give a file",
    ),
    (
        "tokens-device",
        "compare",
        lambda d: [
            "--spec",
            "gpt-tiny",
            "--set",
            "data.dataset=tokens-file",
            "--set",
            "data.path=/dev/urandom",
        ],
        "tokens file /dev/urandom is not a regular file (a character device); give a file",
    ),
    (
        "arrays-fifo",
        "compare",
        lambda d: [
            "--spec",
            "mlp-tiny",
            "--set",
            "data.dataset=arrays",
            "--set",
            f"data.path={_fifo(d / 'x.npz')}",
        ],
        "arrays file {d}/x.npz is not a regular file (a FIFO); give a file",
    ),
    (
        "canonical-fifo",
        "compare",
        lambda d: ["--spec", "gpt-tiny", "--checkpoint", f"canonical:{_fifo(d / 'w.safetensors')}"],
        "checkpoint {d}/w.safetensors is not a regular file (a FIFO); give a file",
    ),
    (
        "canonical-device",
        "compare",
        lambda d: ["--spec", "gpt-tiny", "--checkpoint", "canonical:/dev/zero"],
        "checkpoint /dev/zero is not a regular file (a character device); give a file",
    ),
    (
        "canonical-dir-convert",
        "compare.convert",
        lambda d: [
            "--spec",
            "gpt-tiny",
            "--from",
            f"canonical:{_dir(d / 'w.safetensors')}",
            "--to",
            f"torch:{d / 'out.pt'}",
        ],
        "checkpoint {d}/w.safetensors is not a regular file (a directory); give a file",
    ),
    (
        "torch-fifo",
        "compare",
        lambda d: ["--spec", "gpt-tiny", "--checkpoint", f"torch:{_fifo(d / 'model.pt')}"],
        "checkpoint {d}/model.pt is not a regular file (a FIFO); give a file",
    ),
    (
        "torch-fifo-convert",
        "compare.convert",
        lambda d: [
            "--spec",
            "gpt-tiny",
            "--from",
            f"torch:{_fifo(d / 'model.pt')}",
            "--to",
            f"orbax:{d / 'out'}",
        ],
        "checkpoint {d}/model.pt is not a regular file (a FIFO); give a file",
    ),
    (
        "hf-config-fifo",
        "compare",
        lambda d: [
            "--spec",
            "gpt-tiny",
            "--checkpoint",
            f"hf:{_fifo(d / 'hf' / 'config.json').parent}",
        ],
        "hf checkpoint file {d}/hf/config.json is not a regular file (a FIFO); give a file",
    ),
    (
        "orbax-inner-fifo",
        "compare.convert",
        lambda d: [
            "--spec",
            "gpt-tiny",
            "--from",
            f"orbax:{_fifo(d / 'ck' / 'state' / '_METADATA').parents[1]}",
            "--to",
            f"canonical:{d / 'out.safetensors'}",
        ],
        "orbax checkpoint file {d}/ck/state/_METADATA is not a regular file (a FIFO); give a file",
    ),
    (
        "record-fifo",
        "compare",
        lambda d: [
            "--spec",
            "mlp-tiny",
            "--backend",
            "jax",
            "--jax-record",
            str(_fifo(d / "rec" / "record.json").parent),
        ],
        "--jax-record: run record {d}/rec/record.json is not a regular file (a FIFO); give a file",
    ),
    (
        "record-fifo-itself",
        "compare",
        lambda d: [
            "--spec",
            "mlp-tiny",
            "--backend",
            "jax",
            "--jax-record",
            str(_fifo(d / "record.json")),
        ],
        "--jax-record: run record {d}/record.json is not a regular file (a FIFO); give a file",
    ),
    (
        "twin-fifo",
        "compare",
        lambda d: ["--twin", f"{_fifo(d / 'twin.py')}:net"],
        "twin '{d}/twin.py:net': {d}/twin.py is not a regular file (a FIFO); give a file",
    ),
    (
        "hlo-fifo",
        "compare.hlo",
        lambda d: [str(_fifo(d / "a.hlo")), str(d / "a.hlo")],
        "{d}/a.hlo is not a regular file or a directory (a FIFO); give a file or a directory",
    ),
    (
        "hlo-device",
        "compare.hlo",
        lambda d: ["/dev/zero", "/dev/zero"],
        "/dev/zero is not a regular file or a directory (a character device); give a file or a "
        "directory",
    ),
    (
        "hlo-record-fifo",
        "compare.hlo",
        lambda d: [str(_fifo(d / "run" / "record.json").parent), str(d / "run")],
        "run record {d}/run/record.json is not a regular file (a FIFO); give a file",
    ),
]


@pytest.mark.slow
@pytest.mark.error_case("input-not-regular-file")
@pytest.mark.parametrize("case,module,argv,message", READS, ids=[r[0] for r in READS])
def test_a_file_that_is_not_a_regular_file_is_refused_not_read(
    tmp_path, case, module, argv, message
):
    d = tmp_path / "in"
    args = argv(d)
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    proc = cli(module, *args, *(["--out", str(out)] if module in ("compare", "jax_impl") else []))
    # a backend alone may print its framework's warnings first: the last line is ours
    if module == "jax_impl":
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1] == f"error: {message.format(d=d)}"
    else:
        assert only_error(proc, 2) == message.format(d=d)
    assert snapshot(tmp_path) == before  # nothing written, no FIFO opened or replaced
    assert not out.exists()  # (a backend alone removes the --out it made when it refuses its input)


# -- python -m compare.hlo given something else than HLO text
# --------------------------------------------------------

NOT_HLO = {
    "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)),
    "json": b'{"report": 1}\n',
    "empty": b"",
    "blank": b"\n\n  \n",
    "binary-after-header": b"HloModule m\n\xff\xfe\x00\xd8",
}


@pytest.mark.error_case("hlo-cli-not-hlo")
@pytest.mark.parametrize("kind", list(NOT_HLO))
def test_hlo_diff_refuses_a_file_that_is_not_hlo_text(tmp_path, kind):
    path = tmp_path / f"program.{kind}"
    path.write_bytes(NOT_HLO[kind])
    good = tmp_path / "good.hlo"
    good.write_text("HloModule m\n\nENTRY main {\n  ROOT p = f32[2]{0} parameter(0)\n}\n")
    for a, b in ((path, good), (good, path)):
        proc = cli("compare.hlo", str(a), str(b))
        assert only_error(proc, 2) == (
            f"{path} is not HLO text (no HloModule header); give an optimized HLO dump "
            "or a run directory"
        )


# -- the two predicates, in process
# ----------------------------------------------------------------------------------


def test_dangerous_dir_and_require_regular_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert dangerous_dir("/") == "is the filesystem root"
    assert dangerous_dir("~") == dangerous_dir(tmp_path / "home") == "is the home directory"
    assert dangerous_dir(".") == "is the current directory"
    assert dangerous_dir(tmp_path.parent) == "is a parent of the current directory"
    assert dangerous_dir(REPO / "common" / "..") == "is this toolkit's checkout"
    assert dangerous_dir(tmp_path / "runs" / "x") is None and dangerous_dir("sub") is None
    (tmp_path / "link").symlink_to(tmp_path)
    assert dangerous_dir(tmp_path / "link") == "is the current directory"  # through a link too
    fifo = _fifo(tmp_path / "f")
    (tmp_path / "file").write_text("x")
    assert require_regular_file(tmp_path / "file", "w") == tmp_path / "file"
    # the caller's open says so
    assert require_regular_file(tmp_path / "missing", "w") == tmp_path / "missing"
    assert require_regular_file(tmp_path, "w", directory_ok=True) == tmp_path
    with pytest.raises(
        LookupError, match=r"^data file .*/f is not a regular file \(a FIFO\); give a file$"
    ):
        require_regular_file(fifo, "data file", LookupError)  # the caller's own error type
    (tmp_path / "to-fifo").symlink_to(fifo)
    with pytest.raises(
        ValueError, match=r"to-fifo is not a regular file or a directory \(a FIFO\)"
    ):
        require_regular_file(tmp_path / "to-fifo", "", directory_ok=True)
