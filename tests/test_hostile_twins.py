"""Hostile twins, through the real CLI (`python -m compare --twin FILE:NAME` in a subprocess): a
twin file that exits, raises, hangs or starts processes while it is imported, declarations that
cannot work, models that cannot be compared, and environment variables selecting a platform this
machine lacks. Each is one `error:` line with a documented exit code, and leaves no run directory,
no temp folder and no process."""

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import PLAIN, REPO, process_env, processes_under, run_cli

MODELS = """
import os
import sys
import time

import torch
from flax import nnx
from torch import nn


class TorchNet(nn.Module):
    def __init__(self, input_shape, hidden, num_classes):
        super().__init__()
        self.fc1 = nn.Linear(input_shape, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class NnxNet(nnx.Module):
    def __init__(self, input_shape, hidden, num_classes, *, rngs):
        self.fc1 = nnx.Linear(input_shape, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, num_classes, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.relu(self.fc1(x)))


# a count first, the logits second: the default (first element) finds no array
class TorchTuple(TorchNet):
    def forward(self, x):
        return len(x), super().forward(x)


class TorchDict(TorchNet):  # no "logits" entry
    def forward(self, x):
        return {"scores": super().forward(x)}


class NnxTuple(NnxNet):
    def __call__(self, x):
        return None, super().__call__(x)


class TorchEmpty(nn.Module):
    def __init__(self, **hparams):
        super().__init__()

    def forward(self, x):
        return x


class NnxEmpty(nnx.Module):
    def __init__(self, *, rngs, **hparams):
        pass

    def __call__(self, x):
        return x


def torch_exits(**hparams):
    sys.exit(0)


def nnx_os_exit(*, rngs, **hparams):
    os._exit(0)


def torch_killed(**hparams):
    os.kill(os.getpid(), 9)


def torch_sleeps(**hparams):
    time.sleep(600)
"""

TWINS = """
import fractions

from common.spec import TrainSpec
from common.twin import Twin

H = {"input_shape": 6, "hidden": 8, "num_classes": 3}
T = TrainSpec(global_batch_size=4, steps=2)


def twin(torch="models.py:TorchNet", nnx="models.py:NnxNet", **fields):
    return Twin(torch=torch, nnx=nnx, task="classification", hparams=fields.pop("hparams", H),
                train=fields.pop("train", T), **fields)


ok = twin()
rename_regex = twin(rename={"(fc": "fc"})
rename_group = twin(rename={r"\\.fc(\\d)": r".layer\\2"})
packed_string = twin(packed={"fc": "fc1"})
packed_list = twin(packed=[("fc", ("fc1", "fc2"))])
packed_nothing = twin(packed={"attn.qkv": ("attn.q", "attn.k", "attn.v")})
rules_flat = twin(partition_rules=(r"fc1\\.kernel", (None, "tensor")))
rules_dict = twin(partition_rules={r"fc1\\.kernel": (None, "tensor")})
rules_regex = twin(partition_rules=((r"fc1\\.kernel[", (None, "tensor")),))
rules_axis = twin(partition_rules=((r"fc1\\.kernel", (None, "model")),))
torch_ref = twin(torch="models.TorchNet")
dtype_arg = twin(nnx_dtype_arg="compute dtype")
train_dict = twin(train={"lr": 1e-3})
init_nnx = twin(init="nnx")
hparams_object = twin(hparams={**H, "scale": fractions.Fraction(1, 2)})
hf_no_type = twin(hf={"prefix": "model."})
hf_unknown_hparam = twin(hf={"model_type": "llama", "config": {"hidden_size": "d_modl"}})
torch_empty = twin(torch="models.py:TorchEmpty")
nnx_empty = twin(nnx="models.py:NnxEmpty")
torch_tuple = twin(torch="models.py:TorchTuple")
torch_dict = twin(torch="models.py:TorchDict")
nnx_tuple = twin(nnx="models.py:NnxTuple")
torch_exits = twin(torch="models.py:torch_exits")
nnx_os_exit = twin(nnx="models.py:nnx_os_exit")
torch_killed = twin(torch="models.py:torch_killed")
torch_sleeps = twin(torch="models.py:torch_sleeps")
"""

# twin files that misbehave while they are imported (each would also define `t`)
IMPORTS = {
    "exit0": "import sys\nsys.exit(0)\n",
    "exit3": "import sys\nsys.exit(3)\n",
    "os_exit": "import os\nos._exit(0)\n",
    "segfault": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
    "raises": "raise ValueError('no config here')\n",
    "sleeps": "import time\ntime.sleep(600)\n",
    # starts a process, then declares a twin that is refused: the process must not outlive compare
    "spawns": "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; "
    "time.sleep(600)', "
    "__file__])\nfrom common.twin import Twin\nt = Twin(torch='models.py:TorchNet', "
    "nnx='models.py:NnxNet', "
    "task='classification', packed={'fc': 'fc1'}, hparams={'input_shape': 6, 'hidden': 8, "
    "'num_classes': 3})\n",
}


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's throwaway project: models.py (torch and NNX), twins.py, and the misbehaving twin
    files."""
    root = tmp_path / "my_port"
    root.mkdir()
    (root / "models.py").write_text(textwrap.dedent(MODELS))
    (root / "twins.py").write_text(textwrap.dedent(TWINS))
    for name, text in IMPORTS.items():
        (root / f"{name}.py").write_text(text)
    (tmp_path / "tmp").mkdir()
    return root


def compare(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 300):
    return run_cli(
        "compare",
        "--quiet",
        *args,
        timeout=timeout,
        env={"TMPDIR": str(tmp_path / "tmp"), **(env or {})},
    )


def assert_refused(tmp_path: Path, proc, message: str, code: int = 2) -> str:
    """One `error:` line matching `message`, exit `code`, and nothing left: no run directory, no
    temp folder, no process."""
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == code and len(errors) == 1 and "Traceback" not in proc.stderr, (
        proc.stderr[-3000:]
    )
    assert re.search(message, errors[0]), errors[0]
    assert not (tmp_path / "run").exists()
    assert not list((tmp_path / "tmp").iterdir()), list((tmp_path / "tmp").iterdir())
    assert not processes_under(tmp_path), processes_under(tmp_path)
    return errors[0]


def run_twin(
    tmp_path: Path,
    project: Path,
    ref: str,
    *args: str,
    env: dict | None = None,
    timeout: float = 300,
):
    return compare(
        tmp_path,
        "--twin",
        f"{project}/{ref}",
        "--backend",
        "jax,torch",
        "--out",
        str(tmp_path / "run"),
        *args,
        env=env,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "ref, message",
    [
        pytest.param(
            "exit0.py:t",
            r"twin '.*exit0.py:t': importing .*exit0.py exited with code 0 before defining the "
            r"twin \(sys.exit at import\?\)$",
            marks=pytest.mark.error_case("twin-import-exits"),
        ),
        pytest.param(
            "exit3.py:t",
            r"importing .*exit3.py exited with code 3 before defining the twin",
            marks=pytest.mark.error_case("twin-import-exits"),
        ),
        pytest.param(
            "os_exit.py:t",
            r"importing .*os_exit.py exited with code 0 before defining the twin",
            marks=pytest.mark.error_case("twin-import-exits"),
        ),
        pytest.param(
            "segfault.py:t",
            r"importing .*segfault.py was killed by SIGSEGV",
            marks=pytest.mark.error_case("twin-import-exits"),
        ),
        pytest.param(
            "raises.py:t",
            r"twin '.*raises.py:t': importing .*raises.py raised ValueError: no config here$",
            marks=pytest.mark.error_case("twin-import-raises"),
        ),
        pytest.param(
            "spawns.py:t",
            r"packed 'fc': 'fc1' is malformed",
            marks=pytest.mark.error_case("twin-import-starts-process"),
        ),
    ],
)
def test_a_twin_file_that_misbehaves_while_imported_is_refused_and_leaves_nothing(
    tmp_path, project, ref, message
):
    assert_refused(tmp_path, run_twin(tmp_path, project, ref), message)


@pytest.mark.error_case("twin-import-hangs")
def test_a_twin_file_that_hangs_while_imported_is_bounded_by_the_timeout(tmp_path, project):
    start = time.monotonic()
    proc = run_twin(tmp_path, project, "sleeps.py:t", "--timeout", "5", timeout=90)
    assert_refused(
        tmp_path,
        proc,
        r"twin '.*sleeps.py:t': importing .*sleeps.py did not load within --timeout 5 s",
    )
    assert time.monotonic() - start < 60


@pytest.mark.parametrize(
    "name, message",
    [
        pytest.param(
            "rename_regex",
            r"rename '\(fc' is not a valid regular expression \(missing \), unterminated "
            r"subpattern at position 0\); write rename as",
            marks=pytest.mark.error_case("twin-rename-invalid"),
        ),
        pytest.param(
            "rename_group",
            r"rename '\\\\.fc\(\\\\d\)' -> '.layer\\\\2': the replacement is not valid "
            r"\(invalid group reference 2",
            marks=pytest.mark.error_case("twin-rename-invalid"),
        ),
        pytest.param(
            "packed_string",
            r"packed 'fc': 'fc1' is malformed; packed maps a module to the tuple of the "
            r"two or more modules of the other side",
            marks=pytest.mark.error_case("twin-packed-malformed"),
        ),
        pytest.param(
            "packed_list",
            r"packed is a list, not a dict; write it as packed=",
            marks=pytest.mark.error_case("twin-packed-malformed"),
        ),
        pytest.param(
            "rules_flat",
            r"partition_rules\[0\] = 'fc1\\\\.kernel' is not a \(regex, spec\) pair",
            marks=pytest.mark.error_case("twin-partition-rules-bad"),
        ),
        pytest.param(
            "rules_dict",
            r"partition_rules is a dict; give partition_rules as a tuple of \(regex over NNX "
            r"parameter names, partition spec\) pairs",
            marks=pytest.mark.error_case("twin-partition-rules-bad"),
        ),
        pytest.param(
            "rules_regex",
            r"partition_rules\[0\] 'fc1\\\\.kernel\[' is not a valid regular expression",
            marks=pytest.mark.error_case("twin-partition-rules-bad"),
        ),
        pytest.param(
            "rules_axis",
            r"partition_rules\[0\] \('fc1\\\\.kernel'\) names 'model', which is not a mesh axis; "
            r"each entry of a spec is None or one of data, fsdp, tensor",
            marks=pytest.mark.error_case("twin-partition-rules-bad"),
        ),
        pytest.param(
            "torch_ref",
            r"torch='models.TorchNet' must name its factory as path/to/file.py:name",
            marks=pytest.mark.error_case("twin-field-malformed"),
        ),
        pytest.param(
            "dtype_arg",
            r"nnx_dtype_arg='compute dtype' must be the name of the NNX factory's compute-dtype "
            r"keyword",
            marks=pytest.mark.error_case("twin-field-malformed"),
        ),
        pytest.param(
            "train_dict",
            r"train is a dict; give a common.spec.TrainSpec\(...\)",
            marks=pytest.mark.error_case("twin-field-malformed"),
        ),
        pytest.param(
            "init_nnx",
            r"init='nnx' is not one of torch, canonical",
            marks=pytest.mark.error_case("twin-field-malformed"),
        ),
        pytest.param(
            "hparams_object",
            r"hparams\['scale'\] is a Fraction; a twin's fields hold plain data",
            marks=pytest.mark.error_case("twin-field-malformed"),
        ),
        pytest.param(
            "hf_no_type",
            r"hf=\{'prefix': 'model.'\} is malformed; it holds model_type",
            marks=pytest.mark.error_case("twin-hf-declaration-bad"),
        ),
        pytest.param(
            "hf_unknown_hparam",
            r"hf\['config'\] maps 'hidden_size' to 'd_modl', which is not one of its "
            r"hyperparameters \(input_shape, hidden, num_classes\)",
            marks=pytest.mark.error_case("twin-hf-declaration-bad"),
        ),
    ],
)
def test_a_declaration_that_cannot_work_is_refused_when_the_twin_loads(
    tmp_path, project, name, message
):
    start = time.monotonic()
    line = assert_refused(tmp_path, run_twin(tmp_path, project, f"twins.py:{name}"), message)
    assert line.startswith(f"error: twin '{project}/twins.py:{name}': ")
    # no model was built: nothing but the twin file was imported
    assert time.monotonic() - start < 30


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, message",
    [
        pytest.param(
            "packed_nothing",
            r"packed \{'attn.qkv': \('attn.q', 'attn.k', 'attn.v'\)\} matches no module: "
            r"no torch or NNX module is named 'attn.qkv' or ends in '.attn.qkv' "
            r"\(closest fc\d\); name the module that packs the others",
            marks=pytest.mark.error_case("twin-packed-unmatched"),
        ),
        pytest.param(
            "torch_empty",
            r"twin '.*twins.py:torch_empty': the torch model \(models.py:TorchEmpty\) has no "
            r"parameters; a twin trains and compares parameters",
            marks=pytest.mark.error_case("twin-no-parameters"),
        ),
        pytest.param(
            "nnx_empty",
            r"the NNX model \(models.py:NnxEmpty\) has no parameters",
            marks=pytest.mark.error_case("twin-no-parameters"),
        ),
        pytest.param(
            "torch_tuple",
            r"twin '.*twins.py:torch_tuple': the forward of torch='models.py:TorchTuple' "
            r"returns a tuple with no array as itself, as its 'logits' or as its first "
            r"element; name the output that holds the logits",
            marks=pytest.mark.error_case("twin-forward-not-one-tensor"),
        ),
        pytest.param(
            "torch_dict",
            r"the forward of torch='models.py:TorchDict' returns a dict \(entries: scores\) with "
            r"no array",
            marks=pytest.mark.error_case("twin-forward-not-one-tensor"),
        ),
        pytest.param(
            "nnx_tuple",
            r"the forward of nnx='models.py:NnxTuple' returns a tuple with no array",
            marks=pytest.mark.error_case("twin-forward-not-one-tensor"),
        ),
        pytest.param(
            "torch_exits",
            r"describing the torch side of twin '.*:torch_exits' exited with code 0 before "
            r"writing torch_params.json, torch_modules.json, torch_weights.json, "
            r"torch_init.safetensors \(sys.exit or "
            r"os._exit in the torch factory",
            marks=pytest.mark.error_case("twin-factory-exits"),
        ),
        pytest.param(
            "nnx_os_exit",
            r"describing the NNX side of twin '.*:nnx_os_exit' exited with code 0 before "
            r"writing nnx_params.json",
            marks=pytest.mark.error_case("twin-factory-exits"),
        ),
        pytest.param(
            "torch_killed",
            r"describing the torch side of twin '.*:torch_killed' was killed by SIGKILL",
            marks=pytest.mark.error_case("twin-factory-exits"),
        ),
    ],
)
def test_a_model_that_cannot_be_compared_is_refused_when_the_sides_describe_themselves(
    tmp_path, project, name, message
):
    assert_refused(tmp_path, run_twin(tmp_path, project, f"twins.py:{name}"), message)


@pytest.mark.slow
@pytest.mark.error_case("twin-describe-timeout")
@pytest.mark.parametrize("interpreters", ["one", "apart"])
def test_a_factory_that_hangs_is_bounded_by_the_timeout(tmp_path, project, interpreters):
    """Each side is described by the process that goes on to make its run (driver/describe_sides.py
    --wait-for-run), in parallel, with one interpreter (the CPU default) or another path to it (as a
    TPU VM's two environments would). Either way the hanging side is named and every process is
    taken down."""
    args = ["--jax-python", str(tmp_path / "python")] if interpreters == "apart" else []
    if args:
        (tmp_path / "python").symlink_to(sys.executable)
    start = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compare",
            "--quiet",
            "--twin",
            f"{project}/twins.py:torch_sleeps",
            "--backend",
            "jax,torch",
            "--out",
            str(tmp_path / "run"),
            "--timeout",
            "8",
            *args,
        ],
        cwd=REPO,
        env=process_env(TMPDIR=str(tmp_path / "tmp"), **PLAIN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = set()
    while proc.poll() is None:
        seen.update(p for p in processes_under(tmp_path / "tmp") if ".describe" in p)
        time.sleep(0.2)
    proc.stderr = proc.stderr.read()
    assert_refused(
        tmp_path,
        proc,
        r"describing the torch side of twin '.*:torch_sleeps' \(building its model\) did "
        r"not finish within --timeout 8 s; killed with its process group",
    )
    assert time.monotonic() - start < 90
    described = sorted(re.findall(r"\b(jax_impl|torch_impl)\.describe", p) for p in seen)
    assert described == [["jax_impl"], ["torch_impl"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "ref, stage, marker",
    [
        ("sleeps.py:t", "loading the twin file", "_answer"),
        ("twins.py:torch_sleeps", "describing the sides", "torch_impl.describe"),
    ],
)
@pytest.mark.error_case("twin-prepare-interrupted")
def test_sigterm_while_a_twin_is_prepared_leaves_no_process_and_no_temp_folder(
    tmp_path, project, ref, stage, marker
):
    env = process_env(TMPDIR=str(tmp_path / "tmp"), **PLAIN)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compare",
            "--quiet",
            "--twin",
            f"{project}/{ref}",
            "--backend",
            "jax,torch",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while (
            not any(marker in p for p in processes_under(tmp_path)) and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        time.sleep(1.0)
        assert proc.poll() is None and any(marker in p for p in processes_under(tmp_path)), (
            f"{stage} never started: {proc.poll() is None or proc.communicate()[1][-2000:]}"
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 4, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        "error: interrupted by a signal; what compare had started is stopped"
    )
    time.sleep(0.5)  # the guard takes down what compare could not (it never should have to)
    assert not processes_under(tmp_path), processes_under(tmp_path)
    assert not list((tmp_path / "tmp").iterdir())
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "config, message",
    [
        pytest.param(
            "[]",
            r"config.json holds a JSON list, not an object of config fields",
            marks=pytest.mark.error_case("checkpoint-hf-config-bad"),
        ),
        pytest.param(
            '{"n_embd": 64}',
            r"config.json names no model_type, so its architecture is unknown",
            marks=pytest.mark.error_case("checkpoint-hf-config-bad"),
        ),
    ],
)
def test_a_hugging_face_config_that_is_not_one_is_refused_before_any_process(
    tmp_path, config, message
):
    (tmp_path / "tmp").mkdir()
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(config)
    (checkpoint / "model.safetensors").write_bytes(b"")
    proc = compare(
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
    assert_refused(tmp_path, proc, message)


@pytest.mark.slow
@pytest.mark.parametrize(
    "variable, value, backends, failing, message",
    [
        (
            "JAX_PLATFORMS",
            "cuda",
            "jax,torch",
            ("jax",),
            r"^JAX_PLATFORMS=cuda selects a platform this machine does not have \(jax sees: "
            r"cpu\); unset it, or install "
            r"jax\[cuda12\] where that hardware is$",
        ),
        (
            "JAX_PLATFORMS",
            "tpu",
            "jax,torchax,torch",
            ("jax", "torchax"),  # torchax runs on JAX
            r"^JAX_PLATFORMS=tpu selects a platform this machine does not have \(jax sees: cpu\); "
            r"unset it, or install "
            r"jax\[tpu\]",
        ),
        (
            "PJRT_DEVICE",
            "TPU",
            "jax,torch_xla",
            ("torch_xla",),
            r"^PJRT_DEVICE=TPU selects a platform this machine does not have \(torch_xla can use: "
            r"CPU\); unset it",
        ),
    ],
)
@pytest.mark.error_case("platform-env-unavailable")
def test_an_environment_selecting_a_platform_this_machine_lacks_is_a_usage_error_of_that_backend(
    tmp_path, variable, value, backends, failing, message
):
    if any(Path("/dev").glob("accel[0-9]*")) or any(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this machine has an accelerator")
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "run"
    proc = compare(
        tmp_path,
        "--spec",
        "mlp-tiny",
        "--steps",
        "1",
        "--backend",
        backends,
        "--out",
        str(out),
        "--no-compile-cache",
        env={variable: value},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "usage_error"
    for name in backends.split(","):
        backend = report["backends"][name]
        if name not in failing:
            assert backend["status"] == "ok", backend
            continue
        assert backend["status"] == "usage_error" and backend["exit_code"] == 2
        assert re.search(message, backend["message"]), backend["message"]
        assert f"error: {name}: usage_error: {variable}={value} selects" in proc.stderr
    assert not processes_under(tmp_path)
