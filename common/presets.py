"""Named run specs (`gpt-tiny` is the CPU default of `python -m compare`) and `load_spec`, which
turns a preset name or a spec file plus `--set` overrides into a validated RunSpec."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from common.files.fsutil import require_regular_file
from common.spec import (
    CNNSpec,
    DataSpec,
    MeshSpec,
    MLPSpec,
    RunSpec,
    SpecError,
    TrainSpec,
    TransformerSpec,
)
from common.spec.parse import apply_overrides, run_spec_from_dict
from common.twin import twin_run_spec

PRESETS: dict[str, RunSpec] = {
    # 784 -> 256 -> 256 -> 10 on a synthetic teacher task (MNIST-sized inputs).
    "mlp-tiny": RunSpec(
        name="mlp-tiny",
        model=MLPSpec(input_size=784, hidden_sizes=(256, 256), num_classes=10, activation="relu"),
        train=TrainSpec(optimizer="adamw", lr=1e-3, global_batch_size=128, steps=50),
        data=DataSpec(dataset="synthetic-classification"),
    ),
    # Two convs (the second at stride 2) on the real 8x8 digits of scikit-learn.
    "cnn-digits": RunSpec(
        name="cnn-digits",
        model=CNNSpec(
            input_shape=(8, 8, 1),
            channels=(16, 32),
            kernel_sizes=(3, 3),
            strides=(1, 2),
            paddings=(1, 1),
            pooling="global_avg",
            num_classes=10,
        ),
        train=TrainSpec(optimizer="adamw", lr=3e-3, global_batch_size=64, steps=50),
        data=DataSpec(dataset="digits"),
    ),
    # The CPU default: small enough that both twins train 50 steps in seconds.
    "gpt-tiny": RunSpec(
        name="gpt-tiny",
        model=TransformerSpec(
            vocab_size=256,
            seq_len=64,
            d_model=64,
            n_heads=4,
            n_layers=2,
            d_ff=256,
            layernorm_eps=1e-5,
            gelu="tanh",
            tied_embeddings=True,
        ),
        train=TrainSpec(
            optimizer="adamw",
            lr=3e-3,
            weight_decay=0.1,
            beta2=0.95,
            schedule="warmup_cosine",
            schedule_warmup_steps=5,
            global_batch_size=16,
            steps=50,
        ),
        data=DataSpec(dataset="synthetic-tokens"),
    ),
    # GPT-2 small (124M) for TPU: bf16 and the platform's default matmul pass.
    "gpt2-small": RunSpec(
        name="gpt2-small",
        model=TransformerSpec(
            vocab_size=50257,
            seq_len=1024,
            d_model=768,
            n_heads=12,
            n_layers=12,
            d_ff=3072,
            layernorm_eps=1e-5,
            gelu="tanh",
            tied_embeddings=True,
        ),
        train=TrainSpec(
            optimizer="adamw",
            lr=6e-4,
            weight_decay=0.1,
            beta2=0.95,
            schedule="warmup_cosine",
            schedule_warmup_steps=10,
            global_batch_size=32,
            steps=100,
            timing_warmup_steps=5,
            dtype="bfloat16",
            matmul_precision="default",
        ),
        mesh=MeshSpec(),
        data=DataSpec(dataset="synthetic-tokens"),
    ),
}


def load_spec(
    spec: str,
    overrides: list[str] | tuple[str, ...] = (),
    twin: str | None = None,
    twin_timeout_s: float | None = None,
) -> RunSpec:
    """A preset name, a .toml/.json file or a twin (`--twin FILE_OR_MODULE:NAME`, which wins; its
    file is imported in a subprocess bounded by `twin_timeout_s`), then `--set` overrides,
    validated."""
    if twin:
        base = twin_run_spec(twin, twin_timeout_s)
    elif spec in PRESETS:
        base = PRESETS[spec]
    elif spec.endswith((".toml", ".json")):
        # a FIFO would block the read forever
        path = require_regular_file(Path(spec), "spec file", SpecError)
        try:
            text = path.read_text()
        except OSError as e:
            raise SpecError(f"cannot read spec file {spec}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise SpecError(f"spec file {spec} is not UTF-8 text (a binary file?): {e}") from None
        try:
            raw = tomllib.loads(text) if spec.endswith(".toml") else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
            raise SpecError(
                f"spec file {spec} is not valid {path.suffix[1:].upper()}: {e}"
            ) from None
        except RecursionError:
            raise SpecError(
                f"spec file {spec} is not a spec: its values nest too deep to read"
            ) from None
        if not isinstance(raw, dict):
            kind = {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
                type(raw), "a number"
            )
            raise SpecError(
                f"spec file {spec} holds {kind}; a spec file holds a table with "
                "model/train/mesh/data "
                'sections, e.g. [model] family = "mlp" in TOML or {"model": {"family": "mlp"}} '
                "in JSON"
            )
        try:  # the shape of every section and field: one line naming the file and the field
            base = run_spec_from_dict(raw, name=path.stem)
        except SpecError as e:
            raise SpecError(f"spec file {spec}: {e}") from None
    else:
        raise SpecError(
            f"unknown spec {spec!r}: use a preset ({', '.join(PRESETS)}) or a .toml/.json file"
        )
    return apply_overrides(base, list(overrides)).validate()


def build_variants(values: list[str], build, side: str, tree, base: dict) -> None:
    """A describe step's `--also-spec BACKEND=PATH`: `build(spec)` for each backend's own spec (a
    model another backend runs with other hyperparameters); what its factory refuses is said as
    that backend's, by the flag that set it, and a model whose parameters (`tree(model)`: {name:
    shape}) are not the run's (`base`) is refused as the backend would refuse it after the other
    side trained (common/weights built_otherwise)."""
    from common.twin import TwinError
    from common.weights import built_otherwise

    for value in values:
        backend, _, path = value.partition("=")
        flag = f"--{backend.replace('_', '-')}-set"
        try:
            built = tree(build(load_spec(path)))
        except SpecError as e:
            raise TwinError(f"{e} (the model {backend} runs, as its {flag} sets it)") from None
        name = next(
            (n for n in sorted(set(built) | set(base)) if built.get(n) != base.get(n)), None
        )
        if name is not None:
            raise built_otherwise(side, name, built.get(name), base.get(name), f"its {flag}")
