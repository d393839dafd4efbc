#!/usr/bin/env bash
# A/B of two bench_train binaries in one run, interleaved (old, new, new
# with no-op hooks, old, ...) so machine drift hits all alike: the torchkeras
# cnn and AlexNet-227 on the CPU, fp32 and bf16. Prints each side's median
# over the rounds of the per-run median step time, the ratio to old, and
# the fraction of the machine's fp32 GEMM ceiling (bench_machine, measured
# in the same run) the old side reached.
# Usage: bench/ab_step.sh OLD_BENCH_TRAIN NEW_BENCH_TRAIN [ROUNDS] [BENCH_MACHINE]
set -eu
old=$1 new=$2 rounds=${3:-5} machine=${4:-}
threads=${THREADS:-2}
cfgs=("cnn fp32 --batch 128 --steps 20 --warmup 3"
      "cnn bf16 --batch 128 --steps 20 --warmup 3"
      "alexnet fp32 --batch 32 --input 3x227x227 --steps 4 --warmup 1"
      "alexnet bf16 --batch 32 --input 3x227x227 --steps 4 --warmup 1")
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
ceiling=""
if [ -n "$machine" ]; then
  ceiling=$("$machine" 2>/dev/null | grep '^RESULT' | field gemm_ceiling)
fi
echo "date: $(date -u +%FT%TZ)  host: $(uname -n)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)  threads: $threads"
[ -n "$ceiling" ] && echo "fp32 GEMM ceiling measured now: $ceiling GFLOP/s"
printf '%-14s %12s %12s %12s %9s %9s %10s\n' config old_ms new_ms hooks_ms new/old hooks/old old_GFLOPs
for c in "${cfgs[@]}"; do
  set -- $c
  model=$1 prec=$2; shift 2
  o=() n=() h=() g=()
  for r in $(seq "$rounds"); do
    ro=$("$old" --model "$model" --precision "$prec" --threads "$threads" "$@" | grep '^RESULT')
    rn=$("$new" --model "$model" --precision "$prec" --threads "$threads" "$@" | grep '^RESULT')
    rh=$("$new" --model "$model" --precision "$prec" --threads "$threads" "$@" --noop-hooks | grep '^RESULT')
    o+=("$(echo "$ro" | field median_s)") n+=("$(echo "$rn" | field median_s)") h+=("$(echo "$rh" | field median_s)")
    g+=("$(echo "$ro" | field gflops)")
  done
  mo=$(printf '%s\n' "${o[@]}" | median) mn=$(printf '%s\n' "${n[@]}" | median) mh=$(printf '%s\n' "${h[@]}" | median)
  mg=$(printf '%s\n' "${g[@]}" | median)
  awk -v c="$model-$prec" -v o="$mo" -v n="$mn" -v h="$mh" -v g="$mg" -v ceil="${ceiling:-0}" 'BEGIN {
    printf "%-14s %12.2f %12.2f %12.2f %9.3f %9.3f %10.1f%s\n", c, o * 1e3, n * 1e3, h * 1e3, n / o, h / o, g,
           ceil > 0 ? sprintf(" (%.0f%% of the ceiling)", 100 * g / ceil) : "" }' 
done
