#!/usr/bin/env bash
# The demo. Sets up, builds, and shows what liboffload sees:
#   - on a machine with an NVIDIA GPU and PyTorch: runs the reference workload under the shim
#     (LD_PRELOAD, backend:cudaMallocAsync) with OFFLOAD_TRACE, then prints the per-step
#     table (launches vs CUPTI kernels, GPU time, activations) and checks it;
#   - without a GPU: replays the step traces recorded on the GPU (tests/data/traces/) through the
#     same pipeline on the simulated driver, prints the recorded tables, then replays them with
#     the executor evicting and reloading under a budget, every launch's data checked.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOFFLOAD_TESTS=OFF > /dev/null
cmake --build build > /dev/null
ctl=build/offloadctl

if nvidia-smi -L > /dev/null 2>&1 && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  trace=${OFFLOAD_TRACE:-$root/build/trace-reference}
  rm -rf "$trace"
  echo "== the reference workload under liboffload.so (traces in $trace)"
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD=$root/build/liboffload.so OFFLOAD_TRACE=$trace \
    python3 scripts/bench/run.py --workload reference --steps 10 --warmup 3 --deterministic | grep -v '^RESULT'
  echo; echo "== what the shim saw, per step"
  "$ctl" trace check "$trace"
else
  echo "== no GPU here: replaying steps recorded on an H200 (tests/data/traces/) on the simulated driver"
  for t in tests/data/traces/*.trace; do
    echo; echo "---- $t"
    "$ctl" replay "$t"
  done
  echo; echo "== what the shim saw on the GPU, per recorded step"
  "$ctl" trace check tests/data/traces
  # The planner on the reference step: what it would offload at 75% of the step's footprint,
  # the step time it predicts, and a picture (plan-reference-75.html).
  echo; echo "== the planner on the recorded reference step, at 75% of its footprint"
  "$ctl" plan --trace tests/data/traces/reference.trace --budget 75%step --html build/plan-reference-75.html
  echo "(picture: build/plan-reference-75.html)"
  # What outlives the step there (weights, optimizer state), and how long each sits unused.
  echo; echo "== what outlives the recorded reference step, and how long it sits unused"
  "$ctl" plan --trace tests/data/traces/reference.trace --persistent
  # Weight streaming on the recorded lora step (20.4 G frozen bf16 parameters, 37.9 GiB): the
  # weights the shim's pool serves (OFFLOAD_PERSISTENT_MIN=64MiB) go out and back between their
  # uses so that the step fits 20 GiB (docs/results.md has the GPU runs).
  echo; echo "== weight streaming on the recorded lora step, at 20 GiB"
  "$ctl" plan --trace tests/data/traces/lora.trace --budget 20GiB --persistent-min 64MiB
  echo; echo "== weight streaming that waits to meet 20 GiB: the recorded moe step (frozen base read-only, the pool"
  echo "   factor its run measured); no plan whose copies all hide meets the budget there"
  "$ctl" plan --trace tests/data/traces/marked/moe.trace --budget 20GiB --persistent-min 32MiB --read-only --pool-overhead 1.62
  # The executor on the same steps, running the planner's plans: evict and reload under the
  # budget the GPU runs used (docs/results.md), sizes scaled down, every launch's
  # data checked.
  for tf in reference:0.5 convnet:0.6 llama-compiled:0.8; do
    t=${tf%%:*}
    echo; echo "== the executor on the simulated driver: $t at ${tf#*:} of its peak"
    "$ctl" replay "tests/data/traces/$t.trace" --offload "${tf#*:}" --steps 10 | sed -n '/^offload:/,$p'
  done
fi

echo; echo "== offloadd: a shim connects, registers, and offloadctl shows the client"
# Only a plan of arenas (OFFLOAD_CAP=0) has the shim start offloadd; any shim connects to one running.
pool_dir=$(mktemp -d)
XDG_RUNTIME_DIR=$pool_dir build/offloadd --pool-size 256MiB --no-prefault > "$pool_dir/offloadd.log" 2>&1 &
for _ in $(seq 1 50); do XDG_RUNTIME_DIR=$pool_dir "$ctl" status > /dev/null 2>&1 && break; sleep 0.1; done
XDG_RUNTIME_DIR=$pool_dir OFFLOAD_TELEMETRY=off \
  LD_PRELOAD=$root/build/liboffload.so python3 - "$root/$ctl" <<'PY'
import ctypes, json, subprocess, sys, time
shim = ctypes.CDLL(None)
buf = ctypes.create_string_buffer(1 << 16)
for _ in range(50):  # the shim's worker connects in the background
    shim.offload_stats_json(buf, len(buf))
    if "offloadd at" in json.loads(buf.value)["host_pool"]:
        break
    time.sleep(0.1)
print("shim:", json.loads(buf.value)["host_pool"])
subprocess.run([sys.argv[1], "status"], check=True)
subprocess.run([sys.argv[1], "stop"], check=True)
PY

echo; echo "== several GPUs, one offloadd: two ranks of a job and the node's host link"
# As torchrun starts them (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE); each announces its rank once
# connected, and its GPU at its first plan (none here: no GPU). --node-link: the sums measured
# on two H200s of one host (docs/results.md).
node_dir=$(mktemp -d)
XDG_RUNTIME_DIR=$node_dir build/offloadd --pool-size 256MiB --no-prefault --node-link 102.68,107.58,137.69 \
  > "$node_dir/offloadd.log" 2>&1 &
for _ in $(seq 1 50); do XDG_RUNTIME_DIR=$node_dir "$ctl" status > /dev/null 2>&1 && break; sleep 0.1; done
rank_pids=()
for r in 0 1; do
  XDG_RUNTIME_DIR=$node_dir OFFLOAD_DAEMON=connect OFFLOAD_TELEMETRY=off RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 \
    LD_PRELOAD=$root/build/liboffload.so python3 -c '
import ctypes, json, time
shim = ctypes.CDLL(None)
buf = ctypes.create_string_buffer(1 << 16)
for _ in range(50):
    shim.offload_stats_json(buf, len(buf))
    if "offloadd at" in json.loads(buf.value)["host_pool"]:
        break
    time.sleep(0.1)
time.sleep(3)' &
  rank_pids+=($!)
done
for _ in $(seq 1 30); do  # both ranks connected and announced
  [ "$(XDG_RUNTIME_DIR=$node_dir "$ctl" status --json | grep -o '"rank":[0-9]' | wc -l)" -ge 2 ] && break
  sleep 0.1
done
XDG_RUNTIME_DIR=$node_dir "$ctl" status
wait "${rank_pids[@]}"
XDG_RUNTIME_DIR=$node_dir "$ctl" stop
