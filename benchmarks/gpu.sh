#!/usr/bin/env bash
# One prepared run of impala_jax on an accelerator machine (issue 16): install what the image
# lacks from carried wheels, check that JAX sees the GPU, run the fast tests that need no
# display, then the benchmarks that matter on a GPU, each under a time cap, so the whole script
# ends inside 10 minutes. Results: JSON (make bench's format) under $OUT (default
# benchmarks/results/gpu), plus log.txt.
#
#   On the device machine:  bash benchmarks/gpu.sh            (carry .whl)
#   Here, the CPU path:     GPU_SH_CPU=1 bash benchmarks/gpu.sh   (checks the script itself)
#
# Wheels: the image has JAX with CUDA, flax, optax, chex and orbax for Python 3.12; envpool,
# gymnasium and impala_jax's other needs travel in .whl/ (benchmarks/README.md says how to
# fetch them). impala_jax itself runs from the checkout (PYTHONPATH), not installed.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/log.txt"
: >"$LOG"
started=$(date +%s)
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

say() { echo "[gpu.sh $(($(date +%s) - started))s] $*" | tee -a "$LOG"; }
# step NAME CAP_S COMMAND...: runs under a hard cap; a failure is logged, the script goes on.
step() {
    local name=$1 cap=$2
    shift 2
    say "$name (cap ${cap}s): $*"
    timeout --kill-after=10 "$cap" "$@" >>"$LOG" 2>&1
    local rc=$?
    say "$name: exit $rc"
    return 0
}
export IMPALA_JAX_RESULTS="$OUT"  # every benchmark's JSON lands there (benchmarks/common.py)

# The wheels are the device's (Python 3.12); the CPU path uses this machine's environment.
if [ "${GPU_SH_CPU:-0}" != 1 ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    say "installing $(ls .whl/*.whl | wc -l) carried wheels into /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || { say "wheel install failed"; exit 1; }
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"

if [ "${GPU_SH_CPU:-0}" = 1 ]; then
    export JAX_PLATFORMS=cpu
    QUICK=--quick
    say "CPU path (GPU_SH_CPU=1): quick sizes, no GPU expected"
else
    QUICK=
    "$PY" - <<'EOF' >>"$LOG" 2>&1 || { say "JAX sees no GPU: stopping (see log)"; exit 1; }
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), "devices", jax.devices())
assert jax.default_backend() == "gpu", jax.default_backend()
EOF
fi
"$PY" - <<'EOF' >"$OUT/machine.json" 2>>"$LOG"
import json, os, platform, jax
print(json.dumps({"cpu_count": os.cpu_count(), "platform": platform.platform(),
                  "python": platform.python_version(), "jax": jax.__version__,
                  "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}))
EOF

# 1. The fast tests that need no display and no Ray (V-trace, losses, optimizer, learner, the
#    recurrent core): the math on this backend.
step tests 100 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_vtrace.py tests/test_losses.py \
    tests/test_optim.py tests/test_learner.py tests/test_loss_reduction.py -k "not cartpole"

# 2. Learner samples/s: the deep IMPALA CNN at the paper's batch (32 x 20) and larger, the MLP
#    and the LSTM; one device of the default platform.
if [ -n "$QUICK" ]; then ATARI=4; PLATFORM=cpu; else ATARI=32,128,256; PLATFORM=default; fi
step learner 130 "$PY" -m benchmarks.learner $QUICK --platform "$PLATFORM" --atari-batches "$ATARI"

# 3. Pong-v5 end to end against raw envpool on the same cores: 16 envpool threads (this
#    machine's cores), the deep network, the paper's batch; the runner's two groups on and off.
if [ -n "$QUICK" ]; then ENVS=16; THREADS=1; ENC=nature_cnn; BATCH=160; BUDGET=20
else ENVS=64; THREADS=16; ENC=impala_cnn; BATCH=640; BUDGET=50; fi
for split in on off; do
    step "pong_split_$split" 90 "$PY" -m benchmarks.end_to_end --env pong $QUICK \
        --pong-envs $ENVS --pong-threads $THREADS --pong-encoder $ENC --pong-batch $BATCH \
        --split $split --budget-s $BUDGET --name "pong_split_$split"
done

# 4. CartPole time to 450, launch to exit (quick: fewer seeds).
step time_to_450 150 "$PY" -m benchmarks.time_to_450 --quick

say "done in $(($(date +%s) - started)) s; results in $OUT"
ls -la "$OUT" | tee -a "$LOG"
