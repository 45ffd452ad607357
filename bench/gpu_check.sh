#!/usr/bin/env bash
# One device call's worth of GPU checks (the H200 of the device tool, or any CUDA host).
# Usage: bench/gpu_check.sh SECTION...   sections: tests probe verify faults bench
# Results land in $OUT (default .bench/gpu) as a handful of files; a summary prints last.
set -uo pipefail
OUT=${OUT:-.bench/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=runtime:contract:${PYTHONPATH:-} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
summary="$OUT/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
say "== $(python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)')"
for section in "$@"; do
  case $section in
  tests)
    # One pytest process per file: an illegal memory access poisons the CUDA context, and one
    # crash must not fail every test after it.
    t0=$(date +%s)
    : >"$OUT/gpu-tests.log"
    for f in ${TEST_FILES:-tests/runtime/test_*.py}; do
      grep -q "mark.gpu" "$f" || continue
      python3 -m pytest "$f" -m gpu -q -p no:cacheprovider -o addopts="-ra" --timeout 900 >"$OUT/one.log" 2>&1
      rc=$?
      cat "$OUT/one.log" >>"$OUT/gpu-tests.log"
      say "tests $f: exit $rc: $(tail -1 "$OUT/one.log")"
      grep -E "^(FAILED|ERROR)" "$OUT/one.log" | head -12 | cut -c1-240 | tee -a "$summary"
    done
    rm -f "$OUT/one.log"
    say "tests: $(( $(date +%s) - t0 ))s"
    ;;
  probe)
    python3 bench/probe_chunk.py 2>&1 | tee -a "$summary"
    ;;
  verify)
    for run in ${VERIFY_RUNS:-cold warm}; do
      for dt in f16 bf16; do
        t0=$(date +%s.%N)
        python3 -m clef_runtime verify --suite full --dtype $dt --report "$OUT/verify-$dt.json" \
          --termination-log "$OUT/compact-$dt.json" 2>>"$OUT/verify.log"
        rc=$?
        say "verify full $dt ($run Triton cache): exit $rc in $(python3 -c "print(round($(date +%s.%N)-$t0,1))")s: $(python3 -c "import json;d=json.load(open('$OUT/verify-$dt.json'));print(d['summary'], '| peak GPU MiB', (d['peakGpuMemoryBytes'] or 0)>>20, '| durations', d['durations'])")"
      done
    done
    ;;
  faults)
    # f16: the full suite (the V100 path; fp16_state_overflow only exists there).  bf16: the
    # kernels suite, where every fault but fp16_state_overflow must show as well.
    for f in $(python3 -m clef_runtime faults | awk '{print $1}'); do
      for spec in "f16 full" "bf16 kernels"; do
        set -- $spec
        CLEF_RUNTIME_FAULT=$f python3 -m clef_runtime verify --suite $2 --dtype $1 --report "$OUT/fault.json" \
          --termination-log "$OUT/fault-compact.json" 2>>"$OUT/verify.log" </dev/null
        rc=$?
        say "fault $f $1 $2: exit $rc: $(python3 -c "import json;d=json.load(open('$OUT/fault-compact.json'));print(d['summary'][:300])")"
      done
    done
    rm -f "$OUT/fault.json"
    ;;
  bench)
    budget=${BENCH_TIMEOUT:-540}
    if [ -n "${DEADLINE:-}" ]; then budget=$(( DEADLINE - $(date +%s) )); fi
    say "bench: ${budget}s left"
    timeout "$budget" python3 -m clef_runtime bench ${BENCH_ARGS:-} --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
    say "bench: exit $?"
    tail -40 "$OUT/bench.log" | tee -a "$summary"
    ;;
  *) echo "unknown section $section" >&2; exit 2 ;;
  esac
done
