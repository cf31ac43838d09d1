#!/usr/bin/env bash
# offload-run's conventions: --help and --version exit 0; --opt=value; usage errors are one line
# and a pointer to --help, status 2; the variables it sets; wrong combinations refused.
# Usage: tests/scripts/offload_run_test.sh BUILD_DIR
set -uo pipefail
run=$1/offload-run
fail=0
check() {  # check NAME EXPECTED ACTUAL
  if [ "$2" != "$3" ]; then echo "FAIL $1: expected [$2], got [$3]" >&2; fail=1; fi
}
out=$("$run" --help); check "--help status" 0 $?
[[ "$out" == usage:* ]] || { echo "FAIL --help text: $out" >&2; fail=1; }
out=$("$run" --version); check "--version status" 0 $?
[[ "$out" =~ ^offload-run\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ .+\)$ ]] || { echo "FAIL --version: $out" >&2; fail=1; }

env_of() { env -u PYTORCH_CUDA_ALLOC_CONF -u LD_PRELOAD "$run" "$@" -- sh -c 'echo "$LD_PRELOAD|$PYTORCH_CUDA_ALLOC_CONF|${OFFLOAD_DEVICE_BUDGET-}|${OFFLOAD_HOST_LIMIT-}|${OFFLOAD_LOG_LEVEL-}"'; }
lib=$(cd "$1" && pwd)/liboffload.so
check "sets the preload and the allocator" "$lib|backend:cudaMallocAsync|||" "$(env_of)"
check "--opt value" "$lib|backend:cudaMallocAsync|40GiB|64GiB|warn|" "$(env_of --budget 40GiB --host-limit 64GiB --log-level warn)|"
check "--opt=value" "$lib|backend:cudaMallocAsync|75%|||" "$(env_of --budget=75%)|"
check "Gi" "$lib|backend:cudaMallocAsync|40Gi|||" "$(env_of --budget 40Gi)|"
check "a share of the GPU, said so" "$lib|backend:cudaMallocAsync|75%gpu|||" "$(env_of --budget 75%gpu)|"
check "keeps other allocator options" "$lib|garbage_collection_threshold:0.8,backend:cudaMallocAsync|||" \
  "$(PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8 "$run" -- sh -c 'echo "$LD_PRELOAD|$PYTORCH_CUDA_ALLOC_CONF|||"')"
check "keeps the user's preloads after ours" "$lib /x.so" "$(LD_PRELOAD=/x.so "$run" -- sh -c 'echo "$LD_PRELOAD"' 2>/dev/null)"

refuse() {  # refuse NAME ARGS... : status 2, two lines on stderr (the error and the pointer)
  local name=$1; shift
  err=$("$@" 2>&1 >/dev/null); st=$?
  check "$name: status" 2 "$st"
  check "$name: lines" 2 "$(printf '%s\n' "$err" | wc -l)"
  [[ "$err" == *"--help"* ]] || { echo "FAIL $name: no pointer to --help: $err" >&2; fail=1; }
}
refuse "unknown option" "$run" --bogus -- true
refuse "no command" "$run" --budget 1GiB
refuse "bad budget" "$run" --budget lots -- true
refuse "budget over 100%" "$run" --budget 150% -- true
refuse "a share of a step" "$run" --budget 75%step -- true
refuse "bad host limit" "$run" --host-limit much -- true
refuse "bad log level" "$run" --log-level loud -- true
refuse "a missing value" "$run" --budget
refuse "another backend" env PYTORCH_CUDA_ALLOC_CONF=backend:native "$run" -- true
refuse "expandable segments" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$run" -- true
refuse "a library that is not there" "$run" --lib /nonexistent/liboffload.so -- true
# The command's own status comes back.
"$run" -- sh -c 'exit 7'; check "the command's status" 7 $?
[ $fail = 0 ] && echo "offload-run: all checks passed"
exit $fail
