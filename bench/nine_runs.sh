#!/bin/sh
# The seed's 9-run table on this machine: {fp32, autocast, autocast + loss
# scaling} x {single, DataParallel, DDP}, each with its epoch time (the
# median over the run's epochs) and final test accuracy, on real
# Fashion-MNIST with the torchkeras CNN (zoo `cnn`), AdamW and
# ReduceLROnPlateau as the seed's AlexNet recipe has them. Autocast is bf16
# on the CPU; fp16 (+ loss scaling) runs the half-precision correctness
# path here, so its three extra rows are labelled as such.
#
#   bench/nine_runs.sh [BUILD_DIR] [EPOCHS]   (defaults: build, 3)
#
# single: one process, 2 threads; DP: --devices cpu:0,cpu:1 (a thread
# each); DDP: mpirun -np 2 (a thread each). The global batch is 128
# everywhere (DDP: 64 per rank). Writes
# bench/results/<date>-cpu-nine-runs.md. FP16=0 leaves the fp16 rows out;
# they run FP16_EPOCHS epochs (1: the reference kernels are slow).
#
# DEVICE=cuda: the table on the machine's GPUs, torch.cuda.amp's columns
# (fp32, fp16 autocast without and with dynamic loss scaling). single:
# --device cuda; DP: --devices cuda:0,...,cuda:N-1 with N >= 2 GPUs, and
# with one GPU the virtual CPU devices (it says so); DDP: mpirun -np N, a
# GPU per rank (world size 1 on one GPU). Writes <date>-<gpu>-nine-runs.md
# (OUT_DIR: another folder). DATA (default fashion-mnist) names the data
# set, for a short rehearsal on the CUDA emulator.
set -eu
BUILD=${1:-build}
EPOCHS=${2:-3}
FP16=${FP16:-1}
FP16_EPOCHS=${FP16_EPOCHS:-1}
DEVICE=${DEVICE:-cpu}
DATA=${DATA:-fashion-mnist}
CTRAIN=$(cd "$BUILD" && pwd)/ctrain
HERE=$(cd "$(dirname "$0")" && pwd)
NGPU=1
MACHINE=cpu
if [ "$DEVICE" = cuda ]; then
  NGPU=$("$CTRAIN" devices | grep -c '^cuda:' || true)
  [ "$NGPU" -ge 1 ] || { echo "nine_runs.sh: DEVICE=cuda, but \`ctrain devices\` lists no GPU" >&2; exit 1; }
  MACHINE=$("$CTRAIN" devices | sed -n 's/^cuda:0[^A-Za-z]*\(NVIDIA \)\{0,1\}\([A-Za-z0-9]*\).*/\2/p' | head -1 | tr 'A-Z' 'a-z')
  FP16=0
fi
OUT="${OUT_DIR:-$HERE/results}/$(date +%Y-%m-%d)-${MACHINE:-gpu}-nine-runs.md"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ROOT=
[ "$(id -u)" = 0 ] && ROOT=--allow-run-as-root
COMMON="--model cnn --data $DATA --epochs $EPOCHS --optimizer adamw --lr 0.002 --scheduler plateau --lr-patience 3 --workers 1 --seed 0"

# run NAME STRATEGY PRECISION-FLAGS: trains, then prints "seconds accuracy".
run() {
  name=$1 strategy=$2
  shift 2
  dir="$TMP/$name"
  mkdir -p "$dir"
  case $DEVICE.$strategy in
    cpu.single) "$CTRAIN" train $COMMON --batch-size 128 --threads 2 "$@" --log-dir "$dir" --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
    cpu.dp) "$CTRAIN" train $COMMON --batch-size 128 --strategy dp --devices cpu:0,cpu:1 --threads 1 "$@" --log-dir "$dir" \
          --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
    cpu.ddp) OMP_NUM_THREADS=1 mpirun -np 2 $ROOT --oversubscribe "$CTRAIN" train $COMMON --batch-size 64 --strategy ddp "$@" \
           --log-dir "$dir" --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
    cuda.single) "$CTRAIN" train $COMMON --batch-size 128 --device cuda "$@" --log-dir "$dir" --metrics-json "$dir/m.json" \
          >"$dir/log" 2>&1 ;;
    cuda.dp) "$CTRAIN" train $COMMON --batch-size 128 --strategy dp --devices "$DP_DEVICES" "$@" --log-dir "$dir" \
          --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
    cuda.ddp) mpirun -np "$NGPU" $ROOT --oversubscribe "$CTRAIN" train $COMMON --batch-size $((128 / NGPU)) --device cuda \
           --strategy ddp "$@" --log-dir "$dir" --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
  esac || { echo "nine_runs.sh: $name failed:" >&2; tail -5 "$dir/log" >&2; exit 1; }
  /usr/bin/python3 - "$dir" <<'EOF'
import csv, json, statistics, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(d + "/history.csv")))
secs = [float(r["seconds"]) for r in rows]
m = json.load(open(d + "/m.json"))
print("%.1f %.4f" % (statistics.median(secs), m["test_accuracy"]))
EOF
}

# GPU: DataParallel over every GPU, or with one GPU over virtual CPU devices.
DP_DEVICES=cpu:0,cpu:1
if [ "$NGPU" -ge 2 ]; then
  DP_DEVICES=$(seq 0 $((NGPU - 1)) | sed 's/^/cuda:/' | paste -sd, -)
fi
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "$DEVICE" = cuda ]; then
  {
    echo "# The 9-run table on $NGPU GPU(s): precision x strategy ($(date +%Y-%m-%d))"
    echo
    echo "- machine: $("$CTRAIN" devices | grep '^cuda:' | head -1), $NGPU GPU(s); host $(lscpu | sed -n 's/^Model name: *//p')"
    echo "- code: $(git -C "$HERE" rev-parse --short HEAD)$(git -C "$HERE" diff --quiet || echo ' (with local changes)')"
    echo "- command: \`DEVICE=cuda bench/nine_runs.sh $BUILD $EPOCHS\`; every run: \`ctrain train $COMMON\` plus the strategy's and precision's flags"
    echo "- data: $DATA; global batch 128"
    echo "- strategies: single = \`--device cuda\`; DP = \`--strategy dp --devices $DP_DEVICES\`$([ "$NGPU" -lt 2 ] && echo ' (one GPU: DataParallel over GPUs needs two, so this row trains on virtual CPU devices)'); DDP = \`mpirun -np $NGPU\`, \`--strategy ddp --device cuda --batch-size $((128 / NGPU))\`$([ "$NGPU" -lt 2 ] && echo ' (world size 1: NCCL needs a GPU per rank)')"
    echo "- started $START, load average before $LOAD0"
    echo
    echo "Epoch time: the median of the run's $EPOCHS epochs (training only, from history.csv); accuracy: the test accuracy after the last epoch."
    echo
    echo "| | fp32 | autocast (fp16) | autocast (fp16) + loss scaling |"
    echo "| --- | --- | --- | --- |"
  } >"$TMP/table.md"
  fmt() { echo "$1" | awk '{printf "%s s, %s", $1, $2}'; }
  for s in single dp ddp; do
    if [ $s = ddp ] && ! command -v mpirun >/dev/null; then
      a="not run (no mpirun)" b=$a c=$a
    elif [ $s = dp ] && [ "$NGPU" -lt 2 ]; then
      # fp16 on virtual CPU devices is the reference kernels' correctness path.
      a=$(fmt "$(run "${s}_fp32" $s)") b="not run (fp16 on CPU devices)" c=$b
    else
      a=$(fmt "$(run "${s}_fp32" $s)")
      b=$(fmt "$(run "${s}_fp16" $s --precision fp16 --loss-scale none)")
      c=$(fmt "$(run "${s}_fp16s" $s --precision fp16 --loss-scale dynamic)")
    fi
    label=$s
    [ $s = dp ] && label=DataParallel
    [ $s = ddp ] && label=DDP
    echo "| $label | $a | $b | $c |" >>"$TMP/table.md"
  done
  echo >>"$TMP/table.md"
  echo "Finished $(date -u +%Y-%m-%dT%H:%M:%SZ), load average after $(cut -d' ' -f1-3 /proc/loadavg)." >>"$TMP/table.md"
  cp "$TMP/table.md" "$OUT"
  cat "$OUT"
  exit 0
fi
{
  echo "# The 9-run table on the CPU: precision x strategy ($(date +%Y-%m-%d))"
  echo
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB"
  echo "- code: $(git -C "$HERE" rev-parse --short HEAD)$(git -C "$HERE" diff --quiet || echo ' (with local changes)')"
  echo "- command: \`bench/nine_runs.sh $BUILD $EPOCHS\`; every run: \`ctrain train $COMMON\` plus the strategy's and precision's flags"
  echo "- data: Fashion-MNIST (60,000 train / 10,000 test, Debian's dataset-fashion-mnist); global batch 128"
  echo "- strategies: single = one process, 2 threads; DP = \`--strategy dp --devices cpu:0,cpu:1\` (a thread per device); DDP = \`mpirun -np 2\`, \`--strategy ddp --batch-size 64\` (a thread per rank)"
  echo "- started $START, load average before $LOAD0"
  echo
  echo "Epoch time: the median of the run's $EPOCHS epochs (training only, from history.csv); accuracy: the test accuracy after the last epoch."
  echo
  echo "| | fp32 | autocast (bf16) | autocast (bf16) + loss scaling |"
  echo "| --- | --- | --- | --- |"
} >"$TMP/table.md"
for s in single dp ddp; do
  a=$(run "${s}_fp32" $s)
  b=$(run "${s}_bf16" $s --precision bf16)
  c=$(run "${s}_bf16s" $s --precision bf16 --loss-scale dynamic)
  label=$s
  [ $s = dp ] && label=DataParallel
  [ $s = ddp ] && label=DDP
  fmt() { echo "$1" | awk '{printf "%s s, %s", $1, $2}'; }
  echo "| $label | $(fmt "$a") | $(fmt "$b") | $(fmt "$c") |" >>"$TMP/table.md"
done
if [ "$FP16" = 1 ]; then
  {
    echo
    echo "fp16 with loss scaling (\`--precision fp16\`, dynamic scaling by default) runs the half-precision reference"
    echo "kernels on the CPU: a correctness path, not a fast one; its times say nothing about fp16 on a GPU."
    echo "These runs train $FP16_EPOCHS epoch(s) (\`--epochs $FP16_EPOCHS\` after the common flags)."
    echo
    echo "| | fp16 + loss scaling (correctness path) |"
    echo "| --- | --- |"
  } >>"$TMP/table.md"
  for s in single dp ddp; do
    a=$(run "${s}_fp16" $s --precision fp16 --epochs "$FP16_EPOCHS")
    label=$s
    [ $s = dp ] && label=DataParallel
    [ $s = ddp ] && label=DDP
    echo "| $label | $(echo "$a" | awk '{printf "%s s, %s", $1, $2}') |" >>"$TMP/table.md"
  done
fi
echo >>"$TMP/table.md"
echo "Finished $(date -u +%Y-%m-%dT%H:%M:%SZ), load average after $(cut -d' ' -f1-3 /proc/loadavg)." >>"$TMP/table.md"
cp "$TMP/table.md" "$OUT"
cat "$OUT"
