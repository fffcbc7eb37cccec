#!/usr/bin/env bash
# The device checks as one prepared call on a lent GPU, inside one 10-minute device command
# (TOTAL_S, default 540 s of wall time from this script's start, the Opacus install included):
#
#   bash benchmarks/gpu_check.sh          # on the device machine, from the repository root
#
# In order of what they decide (each under its own time limit, cut to what is left of TOTAL_S;
# a step with less than 30 s left is skipped):
# 1. gpu_overhead (<= 330 s): long fits, the Opacus GroupNorm CNN (d = 1,070,986) on
#    CIFAR-10-sized random data, the baseline fit sized by a calibration to last >= 60 s, then
#    one block of baseline / CanaryAudit / all three callbacks (--budget-s 300: a second block
#    only if it still fits): the ratios (targets <= 1.10 and <= 1.15), the fit-start, per-epoch
#    and fit-end costs and the per-step marginal audit time (target <= 0.5 ms), with pass/fail
#    fields; results/gpu_overhead_cuda_long.json, rewritten after each fit;
# 2. ops_per_step (<= 120 s): the aten ops and CUDA kernels the audit adds to one step of the
#    6- and 48-tensor MLPs and the transformer, 10 timed steps; results/ops_per_step_cuda.json;
# 3. per_step_profile (<= 150 s, what is left): where the Opacus step's audit work goes;
#    results/per_step_profile_cuda.json.
# (fwht_speed, the transform against the loop, met its target in an earlier call, 6.9x at 2^21
# on an H200: `bash benchmarks/gpu_check.sh fwht` adds it at the end.)
#
# The results are written to benchmarks/results/ as usual and, when $OUT is set (the device
# machine sets it), copied there as soon as each step ends (killed or not: gpu_overhead's file
# then holds the fits it finished), so a call cut short keeps what finished.
# Opacus is installed from .whl/ into /tmp/site when the machine's Python lacks it (here, first:
# pip download --no-deps --only-binary=:all: -d .whl opacus==1.6.0; then carry .whl).
#   ACCEL=cpu QUICK=1 bash benchmarks/gpu_check.sh    # every step's smoke test on a CPU (~1.5 min)
#   DRY_RUN=1 bash benchmarks/gpu_check.sh            # the steps and their limits (each step taking
#                                                     # all of its limit), run nothing
set -uo pipefail

OUT=${OUT:-}  # set by the device machine; empty: the results stay in benchmarks/results only
ACCEL=${ACCEL:-gpu}
PY=${PYTHON:-python3}
TOTAL_S=${TOTAL_S:-540}
DRY_RUN=${DRY_RUN:-}
START=$SECONDS
DRY_USED=0  # DRY_RUN: the seconds the steps printed so far may take
QUICK_FLAG=()
# gpu_overhead's long fits: 60 s on the GPU; a few seconds of tiny fits with QUICK
LONG=(--min-fit-s 60 --budget-s 300)
OPS=(--models mlp6,mlp48,transformer --steps 10)
if [[ -n "${QUICK:-}" ]]; then
    QUICK_FLAG=(--quick)
    LONG=(--min-fit-s 1 --opacus-examples 64 --opacus-batch-size 16 --val-examples 32)
    OPS=(--models mlp6,mlp48 --front-ends plain --steps 2)
fi
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [[ -n "$OUT" ]]; then  # the whole log comes back too, also when the call is cut short
    mkdir -p "$OUT"
    exec > >(tee "$OUT/gpu_check.log") 2>&1
    TEE_PID=$!
fi
STAMP=$(mktemp)

if [[ -z "$DRY_RUN" ]]; then
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
fi

status=0
step() {  # step SECONDS BENCHMARK ARGS...: python -m benchmarks BENCHMARK ARGS under a time limit
          # of SECONDS cut to what is left of TOTAL_S, then copy what it wrote to $OUT
    local limit=$1 rc left
    shift
    left=$((TOTAL_S - (SECONDS - START + DRY_USED) - 5))
    if ((left < limit)); then limit=$left; fi
    if ((limit < 30)); then
        echo "!! $1 skipped: ${left}s left of TOTAL_S=${TOTAL_S}"; status=1; return
    fi
    echo "== $(date +%T) [limit ${limit}s] $*"
    if [[ -n "$DRY_RUN" ]]; then DRY_USED=$((DRY_USED + limit)); return; fi  # the worst case: all of it
    touch "$STAMP"
    timeout "$limit" "$PY" -m benchmarks "$@" "${QUICK_FLAG[@]}" 2>&1 | grep -v -E "Warning: |warnings\.warn\(|rank_zero_warn\("
    rc=${PIPESTATUS[0]}
    if [[ $rc -ne 0 ]]; then echo "!! $1 stopped (exit $rc)"; status=1; fi
    if [[ -n "$OUT" ]]; then
        find benchmarks/results -maxdepth 1 -name '*.json' -newer "$STAMP" -exec cp {} "$OUT/" \;
    fi
}

step 330 gpu_overhead --accelerator "$ACCEL" --scenarios opacus "${LONG[@]}"
step 120 ops_per_step --accelerator "$ACCEL" "${OPS[@]}"
step 150 per_step_profile --accelerator "$ACCEL" --scenarios opacus
if [[ "${1:-}" == "fwht" ]]; then step 60 fwht_speed --accelerator "$ACCEL" --threads 0 --reps 9; fi
echo "== $(date +%T) done in $((SECONDS - START)) s"
rm -f "$STAMP"
if [[ -n "$OUT" ]]; then
    ls -l "$OUT"
    exec >&- 2>&-  # let tee write the log's last lines before the call returns
    wait "$TEE_PID" 2>/dev/null
fi
exit $status
