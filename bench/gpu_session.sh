#!/usr/bin/env bash
# One prepared run on a lent GPU machine, about 12 minutes in all (SESSION_S): what the GPU paths of issue 48
# need measured there, in this order, each step bounded so that the last still gets its share:
#   1. nvidia-smi (the GPU, its driver: which extra runs, deploy/gpu_extra.py), nproc, load average;
#   2. make gpu-check in its own .venv-gpu (CHECK_S, default 300 s; GPU_CHECK_ARGS, default the three
#      checks the GPU stack changes: faiss_gpu, onnx_cuda, starter_cuda), or with GPU_CHECK_PYTHON set, that
#      interpreter as it is (a GPU image, or wheels carried to a machine without a package index);
#   3. bench/gpu_scale.py --sizes SIZES (default 1000000,10000000) with the time left as its budget, with
#      the GPU stack's interpreter (.venv-gpu's, else GPU_CHECK_PYTHON, else python3).
# Everything goes under $OUT (the device tool's folder) or OUT_DIR: session.log, nvidia-smi.txt,
# gpu-check.json, gpu-scale.json. Without a GPU (a rehearsal) step 2 stops at once (exit 2) and step 3 runs
# on the CPU alone:
#   SIZES=20000 QUERIES=500 SCALE_PYTHON=.venv/bin/python bash bench/gpu_session.sh
# STEPS=check or STEPS=scale runs one of steps 2 and 3 (default both): a machine whose commands may run at most
# 10 minutes each takes the session as two calls, e.g. STEPS=check SESSION_S=330, then STEPS=scale
# SESSION_S=570 (the second reuses the first's .venv-gpu where the machine is kept between them).
# Exit status: gpu_scale's (0 when it wrote its figures; gpu-check's alone with STEPS=check).
set -u -o pipefail
cd "$(dirname "$0")/.."

SESSION_S=${SESSION_S:-720}
CHECK_S=${CHECK_S:-300}
SIZES=${SIZES:-1000000,10000000}
QUERIES=${QUERIES:-10000}
GPU_CHECK_ARGS=${GPU_CHECK_ARGS:---only faiss_gpu,onnx_cuda,starter_cuda}
STEPS=${STEPS:-check,scale}
OUT_DIR=${OUT:-${OUT_DIR:-bench/results/gpu-session-$(date +%F)}}
mkdir -p "$OUT_DIR"
started=$(date +%s)
left() { echo $((SESSION_S - ($(date +%s) - started))); }

session() {
echo "== gpu_session: $(date -u +%FT%TZ), budget ${SESSION_S} s, sizes ${SIZES}, out ${OUT_DIR}"
echo "== machine: $(nproc) CPUs, load average $(cat /proc/loadavg)"
if nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1; then
    cat "$OUT_DIR/nvidia-smi.txt"
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)
    echo "== driver ${driver}: $(python3 deploy/gpu_extra.py auto --driver "$driver" 2>&1 >/dev/null)"
else
    echo "== no nvidia-smi or no GPU: a CPU rehearsal"
fi

# 2. make gpu-check. With GPU_CHECK_PYTHON it installs nothing; else into .venv-gpu, which needs a package
# index (or PIP_FIND_LINKS / PIP_NO_INDEX pointing at carried wheels).
reserve=$([[ ,$STEPS, == *,scale,* ]] && echo 120 || echo 15)
check_s=$((CHECK_S < $(left) - reserve ? CHECK_S : $(left) - reserve))
check_status=0
if [[ ,$STEPS, != *,check,* ]]; then
    echo "== make gpu-check not asked for (STEPS=${STEPS})"
elif [ "$check_s" -ge 30 ]; then
    echo "== make gpu-check (at most ${check_s} s): ${GPU_CHECK_ARGS}"
    timeout --signal=INT --kill-after=15 "$check_s" \
        make --no-print-directory gpu-check GPU_CHECK_ARGS="${GPU_CHECK_ARGS} --out $OUT_DIR/gpu-check.json"
    check_status=$?
    echo "== make gpu-check: exit ${check_status} after $(($(date +%s) - started)) s"
else
    echo "== make gpu-check skipped: ${check_s} s left for it"
fi

# 3. gpu_scale, with the interpreter that holds the GPU stack (SCALE_PYTHON to choose; SCALE_ARGS: more options).
if [[ ,$STEPS, != *,scale,* ]]; then
    return "$check_status"
fi
if [ -n "${SCALE_PYTHON:-}" ]; then
    PY=$SCALE_PYTHON
elif [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    PY=$GPU_CHECK_PYTHON
elif [ -x .venv-gpu/bin/python ] && .venv-gpu/bin/python -c "import faiss" 2>/dev/null; then
    PY=.venv-gpu/bin/python
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY=python3
fi
budget=$(($(left) - 45))
echo "== bench/gpu_scale.py with ${PY}, budget ${budget} s"
timeout --signal=INT --kill-after=15 $(($(left) - 15)) \
    env PYTHONUNBUFFERED=1 "$PY" bench/gpu_scale.py --sizes "$SIZES" --queries "$QUERIES" \
    --budget-s "$budget" --out "$OUT_DIR/gpu-scale.json" ${SCALE_ARGS:-} > "$OUT_DIR/gpu-scale.txt"
status=$?
sed -n '/^| vectors/,$p' "$OUT_DIR/gpu-scale.txt"
echo "== gpu_scale: exit ${status}; session $(($(date +%s) - started)) s; load average $(cat /proc/loadavg)"
return "$status"
}

# The log is complete when the script returns: the pipeline waits for tee.
session 2>&1 | tee -a "$OUT_DIR/session.log"
exit "${PIPESTATUS[0]}"
