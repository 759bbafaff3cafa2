from common.presets import load_spec
from common.sharding import batch_partition_spec, param_partition_specs
from common.spec import MeshSpec


def test_single_device_replicates_everything():
    table = param_partition_specs(load_spec("gpt-tiny").model, MeshSpec())
    assert all(all(d is None for d in spec) for spec in table.values())
    assert batch_partition_spec(MeshSpec(), 2) == (None, None)


def test_megatron_tensor_parallel_gpt():
    model = load_spec("gpt-tiny", ["model.tied_embeddings=false"]).model
    t = param_partition_specs(model, MeshSpec(tensor=2))
    for proj in "qkv":
        assert t[f"blocks.0.attn.{proj}.kernel"] == (None, "tensor")  # column-parallel: heads split
        assert t[f"blocks.0.attn.{proj}.bias"] == ("tensor",)
    assert t["blocks.0.attn.o.kernel"] == ("tensor", None)  # row-parallel
    assert t["blocks.0.attn.o.bias"] == (None,)
    assert t["blocks.1.mlp.fc.kernel"] == (None, "tensor") and t["blocks.1.mlp.proj.kernel"] == (
        "tensor",
        None,
    )
    assert t["blocks.0.ln1.scale"] == (None,) and t["wte.embedding"] == (None, None)
    assert t["lm_head.kernel"] == (None, "tensor")


def test_mlp_alternates_column_and_row():
    t = param_partition_specs(load_spec("mlp-tiny").model, MeshSpec(data=4, tensor=2))
    assert t["hidden.0.kernel"] == (None, "tensor") and t["hidden.0.bias"] == ("tensor",)
    assert t["hidden.1.kernel"] == ("tensor", None) and t["hidden.1.bias"] == (None,)
    assert t["head.kernel"] == (None, None)  # follows a row layer
    assert batch_partition_spec(MeshSpec(data=4, tensor=2), 2) == ("data", None)


def test_fsdp_splits_the_largest_divisible_dimension():
    t = param_partition_specs(load_spec("mlp-tiny").model, MeshSpec(fsdp=8))
    assert t["hidden.0.kernel"] == ("fsdp", None)  # (784, 256): 784 = 8 * 98
    assert t["head.kernel"] == ("fsdp", None)  # (256, 10): 10 is not divisible by 8
    assert t["head.bias"] == (None,)
    both = param_partition_specs(load_spec("mlp-tiny").model, MeshSpec(fsdp=2, tensor=2))
    assert both["hidden.0.kernel"] == ("fsdp", "tensor")
    assert batch_partition_spec(MeshSpec(data=2, fsdp=2), 3) == (("data", "fsdp"), None, None)


def test_cnn_tensor_parallel_splits_channels():
    t = param_partition_specs(load_spec("cnn-digits").model, MeshSpec(tensor=2))
    assert t["convs.0.kernel"] == (None, None, None, "tensor")
    assert t["convs.1.kernel"] == (None, None, "tensor", None)
