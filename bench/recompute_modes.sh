#!/usr/bin/env bash
# ctrain's recompute modes side by side on the cpu: off, norm (batch-norm
# outputs only, rebuilt from the saved statistics), selective (norm, and
# the convolutions of at most 128 multiply-adds per output element run
# again), cheap (batch norm/activation/add/dropout outputs only) and auto
# (the smallest plan), fp32, plain SGD, 2 threads, each run a fresh
# bench_train process, the five modes alternating within each of ROUNDS
# rounds. Prints a markdown table:
# median img/s, the median of the per-round step-time ratios to `off`,
# the step arena (ct_model_plan_bytes), peak RSS and the extra forward
# FLOPs of the rerun layers. PyTorch has no counterpart of these modes (its
# checkpoint reruns whole modules): bench/recompute.sh compares the
# segment mode with PyTorch.
# Usage: bench/recompute_modes.sh [resnet50] [resnet18]
# Environment: BUILD_DIR (build), ROUNDS (3), R50_BATCH (8).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
R50_BATCH=${R50_BATCH:-8}
export OMP_NUM_THREADS=2 GOMP_SPINCOUNT=30000
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j2 --target bench_train >/dev/null
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(resnet50 resnet18)
MODES=(off norm selective cheap auto)

spec() { # input batch steps
  case $1 in
    resnet50) echo "3x224x224 $R50_BATCH 3" ;;
    resnet18) echo "3x32x32 128 5" ;;
    *) echo "unknown model $1 (resnet50, resnet18)" >&2; exit 2 ;;
  esac
}
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs); commit $(git -C "$ROOT" rev-parse --short HEAD); $(date -u +%Y-%m-%d)."
echo "Command: bench/recompute_modes.sh ${MODELS[*]} (ROUNDS=$ROUNDS, R50_BATCH=$R50_BATCH)"
for model in "${MODELS[@]}"; do
  read -r input batch steps <<<"$(spec "$model")"
  declare -A secs=() ips=() plan=() rss=() extra=() segs=() layers=()
  for ((r = 1; r <= ROUNDS; r++)); do
    for mode in "${MODES[@]}"; do
      line=$("$BUILD/bench/bench_train" --model "$model" --input "$input" --batch "$batch" --classes 10 --threads 2 \
        --steps "$steps" --warmup 1 --optim sgd --recompute "$mode" | grep '^RESULT')
      secs[$mode]+="$(field "$line" median_s) "
      ips[$mode]+="$(field "$line" img_s) "
      rss[$mode]+="$(field "$line" rss_mb) "
      plan[$mode]=$(field "$line" plan_mb)
      gf=$(field "$line" gflop_step) rg=$(field "$line" rc_gflop)
      extra[$mode]=$(awk -v a="$rg" -v b="$gf" 'BEGIN {printf "+%.1f%%", 100 * a / b}')
      segs[$mode]=$(field "$line" rc_mode) layers[$mode]=$(field "$line" rc_layers)
    done
  done
  echo
  echo "## $model, input $input, batch $batch (fp32, SGD, median of $steps steps after 1 warm-up per run)"
  echo
  echo "| recompute | img/s | time vs off | arena MB | peak RSS MB | extra forward FLOP | mode or segments, layers rerun |"
  echo "|---|---:|---:|---:|---:|---:|---|"
  read -ra off_s <<<"${secs[off]}"
  for mode in "${MODES[@]}"; do
    read -ra s <<<"${secs[$mode]}"
    ratio=$(for ((i = 0; i < ${#s[@]}; i++)); do awk -v a="${s[$i]}" -v b="${off_s[$i]}" 'BEGIN {print a / b}'; done | median)
    printf "| %s | %.1f | %.2fx | %s | %.0f | %s | %s, %s |\n" "$mode" "$(tr ' ' '\n' <<<"${ips[$mode]}" | grep . | median)" \
      "$ratio" "${plan[$mode]}" "$(tr ' ' '\n' <<<"${rss[$mode]}" | grep . | median)" "${extra[$mode]}" "${segs[$mode]}" \
      "${layers[$mode]}"
  done
  unset secs ips plan rss extra segs layers
done
