#!/usr/bin/env bash
# Makes preload/gpu/range_hash_ptx.h from preload/gpu/range_hash.cu (CUDA's nvcc needed).
# --check: exits 1 when the checked-in header differs from what nvcc makes now.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$nvcc" -ptx -arch=compute_75 -I"$root/preload" "$root/preload/gpu/range_hash.cu" -o "$tmp/k.ptx"
{
  echo "// Made by scripts/gen_range_hash_ptx.sh from range_hash.cu: do not edit."
  echo "#pragma once"
  echo
  echo "namespace offload::gpu {"
  echo "inline constexpr char kRangeHashPtx[] = R\"ptx("
  grep -v '^// Compiler Build ID\|^// Cuda compilation tools\|^// Based on NVVM' "$tmp/k.ptx"
  echo ")ptx\";"
  echo "}  // namespace offload::gpu"
} > "$tmp/range_hash_ptx.h"
if [ "${1:-}" = --check ]; then
  diff -q "$tmp/range_hash_ptx.h" "$root/preload/gpu/range_hash_ptx.h"
else
  cp "$tmp/range_hash_ptx.h" "$root/preload/gpu/range_hash_ptx.h"
fi
