"""xmp.spawn with one replica failing on its input, as a user's code can: `python
tests/data/failing_replica.py OUT`.

Replica 1 raises a DataError at once; replica 0 trains and meets the others at the first compile
barrier. Prints what `run_spawn` raised: `<type>: <message>`."""

import sys
from pathlib import Path

MESSAGE = (
    "shard-1.bin: token id 300 at position 12 is outside model.vocab_size=256; use a "
    "matching vocab_size"
)


def replica(index, spec_dict, options, progress):
    import torch_xla.runtime as xr

    from common.data import DataError
    from torch_xla_impl.spawn import _replica

    if xr.global_ordinal() == 1:
        raise DataError(MESSAGE)
    _replica(index, spec_dict, options, progress)


if __name__ == "__main__":
    from torch_xla_impl import sharding

    sharding.configure_platform(2)
    from common.presets import load_spec
    from driver.harness import RunOptions
    from torch_xla_impl.spawn import run_spawn

    spec = load_spec("mlp-tiny", ["mesh.data=2", "train.steps=3"])
    options = RunOptions(throughput_steps=0, out_dir=Path(sys.argv[1]))
    try:
        run_spawn(spec, options, False, replica=replica)
        print("no error")
    except Exception as e:
        print(f"{type(e).__name__}: {e}")
