"""The run's torch.distributed DeviceMesh, for a twin whose torch side is per-rank code
(Twin.torch_mesh_arg): made by torch_impl/distributed.py when the run's processes join as the mesh's
ranks, given to the torch factory by torch_impl/models.py. None alone, or data parallel."""

DEVICE_MESH = None
