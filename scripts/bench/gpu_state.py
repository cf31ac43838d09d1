#!/usr/bin/env python3
"""What the GPU ran at during a run: the SM clock, power, temperature and the driver's reasons
for holding the clock down, from `nvidia-smi --query-gpu=... --format=csv,noheader -lms N`
samples (run.sh writes them beside each run as NAME.smi, in the column order of COLUMNS).

Only busy samples count (utilization at least --busy percent): model building and the bitwise
checks leave the GPU idle, and an idle GPU's clock says nothing about the steps.

    gpu_state.py RUN.smi [RUN.smi ...]      one line per run
    gpu_state.py --query                    the columns to ask nvidia-smi for (run.sh's query)
"""
import argparse
import statistics
import sys

# The columns asked of nvidia-smi, in this order (run.sh takes them from --query).
COLUMNS = ("timestamp", "utilization.gpu", "clocks.sm", "clocks.mem", "power.draw",
           "temperature.gpu", "clocks_event_reasons.active")

# nvidia-smi's clock event reason bits (nvmlClocksEventReasons).
REASONS = {0x1: "idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x20: "sync_boost", 0x40: "sw_thermal", 0x80: "hw_thermal", 0x100: "hw_power_brake",
           0x200: "display_clocks"}


def number(field):
    """'1980 MHz' -> 1980.0, '650.12 W' -> 650.12, '98 %' -> 98.0; None for '[N/A]' and the like."""
    try:
        return float(field.split()[0])
    except (ValueError, IndexError):
        return None


def samples(path):
    """The file's samples as dicts of COLUMNS; malformed lines (a header, a cut last line) skipped."""
    out = []
    with open(path) as f:
        for line in f:
            fields = [x.strip() for x in line.split(",")]
            if len(fields) != len(COLUMNS):
                continue
            s = dict(zip(COLUMNS, fields))
            s["util"] = number(s["utilization.gpu"])
            s["sm"] = number(s["clocks.sm"])
            s["power"] = number(s["power.draw"])
            s["temp"] = number(s["temperature.gpu"])
            try:
                s["reasons"] = int(s["clocks_event_reasons.active"], 16)
            except ValueError:
                s["reasons"] = None
            if s["util"] is None or s["sm"] is None:
                continue
            out.append(s)
    return out


def summary(rows, busy):
    """Figures over the busy samples: count, SM clock mean/median/min/max (the clock moves in
    steps of 15 MHz, so the mean tells runs apart where the median cannot), mean power, max temperature,
    and the share of samples each clock event reason was active in."""
    b = [s for s in rows if s["util"] >= busy]
    if not b:
        return {"samples": len(rows), "busy": 0}
    sm = [s["sm"] for s in b]
    power = [s["power"] for s in b if s["power"] is not None]
    temp = [s["temp"] for s in b if s["temp"] is not None]
    reasons = {}
    for bit, name in REASONS.items():
        n = sum(1 for s in b if s["reasons"] is not None and s["reasons"] & bit)
        if n:
            reasons[name] = n / len(b)
    return {"samples": len(rows), "busy": len(b), "sm_mean": statistics.fmean(sm), "sm_median": statistics.median(sm),
            "sm_min": min(sm), "sm_max": max(sm),
            "power_mean": statistics.fmean(power) if power else None,
            "temp_max": max(temp) if temp else None, "reasons": reasons}


def line(name, s):
    if not s["busy"]:
        return f"{name}: no busy samples (of {s['samples']})"
    p = f"{s['power_mean']:.0f} W" if s["power_mean"] is not None else "n/a"
    t = f"{s['temp_max']:.0f} C" if s["temp_max"] is not None else "n/a"
    r = ", ".join(f"{k} {v:.0%}" for k, v in sorted(s["reasons"].items())) or "none"
    return (f"{name}: {s['busy']} busy samples; SM clock mean {s['sm_mean']:.1f} MHz, median {s['sm_median']:.0f} "
            f"({s['sm_min']:.0f}-{s['sm_max']:.0f}); power {p} mean; temperature {t} at most; "
            f"clock held down by: {r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--busy", type=float, default=90, help="least utilization (%%) of a sample that counts")
    ap.add_argument("--query", action="store_true", help="print the nvidia-smi --query-gpu columns and stop")
    a = ap.parse_args()
    if a.query:
        print(",".join(COLUMNS))
        return 0
    if not a.files:
        ap.error("no sample files")
    for path in a.files:
        print(line(path.rsplit("/", 1)[-1].removesuffix(".smi"), summary(samples(path), a.busy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
