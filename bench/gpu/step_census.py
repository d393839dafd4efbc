#!/usr/bin/env python3
"""What one steady training step launches on CUDA, counted without a GPU.

Runs `ctrain train` built against the CUDA emulator (tests/emu; the
emulator's CT_EMU_TRACE writes every queued kernel, cuDNN and cuBLASLt
call, copy and host wait) twice on synthetic data, for N and N + 1 steps,
and subtracts the counts: what is left is one step of the steady state
(set-up, algorithm searches, the first step's allocations and the final
evaluation cancel). Prints a markdown table: each kernel and library call
with its count, the library FLOPs of the step, and the totals (launches,
host waits).

  step_census.py --ctrain build/tests/emu/cli/ctrain --model alexnet \\
      --input 3x64x64 --batch 8 --precision fp16 [--classes 10] [--steps 3]

--check exits 1 when the step breaks a rule the CUDA step promises:
under fp16/bf16 every convolution pass runs in the 16-bit dtype (no f32
cuDNN call: the weight gradient is not widened), and the host never
synchronises a stream or the device in a steady step (it only waits on
the event of the lagged statistics read-back). The counts are the
emulator's: the real libraries may launch more kernels per call than the
one line each call writes here. --expect REGEX=N (repeatable) also
requires N calls per step whose "name detail" matches REGEX.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

CUDNN_FLOAT = "0"  # cudnnDataType_t CUDNN_DATA_FLOAT


def run(args, steps, trace):
    # The same data for both runs (its test quarter is the final
    # evaluation), an epoch longer than either: no epoch end inside them.
    n = args.batch * (args.steps + 5)
    cmd = [args.ctrain, "train", "--model", args.model, "--data", "synthetic:%d" % n, "--input", args.input,
           "--classes", str(args.classes), "--batch-size", str(args.batch), "--max-steps", str(steps),
           "--epochs", "1", "--device", "cuda", "--precision", args.precision, "--optimizer", "sgd",
           "--momentum", "0.9", "--threads", "1", "--workers", "0"] + args.extra
    env = dict(os.environ, CT_EMU_TRACE=trace, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("step_census: %s failed (%d):\n%s" % (" ".join(cmd), r.returncode, r.stderr[-2000:]))
    with open(trace) as f:
        return f.read().splitlines()


def key_of(line):
    """(kind, name, detail) of a trace line; the stream is left out."""
    parts = line.split(" ", 2)
    if len(parts) < 3:
        return ("?", line, "")
    what = parts[2]
    if what.startswith("kernel "):
        return ("kernel", what.split()[1], "")
    if what.startswith(("cudnn ", "cublasLt ")):
        kind, name, rest = (what.split(" ", 2) + [""])[:3]
        return (kind, name, re.sub(r" flops [0-9]+$", "", rest))
    if parts[0] == "sync" and what.startswith("emulator:"):
        return ("emulated NCCL drain", what, "")  # real NCCL orders this on the device
    if parts[0] == "sync":
        return ("host wait", what, "")
    return (what.split()[0], re.sub(r"[0-9]+ bytes", "N bytes", what), "")


def flops_of(line):
    m = re.search(r" flops ([0-9]+)$", line)
    return int(m.group(1)) if m else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctrain", required=True, help="ctrain built against the CUDA emulator")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--steps", type=int, default=3, help="steps of the shorter run (the step counted is the next)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--expect", action="append", default=[], metavar="REGEX=N",
                    help="fail unless the step's calls whose 'name detail' matches REGEX number N (repeatable)")
    ap.add_argument("extra", nargs="*", help="more ctrain flags (after --)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        a = run(args, args.steps, os.path.join(d, "a.txt"))
        b = run(args, args.steps + 1, os.path.join(d, "b.txt"))
    ca, cb = collections.Counter(map(key_of, a)), collections.Counter(map(key_of, b))
    step = {k: cb[k] - ca[k] for k in cb.keys() | ca.keys() if cb[k] != ca[k]}
    flops = sum(map(flops_of, b)) - sum(map(flops_of, a))
    bad = [k for k, v in step.items() if v < 0]
    print("# One steady training step: %s %s batch %d, %s (CUDA emulator trace)\n" %
          (args.model, args.input, args.batch, args.precision))
    print("| kind | name | detail | per step |")
    print("|---|---|---|---|")
    for k in sorted(step, key=lambda k: (k[0], k[1], k[2])):
        print("| %s | %s | %s | %d |" % (k[0], k[1], k[2], step[k]))
    total = collections.Counter()
    for k, v in step.items():
        total[k[0]] += v
    print("\nTotals per step: " + ", ".join("%s %d" % (k, total[k]) for k in sorted(total)) +
          "; cuDNN + cuBLASLt %.3g GFLOP" % (flops / 1e9))
    problems = []
    if bad:
        problems.append("counts fell from %d to %d steps (not a steady state): %s" % (args.steps, args.steps + 1, bad))
    if args.check:
        if args.precision in ("fp16", "bf16"):
            f32 = [k for k in step if k[0] == "cudnn" and re.search(r" dtype %s$" % CUDNN_FLOAT, k[2])]
            if f32:
                problems.append("f32 cuDNN passes under %s: %s" % (args.precision, f32))
        syncs = [k for k in step if k[0] == "host wait" and "cudaEventSynchronize" not in k[1]]
        if syncs:
            problems.append("host synchronises inside a steady step: %s" % syncs)
        if not any(k[0] == "cudnn" for k in step) and not any(k[0] == "cublasLt" for k in step):
            problems.append("no library call in the step: the trace or the subtraction is broken")
    for e in args.expect:
        rx, _, n = e.rpartition("=")
        got = sum(v for k, v in step.items() if re.search(rx, "%s %s" % (k[1], k[2])))
        if not rx or not n.isdigit():
            problems.append("--expect %r: give REGEX=N" % e)
        elif got != int(n):
            problems.append("%d calls per step match %r, expected %s" % (got, rx, n))
    for p in problems:
        print("step_census: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
