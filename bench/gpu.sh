#!/usr/bin/env bash
# The GPU benchmarks in one go, each under a time limit; logs into $1 (default
# gpu-bench/). Run from the repository root on a machine with a GPU:
#   bash bench/gpu.sh [DIR]          (PYTHON=.venv/bin/python: another interpreter)
# 1. jaxdl's sgd and bsp steps for resnet18 on CIFAR-shaped data, float32 and
#    bfloat16, against a hand-written jitted step (bench/single_step.py);
# 2. PyTorch's step for the same model and data on the same card
#    (bench/torch_resnet18.py; skipped without torch);
# 3. the sim engine's 8-worker asp against one worker's step (bench/sim_asp.py).
set -u
out="${1:-gpu-bench}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python="${PYTHON:-python3}"
run() {  # run SECONDS NAME ARGS...: one benchmark, its output into NAME.txt
  local limit=$1 name=$2; shift 2
  echo "== $name: $*"
  timeout "$limit" "$python" "$@" 2>&1 | tee "$out/$name.txt"
  echo "== $name: exit ${PIPESTATUS[0]}"
}
if ! "$python" -c "import jax, sys; sys.exit(jax.default_backend() == 'cpu')" 2>/dev/null; then
  echo "no GPU that jax sees ($python): the GPU benchmarks need one; skipped"
  exit 0
fi
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$python" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__,
'optax', optax.__version__, jax.devices())"; } 2>&1 | tee "$out/machine.txt"
run "${SINGLE_LIMIT:-300}" single_step -m bench.single_step --cases resnet18:32:256 \
  --dtypes float32 bfloat16 --algorithms sgd bsp --steps 30 --rounds "${ROUNDS:-7}"
run "${TORCH_LIMIT:-120}" torch -m bench.torch_resnet18 --batch 256
run "${SIM_LIMIT:-180}" sim_asp -m bench.sim_asp --cases cnn:28:32:8 mlp:8:32:8
