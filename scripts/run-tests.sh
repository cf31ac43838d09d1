#!/usr/bin/env bash
# The test command (CI runs exactly this): the unit and integration tests, then again under
# AddressSanitizer and ThreadSanitizer. GPU checks live in scripts/gpu/ and never run here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh"
# promtool (Debian's prometheus package) checks the metrics page in the status tests.
if ! command -v promtool > /dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus > /dev/null
fi
# pip, setuptools and wheel (Debian's python3-pip) install the Python package offline in the
# install tests; Debian's python3 runs them, as a python3 earlier on PATH may lack wheel.
if ! { /usr/bin/python3 -m pip --version && /usr/bin/python3 -c "import setuptools, wheel"; } > /dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip python3-setuptools > /dev/null
fi
export LIBOFFLOAD_CI_PROMTOOL=1
jobs=$(nproc)
for variant in release address thread; do
  dir=build-test-$variant
  echo "== build and test: ${variant} (at ${SECONDS} s)"
  if [ "$variant" = release ]; then
    # The product as users build it (Release, -O3: GCC warns of some things only when
    # optimising), with -Werror and the tests; the Debian package is made from this tree.
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOFFLOAD_WERROR=ON -DCMAKE_INSTALL_PREFIX=/usr > /dev/null
  else
    # -g1: line tables only (sanitizer reports still name file and line) and a faster build.
    # -O1, as the sanitizers' own guides advise, assertions kept: the executor and simulated
    # driver run thousands of simulated steps, which -O0 makes much slower.
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-g1 -O1" -DOFFLOAD_SANITIZE="$variant" -DOFFLOAD_WERROR=ON > /dev/null
  fi
  cmake --build "$dir" -j "$jobs"
  # ThreadSanitizer finds races between threads. The suites that drive the shim's code from one
  # thread against the simulated driver (random programs, recorded replays, making ranges again)
  # give it none to find, and took 758 of its 1074 test-seconds, then the recompute suites 77 of
  # the 276 left; they run in the Release and AddressSanitizer builds. The suites with threads
  # (ResidencyThreads, RecomputeThreads) run in all three.
  exclude=""
  [ "$variant" != thread ] ||
    exclude='^(Residency|WeightStream|ExecutorRandom|CombinedPlan|ReplayCap|ReplayOffload|OffloadctlReplay|Recompute|RecomputeSmall|RecomputeFill|RecomputeUpdate|RecomputeWhy|RecomputeAhead)\.'
  # Every test has its own timeout; this one bounds what those cannot: ctest waits for a test's
  # output to close, which a stray child holding it would put off for ever. The processes left
  # then name the culprit.
  rc=0
  timeout -k 30 1500 ctest --test-dir "$dir" --output-on-failure -j "$jobs" -LE gpu ${exclude:+-E "$exclude"} || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "ctest of the ${variant} build did not end within 25 minutes; the processes still running:"
    ps -eo pid,ppid,etimes,stat,args --forest | grep -v -e ' ps -eo' -e '\[' || true
  fi
  [ "$rc" = 0 ] || exit "$rc"
done
echo "== install: offload-run's conventions, the Python package (its callbacks, pip install), and the Debian package (at ${SECONDS} s)"
tests/scripts/offload_run_test.sh build-test-release
PYTHONPATH=python python3 tests/scripts/python_package_test.py build-test-release/liboffload.so
/usr/bin/python3 tests/scripts/python_integrations_test.py build-test-release/liboffload.so
if [ "$(id -u)" = 0 ]; then
  tests/scripts/package_test.sh build-test-release
else
  echo "the Debian package test needs root (dpkg -i): not run here"
fi
# The hashing kernel's PTX, checked in (no CUDA compiler needed to build), is what its source makes.
if [ -x "${NVCC:-/usr/local/cuda/bin/nvcc}" ]; then
  scripts/gen_range_hash_ptx.sh --check || { echo "preload/gpu/range_hash_ptx.h is stale: run scripts/gen_range_hash_ptx.sh"; exit 1; }
fi
echo "== fuzz the wire protocol's decoder (bounded) (at ${SECONDS} s)"
scripts/run-fuzz.sh "${FUZZ_SECONDS:-30}"
echo "== the recorded traces: replay on the simulated driver and trace check (at ${SECONDS} s)"
# ckpt/: a checkpointed step, kept out of the loop over policies below, where its replay would take
# minutes (docs/results.md, "Recorded traces").
for t in tests/data/traces/*.trace tests/data/traces/ckpt/*.trace; do
  build-test-release/offloadctl replay "$t" > /dev/null
  build-test-release/offloadctl replay "$t" --cap 0.5 --steps 4 --scale 1024 > /dev/null  # the hard cap: about 6 s for all
done
# The hard cap's default and fourteen other policies (recompute among them), every launch's bytes checked, on the recorded steps that replay in a
# few seconds (lora and the reference take 10-20 s each): a policy changes which ranges and handles
# meet, and so which orderings are exercised.
# One replay per process, as many at once as there are cores.
for t in tests/data/traces/*.trace; do
  case $t in *lora.trace | *reference.trace) continue ;; esac
  for policy in OFFLOAD_CAP=1 OFFLOAD_CAP_WHOLE=0 OFFLOAD_CAP_EXTRA_PIECES=1 OFFLOAD_CAP_PIECE=0 OFFLOAD_CAP_TILE=class OFFLOAD_CAP_AHEAD_HORIZON=ceiling OFFLOAD_CAP_GRANT=apart \
    OFFLOAD_CAP_GATE=256KiB OFFLOAD_CAP_RECOMPUTE=1 OFFLOAD_CAP_PREFETCH_GROW=unwasted OFFLOAD_CAP_PREFETCH_ORDER=nearest OFFLOAD_CAP_VICTIMS=lru OFFLOAD_CAP_PREFETCH_HOLD=on OFFLOAD_CAP_PREFETCH_ROOM=off OFFLOAD_CAP_POOL_SHORT=512; do
    echo "$policy $t"
  done
done | xargs -P "$jobs" -L 1 sh -c 'env "$0" build-test-release/offloadctl replay "$1" --cap 0.5 --steps 10 > /dev/null ||
  { echo "replay --cap of $1 with $0 failed"; exit 255; }'
build-test-release/offloadctl trace check tests/data/traces > /dev/null
build-test-release/offloadctl trace check tests/data/traces/ckpt > /dev/null
echo "== the benchmark scripts: they compile, and the report scripts give known answers on made-up input"
python3 -m py_compile scripts/bench/*.py
python3 tests/scripts/bench_scripts_test.py > /dev/null
echo "all tests passed (in ${SECONDS} s)"
