#!/usr/bin/env python3
"""scripts/bench/planner_report.py's lower bound on made-up counters.

Plain 200 ms a step, the planner's forward : backward 1 : 3 (50 and 150 ms). Under the plan, 10
steps moved 11 GB out and 10 GB in (1.1 and 1.0 GB a step: an arena asked back before its copy
out ended stayed). At 50 GB/s each way: forward max(50, 22) = 50, backward max(150, 20) = 150,
bound 200 ms; at 5 GB/s: max(50, 220) + max(150, 200) = 420 ms, not the 440 that the planner's
1.1 GB both ways would give. Without the executor's counters, the planner's bytes_moved counts
both ways. At 20 GB/s: max(50, 55) + max(150, 50) = 205 ms. A run whose shim planned again after its timed steps (run.py's timed_plan: the plan they
ran) is bounded and predicted from the plan they ran, not from the one at the end (whose split,
300 : 25, would give 234.6 ms). Exit 1
otherwise."""
import os
import sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "scripts", "bench"))
import planner_report  # noqa: E402

plain = {"ms_per_step": 200.0}
planner = {"forward_ns": 1_000_000, "backward_ns": 3_000_000, "bytes_moved": 1_100_000_000}
run = {"shim": {"executor": {"steps_active": 10, "bytes_out": 11_000_000_000, "bytes_in": 10_000_000_000,
                             "planner": planner}}}
bare = {"shim": {"executor": {"planner": planner}}}
after = {"forward_ns": 300_000_000, "backward_ns": 25_000_000, "predicted_step_ns": 370_000_000}
replanned = {"shim": {"executor": {"steps_active": 10, "bytes_out": 11_000_000_000, "bytes_in": 10_000_000_000,
                                   "planner": after}},
             "timed_plan": {"planner": dict(planner, predicted_step_ns=353_000_000)}}
bad = []
for got, want, what in [
    (planner_report.moved_per_step(run), (1.1e9, 1.0e9), "bytes out / in per step"),
    (planner_report.lower_bound_ms(plain, run, 50.0, 50.0), 200.0, "bound at 50 GB/s"),
    (planner_report.lower_bound_ms(plain, run, 5.0, 5.0), 420.0, "bound at 5 GB/s"),
    (planner_report.moved_per_step(bare), (1.1e9, 1.1e9), "bytes without the executor's counters"),
    (planner_report.lower_bound_ms(plain, bare, 5.0, 5.0), 440.0, "bound without the executor's counters"),
    (planner_report.lower_bound_ms({}, run, 5.0, 5.0), None, "bound without plain"),
    (planner_report.lower_bound_ms(plain, replanned, 20.0, 20.0), 205.0, "bound from the plan the timed steps ran"),
    (planner_report.planner(replanned).get("predicted_step_ns"), 353_000_000, "prediction of the plan the timed steps ran"),
]:
    ok = got == want if not isinstance(want, float) else got is not None and abs(got - want) < 1e-9
    if isinstance(want, tuple):
        ok = all(abs(a - b) < 1e-3 for a, b in zip(got, want))
    if not ok:
        bad.append(f"{what}: {got} (want {want})")
if bad:
    print("planner_report.py:\n  " + "\n  ".join(bad))
    sys.exit(1)
print("planner_report.py: ok")
