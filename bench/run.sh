#!/usr/bin/env bash
# ctrain beside PyTorch on this machine's CPU. Builds the benchmark programs
# if needed, measures the machine (fp32 GEMM ceiling, triad bandwidth), runs
# every workload for ctrain and for PyTorch in the same run, prints one
# Markdown table and writes it with the machine description and the raw
# output to bench/results/<date>-cpu.md. See bench/README.md.
#
# Usage: bench/run.sh [workload ...]      (default: every registered one)
# Environment: BUILD_DIR (default <repo>/build), PYTHON (/usr/bin/python3),
#   THREADS (2), OUT (result file), QUICK=1 (fewer runs, for trying it out),
#   BENCH_MALLOC=glibc-default (glibc's allocator defaults, see malloc_env.sh).
#
# Adding a workload: write a function wl_<name> that runs both sides, then
# calls `row` once (and `note` for details), add <name> to WORKLOADS and its
# programs to BENCH_TARGETS. Helpers: `result KEY FILE` reads KEY=value from
# the last RESULT line of FILE; `run_logged FILE cmd...` runs a command,
# keeps its output for the raw section and fails the workload if it fails.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
DATE=$(date +%Y-%m-%d)
OUT=${OUT:-$ROOT/bench/results/$DATE-cpu.md}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=$THREADS
. "$ROOT/bench/malloc_env.sh"

WORKLOADS=(matmul linreg cnn cnn_bf16 alexnet alexnet_bf16 resnet18 mlp)
BENCH_TARGETS=(bench_machine bench_matmul bench_linreg bench_train)
if [[ ${QUICK:-0} == 1 ]]; then RUNS_C=3 RUNS_T=1; else RUNS_C=7 RUNS_T=3; fi

ROWS=$TMP/rows.md NOTES=$TMP/notes.md RAW=$TMP/raw.md
: >"$ROWS"; : >"$NOTES"; : >"$RAW"

# ---- helpers -------------------------------------------------------------
load1() { cut -d' ' -f1 /proc/loadavg; }
result() { grep '^RESULT' "$2" | tail -n1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }
calc() { awk "BEGIN { printf \"$1\", $2 }"; }
calc_true() { awk "BEGIN { exit !($1) }"; }
note() { printf -- '- %s\n' "$*" >>"$NOTES"; }
# row WORKLOAD CTRAIN PYTORCH RATIO FRACTION: one table line; the load
# average at the workload's start and now is appended.
row() { printf '| %s | %s | %s | %s | %s | %s / %s |\n' "$1" "$2" "$3" "$4" "$5" "$WL_LOAD0" "$(load1)" >>"$ROWS"; }
run_logged() {
  local f=$1; shift
  echo "\$ $*" >"$f"
  if ! "$@" >>"$f" 2>&1; then
    cat "$f" >&2
    echo "command failed: $*" >&2
    return 1
  fi
  { echo '```'; cat "$f"; echo '```'; } >>"$RAW"
}
exe() { echo "$BUILD/bench/$1"; }

build() {
  if [[ ! -f $BUILD/CMakeCache.txt ]]; then cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null; fi
  cmake --build "$BUILD" -j"$THREADS" --target "${BENCH_TARGETS[@]}" >/dev/null
}

# ---- the machine -----------------------------------------------------------
CEIL= TRIAD=
measure_machine() {
  WL_LOAD0=$(load1)
  run_logged "$TMP/machine.txt" "$(exe bench_machine)" --gemm 2048 --runs "$RUNS_C"
  CEIL=$(result gemm_ceiling "$TMP/machine.txt")
  TRIAD=$(result triad_best "$TMP/machine.txt")
  MACHINE_LOAD="$WL_LOAD0 / $(load1)"
}

# ---- workloads ---------------------------------------------------------------
# 10000x200 @ 200x10000 fp32: 2*M*N*K = 40 GFLOP per product.
wl_matmul() {
  run_logged "$TMP/mm_c.txt" "$(exe bench_matmul)" 10000 200 10000 "$RUNS_C"
  run_logged "$TMP/mm_t.txt" "$PYTHON" "$ROOT/bench/torch_baselines.py" --threads "$THREADS" matmul \
    --m 10000 --k 200 --n 10000 --runs "$RUNS_C" --warmup 2
  local c t
  c=$(grep '^RESULT' "$TMP/mm_c.txt" | grep 'dtype=f32' | tr ' ' '\n' | sed -n 's/^gflops=//p')
  t=$(result gflops "$TMP/mm_t.txt")
  row "matmul fp32 10000x200 @ 200x10000 (GFLOP/s, median)" "$(calc %.1f "$c")" "$(calc %.1f "$t")" \
    "$(calc %.2fx "$c/$t")" "$(calc '%.2f / %.2f' "$c/$CEIL, $t/$CEIL")"
  local cb
  cb=$(grep '^RESULT' "$TMP/mm_c.txt" | grep 'dtype=bf16' | tr ' ' '\n' | sed -n 's/^gflops=//p' || true)
  note "matmul: ctrain cpu-time/threads estimate $(calc %.1f "2e-9*10000*200*10000/$(grep '^RESULT' "$TMP/mm_c.txt" | grep 'dtype=f32' | tr ' ' '\n' | sed -n 's/^cpu_s=//p')") GFLOP/s," \
    "PyTorch $(calc %.1f "2e-9*10000*200*10000/$(result cpu_s "$TMP/mm_t.txt")") GFLOP/s;" \
    "allocating torch.mm(a, b) $(calc %.1f "$(result alloc_gflops "$TMP/mm_t.txt")") GFLOP/s;" \
    "ctrain bf16 inputs (f32 out) ${cb:-n/a} GFLOP/s."
}

# 1M points, 2 features, 500 full-batch Adam steps (lr 0.01), same data and
# initial weights on both sides (bench_linreg writes them, PyTorch reads).
wl_linreg() {
  local data=$TMP/linreg.bin
  run_logged "$TMP/lr_c.txt" "$(exe bench_linreg)" --n 1000000 --steps 500 --lr 0.01 --runs "$RUNS_C" \
    --save-data "$data"
  run_logged "$TMP/lr_t.txt" "$PYTHON" "$ROOT/bench/torch_baselines.py" --threads "$THREADS" linreg \
    --data "$data" --steps 500 --lr 0.01 --runs "$RUNS_T" --warmup 1
  local c t gbs diff
  c=$(result median_s "$TMP/lr_c.txt")
  t=$(result median_s "$TMP/lr_t.txt")
  gbs=$(result gbs "$TMP/lr_c.txt")
  row "linreg 1M x 2, 500 Adam steps (s, median)" "$(calc %.3f "$c")" "$(calc %.3f "$t")" \
    "$(calc %.1fx "$t/$c")" "$(calc '%.2f of triad (%.1f GB/s; 12 MB data sits in L3)' "$gbs/$TRIAD, $gbs")"
  diff=$(awk -v a="$(result params "$TMP/lr_c.txt")" -v b="$(result params "$TMP/lr_t.txt")" 'BEGIN {
    n = split(a, x, ","); split(b, y, ","); m = 0
    for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > m) m = d }
    printf "%.3g", m }')
  note "linreg: loss at step 500 ctrain $(result loss_last "$TMP/lr_c.txt"), PyTorch $(result loss_last "$TMP/lr_t.txt");" \
    "after training ctrain $(result loss_final "$TMP/lr_c.txt"), PyTorch $(result loss_final "$TMP/lr_t.txt");" \
    "parameters (w0,w1,b) ctrain $(result params "$TMP/lr_c.txt"), PyTorch $(result params "$TMP/lr_t.txt"):" \
    "max |diff| $diff."
  note "linreg: cpu-time/threads estimates ctrain $(calc %.3f "$(result cpu_s "$TMP/lr_c.txt")") s," \
    "PyTorch $(calc %.3f "$(result cpu_s "$TMP/lr_t.txt")") s."
}

# Training throughput: bench_train (ctrain library, prepare + N timed steps
# of forward / cross-entropy / backward / Adam on in-memory random data)
# beside bench/torch_train.py (same model, shapes, threads, step). FLOPs
# are forward conv/linear MACs x2, x3 for a training step.
# train_row NAME LABEL STEPS WARMUP ARGS...
train_row() {
  local name=$1 label=$2 steps=$3 warm=$4; shift 4
  run_logged "$TMP/${name}_c.txt" env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=30000 "$(exe bench_train)" "$@" --threads "$THREADS" \
    --steps "$steps" --warmup "$warm"
  # Each side runs with its own default: the ctrain command bounds libgomp's
  # spin to 30,000 iterations (src/cli/main.c), PyTorch leaves libgomp's
  # default (300,000).
  # PyTorch runs in both memory formats and the faster one is the baseline:
  # 1.13's CPU convolutions are faster channels_last on small maps (the
  # cnn fp32: 7,878 against 5,118 img/s contiguous, bf16 11,412 against
  # 6,041), and a PyTorch user who cares about speed converts.
  local f tf=
  for f in contiguous channels_last; do
    run_logged "$TMP/${name}_t_$f.txt" env -u OMP_WAIT_POLICY "$PYTHON" "$ROOT/bench/torch_train.py" "$@" \
      --threads "$THREADS" --steps "$steps" --warmup "$warm" --memory-format "$f"
    if [[ -z $tf ]] || calc_true "$(result img_s "$TMP/${name}_t_$f.txt") > $(result img_s "$tf")"; then
      tf=$TMP/${name}_t_$f.txt
    fi
  done
  local c t cg tg
  c=$(result img_s "$TMP/${name}_c.txt"); t=$(result img_s "$tf")
  cg=$(result gflops "$TMP/${name}_c.txt"); tg=$(result gflops "$tf")
  row "$label (img/s, median step)" "$(calc %.0f "$c")" "$(calc %.0f "$t")" "$(calc %.2fx "$c/$t")" \
    "$(calc '%.2f / %.2f' "$cg/$CEIL, $tg/$CEIL")"
  note "$name: PyTorch contiguous $(calc %.0f "$(result img_s "$TMP/${name}_t_contiguous.txt")") img/s," \
    "channels_last $(calc %.0f "$(result img_s "$TMP/${name}_t_channels_last.txt")") img/s (the table has the faster);" \
    "cpu-time/threads estimates ctrain $(calc %.0f "$(result cpu_img_s "$TMP/${name}_c.txt")") img/s" \
    "($(calc %.2f "$(result gflop_step "$TMP/${name}_c.txt")/$(result cpu_s "$TMP/${name}_c.txt")/$CEIL") of ceiling)," \
    "PyTorch $(calc %.0f "$(result cpu_img_s "$tf")") img/s;" \
    "peak RSS ctrain $(result rss_mb "$TMP/${name}_c.txt") MB, PyTorch $(result rss_mb "$tf") MB;" \
    "$(result gflop_step "$TMP/${name}_c.txt") GFLOP per step."
}

wl_cnn() { train_row cnn "cnn fp32, 1x28x28 (Fashion-MNIST shape), batch 128" "$((RUNS_C * 4))" 3 --model cnn --batch 128; }
wl_cnn_bf16() {
  train_row cnn_bf16 "cnn bf16 (O1 / autocast), 1x28x28, batch 128" "$((RUNS_C * 4))" 3 --model cnn --batch 128 --precision bf16
}
wl_alexnet_bf16() {
  train_row alexnet_bf16 "AlexNet bf16 (O1 / autocast), 3x227x227, batch 64" "$RUNS_T" 1 --model alexnet --batch 64 \
    --input 3x227x227 --classes 10 --precision bf16
}
wl_alexnet() {
  train_row alexnet "AlexNet fp32, 3x227x227, batch 64" "$RUNS_T" 1 --model alexnet --batch 64 --input 3x227x227 --classes 10
}
wl_resnet18() {
  train_row resnet18 "ResNet-18 fp32, 3x32x32, batch 128" "$RUNS_C" 2 --model resnet18 --batch 128 --input 3x32x32 --classes 10
}
wl_mlp() { train_row mlp "mlp fp32, 1x28x28, batch 128" "$((RUNS_C * 4))" 3 --model mlp --batch 128; }

# ---- main ------------------------------------------------------------------
main() {
  local selected=("$@")
  [[ ${#selected[@]} -gt 0 ]] || selected=("${WORKLOADS[@]}")
  for w in "${selected[@]}"; do
    declare -F "wl_$w" >/dev/null || { echo "unknown workload '$w' (have: ${WORKLOADS[*]})" >&2; exit 2; }
  done
  build
  measure_machine
  for w in "${selected[@]}"; do
    WL_LOAD0=$(load1)
    echo "running $w ..." >&2
    "wl_$w"
  done

  local table
  table=$(
    echo "| workload | ctrain | PyTorch (faster memory format) | ratio (ctrain speed-up) | fraction of ceiling (ctrain / PyTorch) | load avg 1 min (start / end) |"
    echo "| --- | ---: | ---: | ---: | --- | --- |"
    cat "$ROWS"
  )
  echo "$table"
  mkdir -p "$(dirname "$OUT")"
  {
    echo "# ctrain vs PyTorch, CPU, $DATE"
    echo
    echo "- machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
      "L3 $(lscpu | sed -n 's/^L3 cache: *//p'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
    echo "- fp32 GEMM ceiling (2048^3, oneDNN, best of runs): $(calc %.1f "$CEIL") GFLOP/s;" \
      "triad bandwidth (best): $(calc %.1f "$TRIAD") GB/s; load avg during this: $MACHINE_LOAD"
    echo "- date: $(date -Iseconds); commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- command: OMP_NUM_THREADS=$THREADS$([[ ${QUICK:-0} == 1 ]] && echo " QUICK=1") bench/run.sh $*  (BUILD_DIR=$BUILD)"
    echo "- PyTorch $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null), torch.set_num_threads($THREADS);" \
      "PyTorch in both memory formats (contiguous, channels_last), the faster in the table"
    echo "- allocator, both sides: $BENCH_MALLOC_DESC (bench/malloc_env.sh)"
    echo "- load average at the end: $(cat /proc/loadavg)"
    echo
    echo "$table"
    echo
    echo "Notes:"
    echo
    cat "$NOTES"
    echo
    echo "## Raw output"
    echo
    cat "$RAW"
  } >"$OUT"
  echo "wrote $OUT" >&2
}

main "$@"; exit  # one line: bash stops reading here, so editing this file mid-run is safe
