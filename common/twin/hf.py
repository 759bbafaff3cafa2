"""Hugging Face checkpoints: their config checked against the spec, their tensors renamed to the
twin's torch names (numpy only; the tensors are read in a torch process, which reads any dtype).

GPT-2 loads onto the built-in gpt twin: HF's `Conv1D` stores (in, out), so every projection is
transposed into torch's Linear (out, in), and `c_attn` already packs q|k|v as the twin's `attn.qkv`.
A twin names other model types in its `hf` field (examples/llama): the checkpoint's names are its
torch model's behind a prefix (`model.`), and `config` maps HF's config keys to its hyperparameters.
Llama checkpoints in Hugging Face's layout use rotate-half rotary pairs; Meta's original ones
(`tok_embeddings`, `attention.wq`) interleave them and are refused with that said.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from common.files.fsutil import require_regular_file
from common.spec import TransformerSpec
from common.twin import BUILTIN, Twin, hparams_of
from common.weights import CheckpointError

GPT2_CONFIG = {
    "vocab_size": "vocab_size",
    "n_positions": "seq_len",
    "n_embd": "d_model",
    "n_layer": "n_layers",
    "n_head": "n_heads",
    "layer_norm_epsilon": "layernorm_eps",
}
GPT2_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "exact"}
GPT2_RENAMES = [
    (r"^transformer\.", ""),
    (r"\.h\.|^h\.", "blocks."),
    (r"\.ln_1\.", ".ln1."),
    (r"\.ln_2\.", ".ln2."),
    (r"\.attn\.c_attn\.", ".attn.qkv."),
    (r"\.attn\.c_proj\.", ".attn.o."),
    (r"\.mlp\.c_fc\.", ".mlp.fc."),
    (r"\.mlp\.c_proj\.", ".mlp.proj."),
]
META_NAMES = re.compile(r"^tok_embeddings\.|\.attention\.w[qkvo]\.|\.feed_forward\.w[123]\.")
# Mixtral's original per-expert layout, which transformers 5's save_pretrained still writes by
# default and its from_pretrained stacks (its conversion mapping: w1 | w3 -> experts.gate_up_proj,
# w2 -> experts.down_proj)
PER_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")


def read_config(path: Path) -> dict:
    """config.json of an HF model directory (or beside a safetensors file)."""
    config_path = path / "config.json" if path.is_dir() else path.parent / "config.json"
    if not path.exists():
        raise CheckpointError(f"hf checkpoint {path} does not exist")
    # a FIFO: read forever
    require_regular_file(path, "hf checkpoint", CheckpointError, directory_ok=True)
    require_regular_file(config_path, "hf checkpoint file", CheckpointError)
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"hf checkpoint {path}: no config.json in {config_path.parent} (save the model with "
            "save_pretrained, which writes it)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(
            f"hf checkpoint {path}: {config_path} is not readable JSON: {e}"
        ) from None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"hf checkpoint {path}: {config_path} holds a JSON {type(config).__name__}, not an "
            "object of config fields; give the config.json save_pretrained writes"
        )
    if not isinstance(config.get("model_type"), str):
        raise CheckpointError(
            f"hf checkpoint {path}: {config_path} names no model_type, so its architecture is "
            "unknown; give the config.json save_pretrained writes (it has model_type, e.g. "
            '"model_type": "llama")'
        )
    return config


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of an HF checkpoint (one, or the shards its index names)."""
    if path.is_file():
        return [path]
    index = path / "model.safetensors.index.json"
    if require_regular_file(index, "hf checkpoint file", CheckpointError).exists():
        return [path / s for s in _shards(index)]
    if (path / "model.safetensors").exists():
        return [path / "model.safetensors"]
    raise CheckpointError(
        f"hf checkpoint {path}: no model.safetensors (nor an index of shards); save it with "
        "save_pretrained(..., safe_serialization=True)"
    )


def _shards(index: Path) -> list[str]:
    """The shard files an index names (its weight_map's values), or one line naming the file and
    what is wrong."""
    fix = "give the index save_pretrained writes, or remove it beside a single model.safetensors"
    try:
        table = json.loads(index.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"hf checkpoint file {index} is not JSON ({e}); {fix}") from None
    weight_map = table.get("weight_map") if isinstance(table, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(
            f"hf checkpoint file {index} has no weight_map of tensor names to shard files; {fix}"
        )
    return sorted(set(weight_map.values()))


def _lookup(config: dict, key: str):
    value = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _expected_gpt2(config: dict, spec: TransformerSpec) -> list[tuple[str, object, str, object]]:
    pairs = [(k, config.get(k), f"model.{f}", getattr(spec, f)) for k, f in GPT2_CONFIG.items()]
    n_inner = config.get("n_inner") or 4 * (config.get("n_embd") or 0)
    pairs += [
        ("n_inner", n_inner, "model.d_ff", spec.d_ff),
        (
            "activation_function",
            config.get("activation_function"),
            "model.gelu",
            {"tanh": "gelu_new", "exact": "gelu"}[spec.gelu],
        ),
        (
            "tie_word_embeddings",
            config.get("tie_word_embeddings", True),
            "model.tied_embeddings",
            spec.tied_embeddings,
        ),
    ]
    return pairs


def _same(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str) and a in GPT2_GELU and b in GPT2_GELU:
        return GPT2_GELU[a] == GPT2_GELU[b]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def _builtin_gpt(twin: Twin) -> bool:
    """Whether GPT-2 checkpoints go to the built-in gpt model (its own names and config fields):
    decided by the twin, never by the checkpoint's model_type, which a user's twin of Hugging
    Face's GPT-2 shares (its names are HF's own, behind its `prefix`)."""
    return twin == BUILTIN["gpt"]


def check_config(config: dict, model_spec, twin: Twin, source: str) -> None:
    """Every HF config field the twin maps must equal the spec's; all mismatches named in one
    line."""
    model_type = config.get("model_type")
    want = twin.hf.get("model_type")
    if not want:
        raise CheckpointError(
            f"{source}: this twin loads no Hugging Face checkpoints (its Twin declares no hf); "
            "use the torch format with its own state_dict"
        )
    if model_type != want:
        raise CheckpointError(
            f"{source} is a {model_type!r} model; this twin loads {want!r} checkpoints "
            "(a checkpoint of another architecture?)"
        )
    if _builtin_gpt(twin):
        pairs = _expected_gpt2(config, model_spec)
    else:
        hparams = hparams_of(model_spec)
        pairs = [
            (k, _lookup(config, k), f"model.{h}", hparams[h])
            for k, h in twin.hf.get("config", {}).items()
        ]
    wrong = [
        f"{k}={got} but {field}={spec_value}"
        for k, got, field, spec_value in pairs
        if not _same(got, spec_value)
    ]
    if wrong:
        raise CheckpointError(
            f"{source}: its config.json does not match the spec: {'; '.join(wrong)} (use --set, or "
            "a spec of this size)"
        )


def to_torch_names(arrays: dict[str, np.ndarray], twin: Twin, source: str) -> dict[str, np.ndarray]:
    """HF's tensor names and layouts -> the twin's torch model's."""
    if any(META_NAMES.search(n) for n in arrays):
        raise CheckpointError(
            f"{source} is in Meta's original Llama layout (tok_embeddings, attention.wq, ...: "
            "interleaved rotary pairs); convert it to Hugging Face's rotate-half layout first "
            "(transformers' convert_llama_weights_to_hf.py permutes the q and k rows)"
        )
    if _builtin_gpt(twin):
        return _gpt2_to_torch(arrays)
    arrays = _stacked_experts(arrays, source)
    prefix = twin.hf.get("prefix", "")
    return {n.removeprefix(prefix): v for n, v in arrays.items()}


def _stacked_experts(arrays: dict[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """Mixtral-style per-expert tensors stacked as from_pretrained stacks them:
    `<layer>.block_sparse_moe.` becomes `<layer>.mlp.`, each layer's experts' w1 and w3 (gate, up:
    (I, D)) `experts.gate_up_proj` (E, 2I, D) and their w2 (D, I) `experts.down_proj` (E, D, I).
    Names in any other layout pass as they are."""
    experts: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    out = {}
    for name, value in arrays.items():
        found = PER_EXPERT.match(name)
        if found:
            experts.setdefault(found[1], {}).setdefault(int(found[2]), {})[found[3]] = value
        else:
            out[name.replace(".block_sparse_moe.", ".mlp.")] = value
    for layer, by_expert in experts.items():
        count = max(by_expert) + 1
        missing = [
            f"experts.{e}.{w}"
            for e in range(count)
            for w in ("w1", "w2", "w3")
            if w not in by_expert.get(e, {})
        ]
        if missing:
            raise CheckpointError(
                f"{source}: {layer}.block_sparse_moe lacks {', '.join(missing[:4])}: a per-expert "
                "checkpoint needs w1, w2 and w3 of every expert (save it again with "
                "save_pretrained)"
            )
        out[f"{layer}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([by_expert[e]["w1"], by_expert[e]["w3"]], axis=0) for e in range(count)]
        )
        out[f"{layer}.mlp.experts.down_proj"] = np.stack([by_expert[e]["w2"] for e in range(count)])
    return out


def _gpt2_to_torch(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in arrays.items():
        if re.search(r"\.attn\.(bias|masked_bias)$", name):  # causal-mask buffers of older versions
            continue
        new = name
        for pattern, replacement in GPT2_RENAMES:
            new = re.sub(pattern, replacement, new)
        if new.endswith(".weight") and re.search(
            r"\.(attn\.qkv|attn\.o|mlp\.fc|mlp\.proj)\.weight$", new
        ):
            value = np.ascontiguousarray(value.T)  # Conv1D (in, out) -> Linear (out, in)
        out[new] = value
    return out
