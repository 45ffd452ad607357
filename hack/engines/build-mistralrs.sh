#!/usr/bin/env bash
# Build mistral.rs 0.8.1 (the `mistralrs` CLI, CPU only) from the crate registry, with one local
# patch, into a cache keyed by its pins:
#
#   ~/.cache/clef/mistralrs-0.8.1-<digest>/bin/mistralrs
#
# <digest> covers the pinned versions, the crates' sha256 sums, the patch and the build flags, so
# changing any of them builds into a new directory and never reuses a stale binary.
#
# THE PATCH (hack/engines/mistralrs-core-0.8.1-cpu-contiguous.patch) is ours, not upstream's:
# stock 0.8.1 cannot serve any Qwen3.5 checkpoint on the CPU. Qwen3.5's partial rotary embedding
# leaves q/k non-contiguous, and the CPU attention kernel asserts contiguous rows
# (`attention/backends/cpu.rs:609 q must have contiguous rows`), so every request gets HTTP 500.
# The patch makes q, k and v contiguous right before the CPU attention call in
# mistralrs-core's src/attention/mod.rs. It changes memory layout only, not arithmetic. It is
# applied to an unpacked copy of the mistralrs-core crate and wired in through
# `[patch.crates-io]`; installed files and the registry cache are never edited.
#
# Everything else is pinned by the Cargo.lock that mistralrs-cli 0.8.1 publishes (the same
# dependency set as `cargo install mistralrs-cli --version 0.8.1 --locked`); the script checks
# that the patch changed nothing in that lock but the source of mistralrs-core itself.
#
# Cost here: about 22 min on 2 idle cores for a cold build (4244 s when niced on a 2-core machine
# shared with other builds, 2026-12-04), about 2 GB of build directory, a 98 MB binary. Needs only
# crates.io.
#
# Usage: hack/engines/build-mistralrs.sh [--print-dir]
#   --print-dir   print the cache directory and exit (0 if built, 1 if not)
set -euo pipefail

VERSION=0.8.1
CLI_SHA256=26bc2a0267ea22fa09eb61c6e78257f58d2704671c9666527ccb91a29275939c
CORE_SHA256=a2b8b9e5c94491d9ceeded3a30291cb6af6ae74810a5776dd55e3bbb8b3429d4
CARGO_FLAGS=(--release --bin mistralrs)
REGISTRY=https://static.crates.io/crates

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
patch_file=$here/mistralrs-core-$VERSION-cpu-contiguous.patch
cache_root=${CLEF_CACHE:-$HOME/.cache/clef}

digest=$(
  {
    echo "mistralrs $VERSION cli=$CLI_SHA256 core=$CORE_SHA256 flags=${CARGO_FLAGS[*]}"
    cat "$patch_file"
  } | sha256sum | cut -c1-12
)
out=$cache_root/mistralrs-$VERSION-$digest
bin=$out/bin/mistralrs

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$out"
  [[ -x $bin ]]
  exit
fi
if [[ -x $bin ]]; then
  echo "mistral.rs $VERSION (patched) already built: $bin"
  exit 0
fi

work=$cache_root/build/mistralrs-$VERSION-$digest
mkdir -p "$work"
cd "$work"

fetch() { # name sha256
  local crate=$1-$VERSION.crate
  if [[ ! -f $crate ]] || ! echo "$2  $crate" | sha256sum -c --quiet - 2>/dev/null; then
    curl -sSfL --retry 3 -o "$crate.part" "$REGISTRY/$1/$crate"
    mv "$crate.part" "$crate"
  fi
  echo "$2  $crate" | sha256sum -c --quiet -
  rm -rf "$1-$VERSION"
  tar xzf "$crate"
}
fetch mistralrs-cli "$CLI_SHA256"
fetch mistralrs-core "$CORE_SHA256"

patch -d mistralrs-core-$VERSION -p1 --forward --quiet < "$patch_file"

cli=mistralrs-cli-$VERSION
cp $cli/Cargo.lock Cargo.lock.published
cat >> $cli/Cargo.toml <<EOF

# Added by clef's hack/engines/build-mistralrs.sh: the CPU contiguity patch (see that script).
[patch.crates-io]
mistralrs-core = { path = "../mistralrs-core-$VERSION" }
EOF

export CARGO_TARGET_DIR=$work/target
start=$(date +%s)
echo "building mistral.rs $VERSION (patched) in $work; started $(date -u +%FT%TZ)"
(cd $cli && cargo build "${CARGO_FLAGS[@]}")

# The patch may move only mistralrs-core from the registry to the path; nothing else in the lock.
if ! diff <(grep -v -E '^(source|checksum) = ' Cargo.lock.published) \
  <(grep -v -E '^(source|checksum) = ' $cli/Cargo.lock) >/dev/null; then
  echo "error: the build resolved a dependency set other than mistralrs-cli $VERSION's Cargo.lock" >&2
  diff Cargo.lock.published $cli/Cargo.lock >&2 || true
  exit 1
fi
changed=$(diff Cargo.lock.published $cli/Cargo.lock | grep -c '^[<>]' || true)
if [[ $changed -gt 2 ]]; then
  echo "error: more than mistralrs-core's source and checksum changed in Cargo.lock" >&2
  diff Cargo.lock.published $cli/Cargo.lock >&2 || true
  exit 1
fi

mkdir -p "$out/bin"
cp "$CARGO_TARGET_DIR/release/mistralrs" "$bin.part"
mv "$bin.part" "$bin"
cp "$patch_file" "$out/"
secs=$(($(date +%s) - start))
{
  echo "mistralrs-cli $VERSION, mistralrs-core $VERSION + $(basename "$patch_file")"
  echo "built $(date -u +%FT%TZ) in ${secs}s with $(cargo --version)"
} > "$out/BUILD-INFO"
echo "built $bin in ${secs}s"
