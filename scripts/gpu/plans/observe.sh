# Plans that observe without offloading: the workloads under the shim, determinism, cost, traces.
# Sourced by scripts/gpu/run.sh: the plans use its helpers (run, budget_of, check_pair, ...)
# and its variables ($work, $root, $ctl, $budget, ...), which they read or set for the helpers.
# shellcheck shell=bash disable=SC2034,SC2154

# smoke: every workload, small shapes, under the shim
plan_smoke() {
  run ref_small_r1 1 --workload reference --small --steps 8 --warmup 2
  run ref_small_r2 2 --workload reference --small --steps 8 --warmup 2
  run conv_small_r1 1 --workload convnet --small --steps 8 --warmup 2
  run llama_small_r1 1 --workload llama --small --steps 8 --warmup 2
  run llama_small_compile_r1 1 --workload llama --small --compile --steps 8 --warmup 3
}

# reference: determinism, shim on both routes, cost of observing, baselines
plan_reference() {
  # Determinism against itself, then with the shim (both routes).
  run reference_det_a 0 --workload reference --steps 10 --warmup 3 --deterministic
  run reference_det_b 0 --workload reference --steps 10 --warmup 3 --deterministic
  run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
  run reference_det_r2 2 --workload reference --steps 10 --warmup 3 --deterministic
  # Cost of observing: interleaved, default (fast) algorithms.
  for i in 1 2; do
    run reftime_plain_$i 0 --workload reference --steps 30 --warmup 5
    run reftime_shim_$i 1 --workload reference --steps 30 --warmup 5
  done
  run reference_ckpt 0 --workload reference --mode ckpt --steps 10 --warmup 3
  run reference_save_on_cpu 0 --workload reference --mode save_on_cpu --steps 5 --warmup 2
}

# conv_llama: the same for the convnet and the Llama-from-config model
plan_conv_llama() {
  for w in convnet llama; do
    run ${w}_det_a 0 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_b 0 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_r1 1 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_r2 2 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_ckpt 0 --workload $w --mode ckpt --steps 10 --warmup 3
    run ${w}_save_on_cpu 0 --workload $w --mode save_on_cpu --steps 5 --warmup 2
  done
}

# all_eager: reference (determinism, shim, cost) + conv_llama, in one run
plan_all_eager() {
  # One run's worth: every eager workload's determinism and visibility, the cost of
  # observing, and the convnet/llama baselines.
  run reference_det_a 0 --workload reference --steps 10 --warmup 3 --deterministic
  run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
  run reference_det_r2 2 --workload reference --steps 10 --warmup 3 --deterministic
  run reftime_plain_1 0 --workload reference --steps 30 --warmup 5
  run reftime_shim_1 1 --workload reference --steps 30 --warmup 5
  for w in convnet llama; do
    run ${w}_det_a 0 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_b 0 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_r1 1 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_r2 2 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_ckpt 0 --workload $w --mode ckpt --steps 5 --warmup 2
    run ${w}_save_on_cpu 0 --workload $w --mode save_on_cpu --steps 5 --warmup 2
  done
}

# compiled: the Llama model under torch.compile
plan_compiled() {
  run llamac_det_a 0 --workload llama --compile --steps 8 --warmup 4 --deterministic
  run llamac_det_b 0 --workload llama --compile --steps 8 --warmup 4 --deterministic
  run llamac_det_r1 1 --workload llama --compile --steps 8 --warmup 4 --deterministic
  run llamac_det_r2 2 --workload llama --compile --steps 8 --warmup 4 --deterministic
}

# traces: record the step traces kept in tests/data/traces/
plan_traces() {
  # Record the step traces that tests/data/traces/ keeps (with GPU times).
  run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
  run convnet_det_r1 1 --workload convnet --steps 10 --warmup 3 --deterministic
  run llamac_det_r1 1 --workload llama --compile --steps 8 --warmup 4 --deterministic
}

# final: visibility, event timing (CUPTI off / taken over), offloadd
plan_final() {
  # The shim as committed: CUPTI visibility, event timing with CUPTI off, event timing
  # after torch.profiler takes CUPTI over, and the offloadd the shim starts itself.
  run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
  run reference_nocupti 1n --workload reference --steps 10 --warmup 3
  run reference_profiled 1 --workload reference --steps 20 --warmup 3 --profile
  "$bin/offloadctl" status > "$work/offloadctl-status.txt" 2>&1; cat "$work/offloadctl-status.txt"
  "$bin/offloadctl" stop
}

# cost: cost of observing: reference and convnet, CUPTI on and off
plan_cost() {
  # Where the launch-bound convnet's overhead goes: the shim with and without CUPTI.
  run convtime_plain 0 --workload convnet --steps 20 --warmup 3
  run convtime_shim 1 --workload convnet --steps 20 --warmup 3
  run convtime_shim_nocupti 1n --workload convnet --steps 20 --warmup 3
  run reftime_plain_2 0 --workload reference --steps 30 --warmup 5
  run reftime_shim_2 1 --workload reference --steps 30 --warmup 5
}
