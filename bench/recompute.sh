#!/usr/bin/env bash
# Activation recompute (gradient checkpointing) on the cpu: ctrain's
# ct_model_set_recompute (bench_train --recompute) against PyTorch 1.13's
# checkpointing of the same model in its sequential form
# (bench/recompute_torch.py), fp32, plain SGD on both sides, 2 threads.
# Per model: ctrain off / auto (/ a fixed count), PyTorch plain /
# checkpointed with the segment count ctrain's auto chose (/ the same fixed
# count). Every configuration runs in a fresh process, in the same order
# within a round, ROUNDS rounds; the table holds medians over the rounds of
# img/s and peak RSS, the recompute overhead as the median of the per-round
# step-time ratios (recompute / plain of the same round), ctrain's step
# arena (ct_model_plan_bytes) and the extra forward FLOPs of the recompute.
# Every RESULT line goes into the raw section of the output.
# Writes bench/results/<date>-cpu-recompute.md (OUT to override).
# Usage: bench/recompute.sh [alexnet] [resnet50] [resnet18]
# Environment: BUILD_DIR (build), ROUNDS (3), OUT, R50_BATCH (8),
#              R50_FIXED (4: the fixed segment count of the ResNet-50 rows).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
R50_BATCH=${R50_BATCH:-8}
R50_FIXED=${R50_FIXED:-4}
OUT=${OUT:-$ROOT/bench/results/$(date +%Y-%m-%d)-cpu-recompute.md}
PY=/usr/bin/python3
. "$ROOT/bench/malloc_env.sh"
export OMP_NUM_THREADS=2 GOMP_SPINCOUNT=30000
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j2 --target bench_train >/dev/null
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(alexnet resnet50 resnet18)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# model | input | batch | steps | warmup (same on both sides)
spec() {
  case $1 in
    alexnet) echo "3x227x227 32 3 1" ;;
    resnet50) echo "3x224x224 $R50_BATCH 3 1" ;;
    resnet18) echo "3x32x32 128 5 1" ;;
    *) echo "unknown model $1 (alexnet, resnet50, resnet18)" >&2; exit 2 ;;
  esac
}
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# key=value from a RESULT line
val() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

# One configuration in a fresh process: side (ctrain|torch), setting
# (off|auto|N), model; appends its RESULT line to $TMP/<model>.<side>.<setting>.
run_one() {
  local side=$1 set=$2 model=$3 line
  read -r input batch steps warmup <<<"$(spec "$model")"
  if [ "$side" = ctrain ]; then
    line=$("$BUILD/bench/bench_train" --model "$model" --input "$input" --batch "$batch" --classes 10 --threads 2 \
      --steps "$steps" --warmup "$warmup" --optim sgd --recompute "$set" | grep '^RESULT')
  else
    local segs=0
    [ "$set" = off ] || segs=$set
    line=$($PY "$ROOT/bench/recompute_torch.py" --model "$model" --input "$input" --batch "$batch" --classes 10 \
      --threads 2 --steps "$steps" --warmup "$warmup" --segments "$segs" | grep '^RESULT')
  fi
  echo "$line" >>"$TMP/$model.$side.$set"
  echo "$model $side $set: $line" >>"$TMP/raw"
  echo "  $model $side recompute=$set: $(val img_s "$line") img/s, rss $(val rss_mb "$line") MB, load $(val load "$line")" >&2
}
# median of key over the runs of one configuration
med() { while read -r l; do val "$1" "$l"; done <"$TMP/$2" | median; }
# median over rounds of the step-time ratio configuration / plain of the same
# round, of the wall time (median_s) and of the cpu-time/threads (cpu_s):
# "wall; cpu"
ratio1() { paste -d' ' <(while read -r l; do val "$3" "$l"; done <"$TMP/$1") \
                       <(while read -r l; do val "$3" "$l"; done <"$TMP/$2") | awk '{print $1/$2}' | median; }
ratio() { awk -v w="$(ratio1 "$1" "$2" median_s)" -v c="$(ratio1 "$1" "$2" cpu_s)" 'BEGIN{printf "%.2fx; %.2fx", w, c}'; }
spread() { while read -r l; do val img_s "$l"; done <"$TMP/$1" | sort -g | paste -sd/ -; }

{
  echo "# cpu activation recompute: ctrain against PyTorch checkpointing ($(date +%Y-%m-%d))"
  echo
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src include bench/bench_train.c bench/recompute_torch.py || echo ' (+ uncommitted changes)'); PyTorch $($PY -c 'import torch; print(torch.__version__)')."
  echo "Allocator, both sides: $BENCH_MALLOC_DESC (bench/malloc_env.sh)."
  echo "Command: bench/recompute.sh ${MODELS[*]} (ROUNDS=$ROUNDS, R50_BATCH=$R50_BATCH, R50_FIXED=$R50_FIXED; bench_train --optim sgd, 2 threads, GOMP_SPINCOUNT=30000; recompute_torch.py, torch.set_num_threads(2), checkpoint(use_reentrant=False) in checkpoint_sequential's split). fp32, SGD lr 0.01 without momentum on both sides, random in-memory data."
  echo
} >"$OUT"

for model in "${MODELS[@]}"; do
  read -r input batch steps warmup <<<"$(spec "$model")"
  echo "$model ($input, batch $batch): $ROUNDS rounds" >&2
  # The first round learns the segment count auto picks, which the PyTorch side then uses.
  auto_segs=
  fixed=()
  [ "$model" = resnet50 ] && fixed=("$R50_FIXED")
  # auto takes the cheap mode (no segments) where its plan is as small, as
  # for ResNet-18: the 3 segments it took before still face PyTorch.
  [ "$model" = resnet18 ] && fixed=(3)
  for r in $(seq "$ROUNDS"); do
    run_one ctrain off "$model"
    run_one ctrain auto "$model"
    [ -n "$auto_segs" ] || auto_segs=$(val segments "$(head -1 "$TMP/$model.ctrain.auto")")
    for f in "${fixed[@]}"; do run_one ctrain "$f" "$model"; done
    run_one torch off "$model"
    if [ "$auto_segs" -ge 2 ]; then run_one torch "$auto_segs" "$model"; fi
    for f in "${fixed[@]}"; do [ "$f" = "$auto_segs" ] || run_one torch "$f" "$model"; done
  done
  first=$(head -1 "$TMP/$model.ctrain.off")
  {
    echo "## $model, input $input, batch $batch (median of $steps steps after $warmup warm-up per run)"
    echo
    echo "ctrain: $(val layers "$first") layers, $(val gflop_step "$first") GFLOP per plain step (conv/linear, forward x3); PyTorch: $(val modules "$(head -1 "$TMP/$model.torch.off")") modules in the sequential form."
    echo
    echo "| recompute | ctrain img/s | ctrain time vs off (wall; cpu) | ctrain arena MB | ctrain peak RSS MB | ctrain extra FLOP | PyTorch img/s | PyTorch time vs plain (wall; cpu) | PyTorch peak RSS MB | PyTorch extra FLOP | img/s ctrain/PyTorch | peak RSS ctrain/PyTorch |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  } >>"$OUT"
  for set in off auto "${fixed[@]}"; do
    tset=$set
    [ "$set" = auto ] && tset=$auto_segs
    cf=$model.ctrain.$set tf=$model.torch.$tset
    cl=$(head -1 "$TMP/$cf")
    mode=$(val rc_mode "$cl")
    [[ $mode =~ ^[0-9]+$ ]] && mode="$mode segments"
    label="off"
    [ "$set" = off ] || label="$set: $mode, $(val rc_layers "$cl") layers rerun"
    cimg=$(med img_s "$cf") crss=$(med rss_mb "$cf") arena=$(val plan_mb "$cl")
    cx=$(awk -v r="$(val rc_gflop "$cl")" -v f="$(val gflop_step "$cl")" 'BEGIN{printf "+%.1f%%", 100*r/f}')
    cr="1.00x; 1.00x" tr="1.00x; 1.00x"
    [ "$set" = off ] || cr=$(ratio "$cf" "$model.ctrain.off")
    if [ -f "$TMP/$tf" ]; then
      tl=$(head -1 "$TMP/$tf")
      timg=$(med img_s "$tf") trss=$(med rss_mb "$tf")
      tx=$(awk -v r="$(val rc_gflop "$tl")" -v f="$(val gflop_step "$tl")" 'BEGIN{printf "+%.1f%%", 100*r/f}')
      [ "$set" = off ] || tr=$(ratio "$tf" "$model.torch.off")
      tlabel=$([ "$set" = off ] && echo plain || echo "$tset segments")
    else
      timg=0 trss=0 tx=- tlabel="auto took $mode: no PyTorch counterpart"
    fi
    awk -v l="$label" -v ci="$cimg" -v cr="$cr" -v a="$arena" -v cs="$crss" -v cx="$cx" -v ti="$timg" -v tr="$tr" \
      -v ts="$trss" -v tx="$tx" -v tl="$tlabel" \
      'BEGIN{printf "| %s | %.1f | %s | %.0f | %.0f | %s | %.1f (%s) | %s | %.0f | %s | %s | %s |\n", l, ci, cr, a, cs, cx,
             ti, tl, tr, ts, tx, (ti > 0 ? sprintf("%.2f", ci/ti) : "-"), (ts > 0 ? sprintf("%.2f", cs/ts) : "-")}' | tee -a "$OUT"
  done
  {
    echo
    echo "img/s of each run, sorted:"
    for set in off auto "${fixed[@]}"; do echo "ctrain $set: $(spread "$model.ctrain.$set")"; done
    for f in "$TMP/$model".torch.*; do echo "PyTorch $(basename "$f" | sed "s/^$model.torch.//;s/^off$/plain/"): $(spread "$(basename "$f")")"; done
    echo
  } | sed 's/$/  /' >>"$OUT"
done
{
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "## Raw RESULT lines"
  echo
  echo '```'
  cat "$TMP/raw"
  echo '```'
} >>"$OUT"
echo "wrote $OUT" >&2
