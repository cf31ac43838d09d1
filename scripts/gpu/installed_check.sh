#!/usr/bin/env bash
# liboffload from its installed files only, on a GPU machine with PyTorch and transformers.
# The Debian package (.carry/liboffload.deb, made by scripts/gpu/prepare.sh with DEB=1) is
# unpacked into a prefix; nothing from the build tree is used. Then, each against its plain run:
#   1. offload-run --budget (60% of plain's sampled peak) -- scripts/bench/run.py --workload
#      $WORKLOAD: losses and gradients bitwise equal;
#   2. a Hugging Face Trainer (scripts/bench/hf_trainer.py) with the package's OffloadCallback,
#      under offload-run at 60%: losses and final parameters bitwise equal;
#   3. torch.profiler, in the same Trainer process after training: the shim's copies named
#      (liboffload.profiler).
# Leaves $OUT/installed.txt and each run's RESULT line.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
steps=${STEPS:-20}
workload=${WORKLOAD:-reference}
prefix=$(mktemp -d)/root
dpkg -x "$root/.carry/liboffload.deb" "$prefix" || { echo "cannot unpack .carry/liboffload.deb" | tee "$out/installed.txt"; exit 1; }
export PATH="$prefix/usr/bin:$PATH" PYTHONPATH="$prefix/usr/lib/python3/dist-packages"
export CUBLAS_WORKSPACE_CONFIG=:4096:8 OFFLOAD_DAEMON=off
report="$out/installed.txt"
: > "$report"
say() { echo "$*" | tee -a "$report"; }
say "installed: $(offloadctl --version); offload-run: $(offload-run --version); python: $(python3 -c 'import liboffload; print(liboffload.__version__, liboffload.__file__)')"
ok=1
result() { grep '^RESULT ' "$1" | tail -1 | cut -c8-; }
field() { python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(eval(sys.argv[2]))" "$1" "$2" 2> /dev/null; }
same() {  # same TAG PLAIN OFFLOAD EXPR...: each expression equal in both results
  local tag=$1 a=$2 b=$3; shift 3
  for e in "$@"; do
    if [ -n "$(field "$a" "$e")" ] && [ "$(field "$a" "$e")" = "$(field "$b" "$e")" ]; then say "$tag: $e equal"
    else say "$tag: $e DIFFERS"; ok=0; fi
  done
}

# 1. A benchmark workload.
bench=(python3 "$root/scripts/bench/run.py" --workload "$workload" --mode plain --steps "$steps" --warmup 0 --deterministic)
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync timeout 300 "${bench[@]}" > "$out/bench-plain.log" 2>&1
plain=$(result "$out/bench-plain.log")
peak=$(field "$plain" "r['device_used_peak_bytes']")
budget=$(python3 -c "print(int(${peak:-0} * 0.6))")
say "bench $workload plain: peak $peak bytes; budget $budget"
timeout 400 offload-run --budget "$budget" -- "${bench[@]}" > "$out/bench-offload.log" 2>&1
off=$(result "$out/bench-offload.log")
same "bench $workload" "$plain" "$off" "r['losses_hex']" "r['grad_sha256']"
say "bench $workload offload: peak $(field "$off" "r['device_used_peak_bytes']") bytes (budget $budget); ms/step $(field "$plain" "round(r['ms_per_step'],1)") plain, $(field "$off" "round(r['ms_per_step'],1)") offload"

# 2 and 3. The Trainer with the callback, then a profiled step.
trainer=(python3 "$root/scripts/bench/hf_trainer.py" --steps "$steps")
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync timeout 300 "${trainer[@]}" > "$out/hf-plain.log" 2>&1
plain=$(result "$out/hf-plain.log")
peak=$(field "$plain" "r['device_used_peak_bytes']")
budget=$(python3 -c "print(int(${peak:-0} * 0.6))")
say "hf trainer plain: peak $peak bytes; budget $budget"
timeout 400 offload-run --budget "$budget" -- "${trainer[@]}" --callback --profile "$out/hf-profile.json" > "$out/hf-offload.log" 2>&1
off=$(result "$out/hf-offload.log")
same "hf trainer" "$plain" "$off" "r['losses_hex']" "r['param_sha256']"
say "hf trainer offload: peak $(field "$off" "r['device_used_peak_bytes']") bytes (budget $budget); shim $(field "$off" "r.get('shim')")"
say "profiler: $(field "$off" "r.get('profile')")"
[ "$(field "$off" "r['profile']['named'] > 0")" = True ] || { say "profiler: no copy named"; ok=0; }
gzip -f "$out/hf-profile.json" 2> /dev/null
if [ $ok = 1 ]; then say "installed files: all checks passed"; else say "installed files: CHECKS FAILED"; fi
