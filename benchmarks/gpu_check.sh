#!/bin/bash
# The device check a session lent a GPU machine runs there in one call (docs/performance.md "On a GPU"): JAX,
# eager torch and torchax on the one GPU, on the machine's own python3, torchax carried as a wheel in .whl/:
#   bash benchmarks/gpu_check.sh            (ONLY="gpt_tiny_f32 llama_f64" runs those alone; PY=.venv/bin/python
#                                            runs it here, on the CPU, to try the script)
# Each run's output goes to $OUT/log.txt as it is printed, so a run cut off by the lease still says where it was.
set -u
PY=${PY:-python3}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
if [ "$PY" = python3 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3  # torchax
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 COLUMNS=180
R=/tmp/gpu_runs; rm -rf $R; mkdir -p $R
LOG=$OUT/log.txt
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  $PY -c "import sys, jax, torch, torchax, flax, optax, transformers; print(sys.version.split()[0], 'jax', jax.__version__, jax.devices(), 'torch', torch.__version__, torch.cuda.is_available(), 'torchax', torchax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'transformers', transformers.__version__)"
  nproc; } 2>&1 | tee -a $LOG
go() {  # go NAME LIMIT ARGS...: one compare run, its exit code and wall time
  local name=$1 limit=$2; shift 2
  [ -n "$ONLY" ] && [[ ! " $ONLY " == *" $name "* ]] && return
  echo "=== $name: compare $*" | tee -a $LOG
  local t0=$(date +%s%N)
  timeout $limit $PY -m compare "$@" --out $R/$name 2>&1 | tee $R/$name.out >> $LOG; local rc=${PIPESTATUS[0]}
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "$name rc=$rc wall_ms=$ms" | tee -a $LOG $OUT/summary.txt
  grep -E -i 'verdict|PASS|FAIL|parity|step time|ms|error' $R/$name.out | head -30
}
B=jax,torch,torchax
ONLY=${ONLY:-}
go gpt_tiny_f32 150 --backend $B --require-same-device --tensors auto
go gpt_tiny_f64 150 --backend $B --require-same-device --dtype float64
go llama_f32 150 --twin examples/llama/twin.py:llama_tiny --backend $B --require-same-device --tensors auto
go llama_f64 150 --twin examples/llama/twin.py:llama_tiny --backend $B --require-same-device --dtype float64
go llama_misported 120 --twin examples/llama/twin.py:llama_tiny_misported --backend jax,torch --require-same-device --dtype float64
go mixtral_router_zeroed 150 --twin examples/mixtral/twin.py:mixtral_router_zeroed --backend jax,torch --require-same-device --tensors auto
go mixtral_torchax 120 --twin examples/mixtral/twin.py:mixtral_tiny --backend jax,torchax --require-same-device
go clip_f32 150 --twin examples/clip/twin.py:clip_tiny --backend $B --require-same-device --tensors auto
go gemma2_f32 150 --twin examples/gemma2/twin.py:gemma2_tiny --backend $B --require-same-device --activations
go gemma2_f64 150 --twin examples/gemma2/twin.py:gemma2_tiny --backend $B --require-same-device --dtype float64
go gpt2_hf_f32 150 --twin examples/hf_gpt2/twin.py:gpt2_tiny --backend $B --require-same-device --activations
go gpt2_small_bf16 ${GPT2_LIMIT:-420} --backend $B --spec gpt2-small --dtype bfloat16 --steps ${GPT2_STEPS:-30} --require-same-device --tensors auto
cd $R && tar czf $OUT/reports.tgz */report.md */report.json */*/record.json 2>/dev/null; ls -la $OUT
