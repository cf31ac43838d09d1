#!/usr/bin/env bash
# Fuzzes the wire protocol's decoding (tests/fuzz/frame_fuzzer.cpp) with libFuzzer for a
# bounded time: builds only the fuzzer, with clang, in its own build directory; seeds a
# corpus with valid frames of every type; exits non-zero if the fuzzer finds a crash (the
# input is then in $dir/fuzz-artifacts/ and replays with: offload_frame_fuzz_replay FILE).
#
#   scripts/run-fuzz.sh [SECONDS]      default 30; FUZZ_BUILD_DIR overrides build-fuzz
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-30}
dir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
if ! command -v clang++ > /dev/null; then
  echo "run-fuzz: clang++ not found (scripts/install-deps.sh installs clang and libclang-rt-dev)" >&2
  exit 2
fi
echo "== configure ($dir) and build the fuzzer with $(clang++ --version | head -1)"
mkdir -p "$dir"
CC=clang CXX=clang++ cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DOFFLOAD_SANITIZE= > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log" >&2; exit 1; }
cmake --build "$dir" --target offload_frame_fuzzer
fuzzer=$dir/tests/offload_frame_fuzzer

seeds=$dir/fuzz-seeds corpus=$dir/fuzz-corpus artifacts=$dir/fuzz-artifacts
rm -rf "$seeds" "$artifacts"
mkdir -p "$corpus" "$artifacts"
"$fuzzer" --write-seeds "$seeds"

echo "== fuzz for ${secs}s"
# New inputs go to the first directory (kept between runs); the seeds are read only.
set +e
"$fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "$seeds" 2>&1 | tee "$dir/fuzz.log" | \
  grep -E '^(#[0-9]+ +DONE|Done|stat::|==[0-9]+==|SUMMARY|.*invariant broken|INFO: Seed)' 
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] || ls "$artifacts"/* > /dev/null 2>&1; then
  echo "run-fuzz: the fuzzer failed (exit $rc); inputs in $artifacts, log in $dir/fuzz.log" >&2
  exit 1
fi
echo "run-fuzz: no crash in ${secs}s"
