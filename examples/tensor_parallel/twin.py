"""A tensor-parallel twin: torch's Megatron-style per-rank code (torch_tp.py) against the same
layers as `jax.shard_map` regions (nnx_tp.py), on a mesh of 4 devices (fake CPU devices here, set
by the toolkit from the twin's mesh).

    python -m compare --twin examples/tensor_parallel/twin.py:tp_decoder --backend jax,torch \\
        --activations
    # the MLP's psum left out: its replicas differ, named at layers.0.mlp, devices listed
    python -m compare --twin examples/tensor_parallel/twin.py:tp_missing_psum --backend jax,torch \\
        --activations
"""

import dataclasses

from common.spec import TrainSpec
from common.twin import Twin

HPARAMS = {
    "vocab_size": 256,
    "seq_len": 32,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "d_ff": 128,
    "ranks": 4,  # the torch side's ranks on one process; on processes, and on the NNX side, the
    # mesh's "tensor" axis
}

# each device holds the shard its region's in_specs take (nnx_tp.py COLUMN and ROW)
PARTITION_RULES = (
    (r"attn\.(q|k|v)_proj\.kernel$", (None, "tensor")),
    (r"attn\.o_proj\.kernel$", ("tensor", None)),
    (r"mlp\.fc1\.kernel$", (None, "tensor")),
    (r"mlp\.fc2\.kernel$", ("tensor", None)),
)

tp_decoder = Twin(
    torch="torch_tp.py:Decoder",
    nnx="nnx_tp.py:Decoder",
    task="lm",
    hparams=HPARAMS,
    rename={r"\.self_attn\.": ".attn."},
    partition_rules=PARTITION_RULES,
    mesh={"tensor": 4},
    nnx_mesh_arg="mesh",
    torch_mesh_arg="mesh",
    train=TrainSpec(optimizer="adamw", lr=3e-3, global_batch_size=8, steps=3),
)

tp_missing_psum = dataclasses.replace(tp_decoder, nnx="nnx_tp.py:missing_psum")
tp_wrong_rank = dataclasses.replace(tp_decoder, nnx="nnx_tp.py:wrong_rank")
# over "data" instead of "tensor": a mesh with both, so the two differ
tp_psum_over_data = dataclasses.replace(
    tp_decoder, nnx="nnx_tp.py:psum_over_data", mesh={"data": 2, "tensor": 2}
)
