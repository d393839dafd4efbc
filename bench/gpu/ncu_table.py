#!/usr/bin/env python3
"""Kernel-by-kernel time of a few training steps, from Nsight Compute.

Reads the CSV that

  ncu --import REPORT.ncu-rep --csv --page raw --print-units base \\
      --metrics gpu__time_duration.sum

prints for a run recorded with `ncu --profile-from-start off --metrics
gpu__time_duration.sum -o REPORT PROGRAM ...` where PROGRAM brackets the
steps with cudaProfilerStart/Stop (bench_train --profiler-range,
torch_gpu.py --profiler-range), and prints a Markdown table: each kernel
(the demangled name without its argument list), its launches, its total
time and time per step, and its share of the kernel time; then the
total. ncu runs every kernel alone, so the sum is the step's kernel time
without overlap or launch gaps, not its wall time.

  ncu_table.py --steps 2 --title "ctrain alexnet fp16" report.csv
"""
import argparse
import csv
import sys

UNIT_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
           "second": 1e3, "s": 1e3}
METRIC = "gpu__time_duration.sum"


def base_name(name):
    """'void ns::k<int, (1)>(float *, int)' -> 'ns::k<int, (1)>': the
    argument list is the first '(' outside template brackets."""
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    depth = 0
    for i, ch in enumerate(n):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            return n[:i]
    return n


def read(lines):
    """(kernel name, milliseconds) of every row; raises ValueError when the
    header, the metric column or a unit is missing."""
    rows = csv.reader(lines)
    header = None
    for row in rows:
        if "Kernel Name" in row and METRIC in row:
            header = row
            break
    if header is None:
        raise ValueError(f"no header row with 'Kernel Name' and '{METRIC}' (was the report recorded with that metric?)")
    ki, mi = header.index("Kernel Name"), header.index(METRIC)
    scale, out = None, []
    for row in rows:
        if len(row) <= max(ki, mi):
            continue
        if scale is None and not row[ki] and row[mi]:  # the units row
            if row[mi] not in UNIT_MS:
                raise ValueError(f"unit '{row[mi]}' of {METRIC}: expected one of {', '.join(sorted(UNIT_MS))}")
            scale = UNIT_MS[row[mi]]
            continue
        if not row[ki]:
            continue
        if scale is None:
            raise ValueError(f"no units row before the first kernel ('{row[ki]}')")
        out.append((base_name(row[ki]), float(row[mi].replace(",", "")) * scale))
    return out


def table(kernels, steps, title, top):
    per = {}
    for name, ms in kernels:
        n, t = per.get(name, (0, 0.0))
        per[name] = (n + 1, t + ms)
    total = sum(t for _, t in per.values())
    lines = [f"{title}: {len(kernels)} kernels over {steps} step(s), {total / steps:.3f} ms of kernel time a step", "",
             "| kernel | launches a step | ms a step | share |", "|---|---|---|---|"]
    ranked = sorted(per.items(), key=lambda kv: -kv[1][1])
    for name, (n, t) in ranked[:top]:
        short = name if len(name) <= 100 else name[:97] + "..."
        lines.append(f"| `{short}` | {n / steps:g} | {t / steps:.3f} | {100 * t / total if total else 0:.1f}% |")
    if len(ranked) > top:
        rest = ranked[top:]
        t = sum(v[1] for _, v in rest)
        lines.append(f"| {len(rest)} other kernels | {sum(v[0] for _, v in rest) / steps:g} | {t / steps:.3f} | "
                     f"{100 * t / total if total else 0:.1f}% |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="ncu --import ... --csv --page raw output ('-' for stdin)")
    p.add_argument("--steps", type=int, default=1, help="steps the range held")
    p.add_argument("--title", default="kernels")
    p.add_argument("--top", type=int, default=40, help="rows before the rest are summed")
    a = p.parse_args()
    if a.steps < 1:
        p.error("--steps must be at least 1")
    try:
        f = sys.stdin if a.csv == "-" else open(a.csv, newline="")
        with f:
            kernels = read(f)
    except (OSError, ValueError) as e:
        print(f"ncu_table.py: {a.csv}: {e}", file=sys.stderr)
        return 1
    if not kernels:
        print(f"ncu_table.py: {a.csv}: no kernel rows (did the program call cudaProfilerStart?)", file=sys.stderr)
        return 1
    sys.stdout.write(table(kernels, a.steps, a.title, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
