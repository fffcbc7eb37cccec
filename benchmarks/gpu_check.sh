#!/usr/bin/env bash
# The device checks of issue 28 as one prepared call on a lent GPU (about 6 minutes on an H200):
#
#   bash benchmarks/gpu_check.sh          # on the device machine, from the repository root
#
# 1. per_step_profile: where the per-step (per-round) canary work goes at d ~ 10^6
#    (target <= 0.5 ms a step);
# 2. fwht_speed: the Walsh-Hadamard transform against the butterfly loop (target >= 4x at 2^21);
# 3. gpu_overhead: what a user pays, audited / baseline fit time by interleaved pairs (targets
#    Opacus CNN <= 1.05x with CanaryAudit, <= 1.08x with all three callbacks; DP-FedAvg <= 1.03x
#    at 100 rounds), then one more fit per audited variant with every hook timed.
#
# Each step has its own time limit. The results are written to benchmarks/results/ as usual and,
# when $OUT is set (the device machine sets it), copied there as soon as each is written, so a
# call cut short keeps what finished.
# Opacus is installed from .whl/ into /tmp/site when the machine's Python lacks it (here, first:
# pip download --no-deps --only-binary=:all: -d .whl opacus==1.6.0; then carry .whl). ACCEL=cpu QUICK=1 runs every step's smoke test on a CPU.
set -uo pipefail

OUT=${OUT:-}  # set by the device machine; empty: the results stay in benchmarks/results only
ACCEL=${ACCEL:-gpu}
PY=${PYTHON:-python3}
QUICK_FLAG=()
if [[ -n "${QUICK:-}" ]]; then QUICK_FLAG=(--quick); fi
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [[ -n "$OUT" ]]; then mkdir -p "$OUT"; fi
STAMP=$(mktemp)

if ! "$PY" -c "import opacus" 2>/dev/null; then  # the device image has no Opacus: the carried wheel
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/opacus-*.whl || { echo "no Opacus and no .whl/opacus-*.whl"; exit 2; }
    export PYTHONPATH=.:/tmp/site
fi
"$PY" - <<'EOF' | tee "${OUT:-/tmp}/gpu_check_device.txt"
import torch, opacus, lightning
print("torch", torch.__version__, "cuda", torch.version.cuda, "opacus", opacus.__version__,
      "lightning", lightning.__version__)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
EOF

status=0
step() {  # step SECONDS BENCHMARK ARGS...: python -m benchmarks BENCHMARK ARGS under a time limit,
          # then copy what it wrote to $OUT
    local limit=$1 rc
    shift
    touch "$STAMP"
    echo "== $(date +%T) $*"
    timeout "$limit" "$PY" -m benchmarks "$@" "${QUICK_FLAG[@]}" 2>&1 | grep -v -E "Warning: |warnings\.warn\(|rank_zero_warn\("
    rc=${PIPESTATUS[0]}
    if [[ $rc -ne 0 ]]; then echo "!! $1 stopped (exit $rc)"; status=1; fi
    if [[ -n "$OUT" ]]; then
        find benchmarks/results -maxdepth 1 -name '*.json' -newer "$STAMP" -exec cp {} "$OUT/" \;
    fi
}

step 150 per_step_profile --accelerator "$ACCEL"
step 60 fwht_speed --accelerator "$ACCEL" --threads 0 --reps 9
step 330 gpu_overhead --accelerator "$ACCEL"
echo "== $(date +%T) done"
rm -f "$STAMP"
if [[ -n "$OUT" ]]; then ls -l "$OUT"; fi
exit $status
