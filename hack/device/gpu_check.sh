#!/usr/bin/env bash
# One device call's worth of GPU checks (the H200 of the device tool, or any CUDA host).
# Usage: hack/device/gpu_check.sh SECTION...   sections: tests verify faults bench
# Results land in $OUT (default .bench/gpu) as a handful of files; a summary prints last.
set -uo pipefail
OUT=${OUT:-.bench/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=runtime:${PYTHONPATH:-} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
summary="$OUT/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
say "== $(python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)')"
for section in "$@"; do
  case $section in
  tests)
    t0=$(date +%s)
    python3 -m pytest tests/runtime -m gpu -q -p no:cacheprovider -o addopts="-ra" --timeout 900 >"$OUT/gpu-tests.log" 2>&1
    rc=$?
    say "tests: exit $rc in $(( $(date +%s) - t0 ))s: $(tail -1 "$OUT/gpu-tests.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20 | tee -a "$summary"
    ;;
  verify)
    for run in cold warm; do
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
    for f in $(python3 -m clef_runtime faults | awk '{print $1}'); do
      for dt in f16 bf16; do
        CLEF_RUNTIME_FAULT=$f python3 -m clef_runtime verify --suite full --dtype $dt --report "$OUT/fault.json" \
          --termination-log "$OUT/fault-compact.json" 2>>"$OUT/verify.log" </dev/null
        rc=$?
        # shellcheck disable=SC2016
        say "fault $f $dt: exit $rc: $(python3 -c "import json;d=json.load(open('$OUT/fault-compact.json'));print(d['summary'][:300])")"
      done
    done
    rm -f "$OUT/fault.json"
    ;;
  bench)
    python3 -m clef_runtime bench --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
    say "bench: exit $?"
    tail -40 "$OUT/bench.log" | tee -a "$summary"
    ;;
  *) echo "unknown section $section" >&2; exit 2 ;;
  esac
done
