#!/usr/bin/env bash
# The checks for a lent GPU machine, as one run (docs/performance.md, "On a GPU"): its image's CUDA torch and jax,
# each stage under its own time limit so that a failing or slow one leaves the others their time.
#   1. env: the GPU, torch, jax, and lazyxla's platform;
#   2. demo: `make demo`'s example on the GPU;
#   3. agreement: every step's loss, eager PyTorch on CUDA vs lazyxla, float32 and bfloat16 autocast (each
#      framework in its own process: with lazyxla imported, a CUDA backward fails, pytorch/pytorch#161129);
#   4. bench: training steps (a)(b)(f), host time per warm step (i) and program size (h) (eager on the CPU);
#   5. attention: F.scaled_dot_product_attention by cuDNN and by XLA, bfloat16, against CPU eager
#      (benchmarks/attention.py; float16 and float32 too: `python -m benchmarks.attention check`);
#   6. suite: part of the test suite on the GPU, in the time left.
# Usage (from the repository root): OUT=build/gpu bash benchmarks/gpu_check.sh [SECONDS, default 540]
set -u
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
END=$(( $(date +%s) + ${1:-540} ))
# the image's torch and jax may lie outside lazyxla's checked range: a trial run (lazyxla warns which)
export LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS=1 LAZYXLA_PERSISTENT_CACHE=0 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes share the GPU (pytest -n, the benchmark's children)

stage() {  # stage NAME SECONDS COMMAND...: run it under a limit (never past END), output in $OUT/NAME.log
    local name=$1 limit=$2 left start rc
    shift 2
    left=$(( END - $(date +%s) - 5 ))
    (( limit > left )) && limit=$left
    if (( limit < 10 )); then echo "== $name: no time left"; return; fi
    start=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name: rc $rc in $(( $(date +%s) - start )) s (limit $limit s)"
    tail -n "${TAIL:-15}" "$OUT/$name.log"
}

stage env 60 bash -c "nvidia-smi -L; nproc; $PY -c 'import torch, jax; print(torch.__version__, torch.cuda.is_available(), jax.__version__, jax.devices())'; $PY -c 'import lazyxla, torch; print(lazyxla.platform(), (torch.ones(3, device=\"lazyxla\") * 2).cpu())'"
stage demo 90 "$PY" examples/train_mlp.py --steps 100
stage agreement 150 "$PY" -m benchmarks.agreement --eager-device cuda --steps 10 --json "$OUT/agreement.json"
TAIL=60 stage bench 280 "$PY" -m benchmarks.run --only training,host,program_size --json "$OUT/bench.json"
TAIL=25 stage attention 150 "$PY" -m benchmarks.attention check --dtypes bfloat16
stage suite 600 "$PY" -m pytest -q -p no:cacheprovider -n 6 -rfE --timeout 120 \
    tests/test_autocast.py tests/test_training.py tests/test_tensor_contract.py tests/test_optimizers.py \
    tests/test_capture.py tests/test_device.py tests/test_known_values.py
