#!/usr/bin/env bash
# The project's GPU checks, in one run of under 10 minutes on a machine with CUDA (the lent H200:
# python3 there has torch and triton; no project venv, no network). Nothing here runs in CI.
#
#     OUT=/some/dir QLM_CODE=$(git rev-parse --short HEAD) bash scripts/gpu_checks.sh [--quick]
#
# 1. env:          nvidia-smi, python/torch/triton versions; fails when torch sees no CUDA device.
# 2. triton_check: tests/engine/native/triton_check.py on `cuda`: the compiled Triton kernels
#                  (shared_prefix_decode, attend_slots; qlm/engine/native/triton_attention.py)
#                  against the torch path, five cases, atol 1e-4. This is the GPU form of
#                  tests/engine/native/test_triton.py, which runs the same script in Triton's
#                  interpreter and skips without the vLLM environment; pytest is not used here
#                  because the tests' conftests import the control plane's dependencies
#                  (pydantic, redis, ...), which the GPU machine lacks. No test carries the
#                  `gpu` marker yet.
# 3. benchmark:    benchmarks/shared_prefix_gpu.py --out $OUT/shared_prefix_gpu.json (the full
#                  sweep, 2 shapes x 5 prefixes x 4 batches; it has no quick mode; --quick here
#                  skips it), then a check of its results: 40 rows, every max_error <= 1e-4.
#                  Render the docs block where the project venv is:
#                  .venv/bin/python -m benchmarks.shared_prefix_gpu --render <results json>
#
# Logs and results land in $OUT (default /tmp/qlm-gpu-checks): env.log, triton_check.log,
# benchmark.log, shared_prefix_gpu.json, summary.log. Exits non-zero when any step failed.
# QLM_CODE is the commit recorded in the results (the device copy has no git); PYTHON picks the
# interpreter (default python3).

set -u -o pipefail
export PYTHONUNBUFFERED=1

cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/qlm-gpu-checks}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

failed=()
began=$(date +%s)

# step NAME TIMEOUT_S CMD...: run CMD under a timeout, output to the terminal and $OUT/NAME.log.
step() {
    local name=$1 limit=$2 start rc
    shift 2
    if declare -F "$1" >/dev/null; then set -- bash -c "$1"; fi  # timeout runs programs only
    start=$(date +%s)
    echo "== $name: $*"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "== $name: ok ($(($(date +%s) - start)) s)" | tee -a "$OUT/summary.log"
    else
        echo "== $name: FAILED, exit $rc ($(($(date +%s) - start)) s)" | tee -a "$OUT/summary.log"
        failed+=("$name")
    fi
}

env_check() {
    nvidia-smi || echo "(nvidia-smi failed)"
    "$PY" - <<'EOF'
import platform, sys
import torch, triton
print(f"python {platform.python_version()} at {sys.executable}")
print(f"torch {torch.__version__} (cuda {torch.version.cuda}), triton {triton.__version__}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
p = torch.cuda.get_device_properties(0)
print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs,"
      f" capability {p.major}.{p.minor}")
EOF
}

check_results() {
    "$PY" - "$OUT/shared_prefix_gpu.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
rows = report["rows"]
worst = max(r["max_error"] for r in rows)
print(f"{len(rows)} rows, code {report.get('code')}, largest error {worst:.1e}")
for shape in sorted({r["shape"] for r in rows}):
    point = [r for r in rows if (r["shape"], r["prefix_tokens"], r["batch"]) == (shape, 2048, 16)]
    if point:
        print(f"{shape} prefix 2048 batch 16: {point[0]['speedup_vs_paged']}x over paged")
sys.exit(0 if len(rows) == 40 and worst <= 1e-4 else 1)
EOF
}

export OUT PY
export -f env_check check_results
: >"$OUT/summary.log"
step env 60 env_check
step triton_check 180 "$PY" tests/engine/native/triton_check.py cuda
if [ "$QUICK" -eq 0 ]; then
    step benchmark 420 "$PY" -m benchmarks.shared_prefix_gpu \
        --out "$OUT/shared_prefix_gpu.json" ${QLM_CODE:+--code "$QLM_CODE"}
    step benchmark_check 30 check_results
fi

total=$(($(date +%s) - began))
if [ "${#failed[@]}" -eq 0 ]; then
    echo "gpu_checks: all passed in $total s" | tee -a "$OUT/summary.log"
else
    echo "gpu_checks: FAILED (${failed[*]}) in $total s" | tee -a "$OUT/summary.log"
    exit 1
fi
