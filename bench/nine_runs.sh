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
set -eu
BUILD=${1:-build}
EPOCHS=${2:-3}
FP16=${FP16:-1}
FP16_EPOCHS=${FP16_EPOCHS:-1}
CTRAIN=$(cd "$BUILD" && pwd)/ctrain
HERE=$(cd "$(dirname "$0")" && pwd)
OUT="$HERE/results/$(date +%Y-%m-%d)-cpu-nine-runs.md"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ROOT=
[ "$(id -u)" = 0 ] && ROOT=--allow-run-as-root
COMMON="--model cnn --data fashion-mnist --epochs $EPOCHS --optimizer adamw --lr 0.002 --scheduler plateau --lr-patience 3 --workers 1 --seed 0"

# run NAME STRATEGY PRECISION-FLAGS: trains, then prints "seconds accuracy".
run() {
  name=$1 strategy=$2
  shift 2
  dir="$TMP/$name"
  mkdir -p "$dir"
  case $strategy in
    single) "$CTRAIN" train $COMMON --batch-size 128 --threads 2 "$@" --log-dir "$dir" --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
    dp) "$CTRAIN" train $COMMON --batch-size 128 --strategy dp --devices cpu:0,cpu:1 --threads 1 "$@" --log-dir "$dir" \
          --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
    ddp) OMP_NUM_THREADS=1 mpirun -np 2 $ROOT --oversubscribe "$CTRAIN" train $COMMON --batch-size 64 --strategy ddp "$@" \
           --log-dir "$dir" --metrics-json "$dir/m.json" >"$dir/log" 2>&1 ;;
  esac
  /usr/bin/python3 - "$dir" <<'EOF'
import csv, json, statistics, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(d + "/history.csv")))
secs = [float(r["seconds"]) for r in rows]
m = json.load(open(d + "/m.json"))
print("%.1f %.4f" % (statistics.median(secs), m["test_accuracy"]))
EOF
}

START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
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
