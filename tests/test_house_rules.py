import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_importing_common_leaves_frameworks_out():
    code = ("import sys, common, common.spec, common.presets, common.weights, common.data, common.sharding, "
            "common.record, common.fsutil\n"
            "from common.data import make_dataset\nfrom common.spec import load_spec\n"
            "make_dataset(load_spec('cnn-digits')).global_batch(0)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax', 'torch', 'torch_xla'))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
