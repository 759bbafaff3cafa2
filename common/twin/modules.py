"""Module-level correspondence between a torch model and its NNX twin, from the parameter trees'
paths (the same name rules as common/twin/correspond.py): which torch module is which NNX module
(the step-0 capture compares their activations), and the NNX state names of torch BatchNorm's
running statistics."""

from __future__ import annotations

from collections.abc import Mapping

from common.twin.correspond import module_leaf, normalised_path, renamed

# the whole model's name among the step-0 activations (its own forward's code)
ROOT_MODULE = "(model)"
# torch BatchNorm -> nnx.BatchNorm
RUNNING_STATISTICS = {"running_mean": "mean", "running_var": "var"}


def state_names(buffers: list[str], modules: Mapping[str, str]) -> dict[str, str]:
    """torch BatchNorm running-statistic buffer -> canonical state name (`<NNX module>.mean`,
    `.var`), for the modules `module_map` links; a torch-only count (`num_batches_tracked`) has no
    counterpart."""
    out = {}
    for name in buffers:
        module, leaf = module_leaf(name)
        if leaf in RUNNING_STATISTICS and module in modules:
            out[name] = f"{modules[module]}.{RUNNING_STATISTICS[leaf]}"
    return out


def module_map(
    torch_modules: list[str],
    canonical: Mapping[str, tuple],
    rename: Mapping[str, str] = {},  # noqa: B006
) -> dict[str, str]:
    """torch module path -> NNX module path, for the modules both sides have (by normalised path;
    every prefix of a canonical parameter name is an NNX module). The root is ROOT_MODULE. Where
    several torch modules come to one NNX path (a rename that flattens a container:
    `^text_model.embeddings.` -> `text.` makes `text_model.embeddings` read `text`, as `text_model`
    does), the outermost one holds it: it holds the others' parameters and more, as the NNX module
    does."""
    nnx_modules = set()
    for name in canonical:
        parts = name.split(".")
        nnx_modules.update(".".join(parts[:i]) for i in range(1, len(parts)))
    by_norm = {normalised_path(m): m for m in nnx_modules}
    out = {"": ROOT_MODULE} if "" in torch_modules else {}
    taken = set()
    # the outermost first
    for module in sorted(filter(None, torch_modules), key=lambda m: m.count(".")):
        path = normalised_path(renamed(module + ".", rename).rstrip("."))
        if path in by_norm and by_norm[path] not in taken:
            out[module] = by_norm[path]
            taken.add(by_norm[path])
    return {m: out[m] for m in torch_modules if m in out}  # in the model's order
