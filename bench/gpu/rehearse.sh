#!/usr/bin/env bash
# bench/gpu/run_gpu.sh end to end without a GPU, so the first call on a GPU
# machine does not find the script's own mistakes: ctrain's rows run on the
# CUDA emulator (tests/emu: the CLI and bench_matmul/bench_linreg built
# against it), PyTorch's on the CPU (torch_gpu.py --device cpu), every size
# tiny, and time to accuracy on the first 1024/256 images of Fashion-MNIST.
# Then every row of the table is checked to hold the numbers a real run
# must give; the exit status says whether it did. No figure it produces is
# a GPU measurement, and the table says so.
#
# Usage (repo root, a build with the CUDA backend, i.e. nvcc found):
#   bench/gpu/rehearse.sh            # BUILD_DIR (build), OUT (a temp dir), PYTHON (/usr/bin/python3)
#   ROWS="tta cpugpu" bench/gpu/rehearse.sh    # some groups of rows only (run_gpu.sh's ROWS;
#                                              # kernels and convapi run only when named)
#   BUDGET_S=60 ROWS="s2d convapi" bench/gpu/rehearse.sh   # the time budget: rows past it
#                                              # skipped (at least one must be), the table still written
# About 8 minutes on the 2-core development machine, plus about 4.5 for the
# determinism group (2026-11-28).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-$(mktemp -d /tmp/ctrain-rehearsal.XXXXXX)}
FM_SRC=${FMNIST_SRC:-/usr/share/datasets/fashion-mnist}

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" >/dev/null
EMU=$BUILD/tests/emu/cli
[[ -x $EMU/ctrain && -x $EMU/bench/bench_matmul ]] || {
  echo "rehearse.sh: $BUILD has no CUDA emulator (built with the CUDA backend only, i.e. when nvcc and cuDNN are found)" >&2
  exit 1
}

# A small Fashion-MNIST: the first 1024 training and 256 test images.
FM=$OUT/fashion-mnist-small
mkdir -p "$FM"
"$PYTHON" - "$FM_SRC" "$FM" <<'PYEOF'
import gzip, os, sys
src, dst = sys.argv[1:]
for split, n in (("train", 1024), ("t10k", 256)):
    for kind, item in (("images-idx3-ubyte", 784), ("labels-idx1-ubyte", 1)):
        name = f"{split}-{kind}.gz"
        with gzip.open(os.path.join(src, name), "rb") as f:
            raw = f.read()
        nd = raw[3]
        head = bytearray(raw[:4 + 4 * nd])
        head[4:8] = n.to_bytes(4, "big")
        body = raw[4 + 4 * nd:4 + 4 * nd + n * item]
        with gzip.open(os.path.join(dst, name), "wb") as f:
            f.write(bytes(head) + body)
PYEOF

export OUT PYTHON BUILD_DIR=$BUILD SKIP_BUILD=1 REHEARSAL=1 QUICK=1
export CTRAIN=$EMU/ctrain BENCH_BIN=$EMU/bench TORCH_DEVICE=cpu
export W_ALEXNET="3x64x64 10 8" W_RESNET50="3x32x32 10 4" W_RESNET9="3x32x32 10 8" SYNTH_N=16
export MAXBATCH_CAP=128 FMNIST=$FM TTA_EPOCHS=2 TTA_TARGET=0.2
export MATMUL_SHAPE=256x64x256 LINREG_N=20000 LINREG_STEPS=20 PROFILE_STEPS=2
# The emulated device: 1 GiB, so the largest-batch search ends soon; one
# OpenMP thread, as in the emulator's tests.
export CT_EMU_MEM_MB=1024 OMP_NUM_THREADS=1
"$ROOT/bench/gpu/run_gpu.sh" >"$OUT/run.out" 2>"$OUT/run.err" || {
  echo "rehearse.sh: run_gpu.sh exited $?; its stderr:" >&2
  tail -n 30 "$OUT/run.err" >&2
  exit 1
}

TABLE=$(ls "$OUT"/*-gpu.md)
"$PYTHON" - "$TABLE" "${ROWS:-train s2d profile recompute maxbatch tta cpugpu determinism}" "${BUDGET_S:-}" <<'PYEOF'
import os, re, sys
num = r"[0-9]+(?:\.[0-9]+)?"
rows = [l.strip().strip("|").split("|") for l in open(sys.argv[1]) if l.startswith("| ") and "---" not in l]
rows = [[c.strip() for c in r] for r in rows[1:]]
bad = []
def need(cond, r, what):
    if not cond:
        bad.append(f"{r[0]} | {r[1]}: {what}")
kinds = {"throughput": 0, "recompute": 0, "largest": 0, "tta": 0, "matmul": 0, "linreg": 0, "skipped": 0}
budget = sys.argv[3]
for r in rows:
    w, mode, ci, ti, ratio, cp, tp, note = r
    if note.startswith("skipped: out of time"):
        kinds["skipped"] += 1
        need(budget and all(c == "-" for c in r[2:7]), r, "skipped without a budget, or with figures: " + note)
    elif "largest batch" in w:
        kinds["largest"] += 1
        m = re.search(rf"ctrain .*: ({num}) plain, ({num}) by default \(selective\), ({num}) with --recompute auto .*PyTorch .*: ({num}) plain, ({num}) with", note)
        need(m and all(float(v) > 0 for v in m.groups()), r, "a batch that is missing or 0: " + note)
    elif w.startswith("cnn fashion-mnist"):
        kinds["tta"] += 1
        need("run failed" not in note and "skipped" not in note, r, note)
        need(re.search(rf"ctrain ({num} s|not reached)", note) and re.search(rf"PyTorch ({num} s|not reached)", note), r, note)
    elif w.startswith(("matmul", "linreg")):
        kinds[w.split()[0]] += 1
        need(len(re.findall(rf"CPU {num} s, GPU {num} s", note)) == 2, r, "a time is missing: " + note)
    else:
        kinds["recompute" if "recompute" in mode else "throughput"] += 1
        for v, what in ((ci, "ctrain img/s"), (ti, "PyTorch img/s"), (ratio, "ratio")):
            need(re.fullmatch(num, v), r, f"{what} is {v!r}")
        mp = re.fullmatch(rf"({num})/({num})", cp)
        need(mp and float(mp.group(1)) >= float(mp.group(2)), r, f"ctrain peak (device/planned) is {cp!r}")
        if "CTRAIN_CUDA_S2D=" in mode:
            need(re.search(r"CTRAIN_CUDA_S2D=(auto|1|0): ", note), r, "not a space-to-depth row: " + note)
        if mode.endswith("deterministic"):
            need(re.search(rf"--deterministic, no --cudnn-benchmark \(without the mode, cuDNN's heuristic choice: {num} img/s",
                           note), r, "not a deterministic row, or its heuristic baseline is missing: " + note)
        named = re.search(r"recompute (cheap|norm|selective|off)$", mode)
        if named:
            need(f"--recompute {named.group(1)}:" in note, r, f"not the {named.group(1)} mode: " + note)
        elif "recompute" in mode:
            need(re.search(r"recompute auto: [0-9]+ segments", note), r, "no segment count: " + note)
groups = sys.argv[2].split()
want = {"throughput": 7 * ("train" in groups) + 6 * ("s2d" in groups) + 4 * ("convapi" in groups)
                      + 2 * ("determinism" in groups),
        "recompute": 2 * ("recompute" in groups) + 2 * ("train" in groups), "largest": "maxbatch" in groups,
        "tta": "tta" in groups, "matmul": "cpugpu" in groups, "linreg": "cpugpu" in groups}
# Under BUDGET_S the rows past it are skipped (one line may stand for a
# group's several): then each kind may fall short of its count, and at
# least one row must say it was skipped.
for k, n in want.items():
    if kinds[k] != n and not (budget and kinds[k] < n):
        bad.append(f"{n} {k} row(s) expected, {kinds[k]} found")
if budget and not kinds["skipped"]:
    bad.append(f"BUDGET_S={budget}: no row was skipped (rehearse a budget too small for ROWS)")
if "profile" in groups and not budget:
    prof = sys.argv[1].replace("-gpu.md", "-gpu-profile.md")
    text = open(prof).read() if os.path.exists(prof) else ""
    if text.count("per-layer medians of wall time between device syncs") != 2 or text.count("\nprofile of ") != 2:
        bad.append(f"{prof}: not two ctrain per-layer tables and two PyTorch op tables")
    if "failed" in text:
        bad.append(f"{prof}: a run failed")
if "convapi" in groups and not budget:
    ca = sys.argv[1].replace("-gpu.md", "-gpu-convapi.md")
    text = open(ca).read() if os.path.exists(ca) else ""
    if text.count("per-layer medians of wall time between device syncs") != 2 or ": engine " not in text:
        bad.append(f"{ca}: not two per-layer tables with graph API engines")
    if "failed" in text:
        bad.append(f"{ca}: a run failed")
if bad:
    print("rehearse.sh: the table has gaps:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"rehearse.sh: all {len(rows)} rows filled in ({sys.argv[1]})")
PYEOF
