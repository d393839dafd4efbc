#!/usr/bin/env bash
# A/B of two bench_train binaries in one run, interleaved so that machine
# drift hits every side alike: each round runs old, new and new with
# no-op hooks in a rotated order. Configs: the torchkeras cnn and
# AlexNet-227 on the CPU, fp32 and bf16. Prints, per side, the median over
# the rounds of each run's median step time (wall) and of its process CPU
# time per step / threads (less sensitive to other processes), the ratios
# to old, and the share of the machine's fp32 GEMM ceiling (bench_machine,
# measured at the start of the same run) the old side reached.
# Usage: bench/ab_step.sh OLD_BENCH_TRAIN NEW_BENCH_TRAIN [ROUNDS] [BENCH_MACHINE]
# RAW=FILE appends every RESULT line there; THREADS (2), ALEX_ROUNDS
# (ROUNDS) set the threads and AlexNet's rounds.
set -eu
old=$1 new=$2 rounds=${3:-9} machine=${4:-}
threads=${THREADS:-2} alex_rounds=${ALEX_ROUNDS:-$rounds}
cfgs=("cnn fp32 --batch 128 --steps 20 --warmup 3"
      "cnn bf16 --batch 128 --steps 20 --warmup 3"
      "alexnet fp32 --batch 32 --input 3x227x227 --steps 4 --warmup 1"
      "alexnet bf16 --batch 32 --input 3x227x227 --steps 4 --warmup 1")
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
ceiling=""
[ -n "$machine" ] && ceiling=$("$machine" 2>/dev/null | grep '^RESULT' | field gemm_ceiling)
echo "date: $(date -u +%FT%TZ)  cpu:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)  threads: $threads"
[ -n "$ceiling" ] && echo "fp32 GEMM ceiling measured at the start: $ceiling GFLOP/s"
printf '%-13s %5s %9s %9s %9s %8s %8s %9s %9s %9s %8s %8s %s\n' config runs old_ms new_ms hook_ms new/old hook/old \
  old_cpu new_cpu hook_cpu new/old hook/old "old GFLOP/s"
for c in "${cfgs[@]}"; do
  set -- $c
  model=$1 prec=$2; shift 2
  n=$rounds; [ "$model" = alexnet ] && n=$alex_rounds
  declare -A w=() u=() ; g=()
  for r in $(seq "$n"); do
    sides=(old new hook)
    k=$((r % 3)); order=("${sides[@]:$k}" "${sides[@]:0:$k}")
    for side in "${order[@]}"; do
      bin=$new; extra=(); [ $side = old ] && bin=$old; [ $side = hook ] && extra=(--noop-hooks)
      line=$("$bin" --model "$model" --precision "$prec" --threads "$threads" "$@" "${extra[@]}" | grep '^RESULT')
      [ -n "${RAW:-}" ] && echo "$side $line" >>"$RAW"
      w[$side]+="$(echo "$line" | field median_s) " u[$side]+="$(echo "$line" | field cpu_s) "
      [ $side = old ] && g+=("$(echo "$line" | field gflops)")
    done
  done
  med() { printf '%s\n' $1 | median; }
  wo=$(med "${w[old]}") wn=$(med "${w[new]}") wh=$(med "${w[hook]}")
  uo=$(med "${u[old]}") un=$(med "${u[new]}") uh=$(med "${u[hook]}") mg=$(printf '%s\n' "${g[@]}" | median)
  awk -v c="$model-$prec" -v n="$n" -v wo="$wo" -v wn="$wn" -v wh="$wh" -v uo="$uo" -v un="$un" -v uh="$uh" \
      -v g="$mg" -v ceil="${ceiling:-0}" 'BEGIN {
    printf "%-13s %5d %9.2f %9.2f %9.2f %8.3f %8.3f %9.2f %9.2f %9.2f %8.3f %8.3f %.1f%s\n", c, n, wo * 1e3, wn * 1e3,
           wh * 1e3, wn / wo, wh / wo, uo * 1e3, un * 1e3, uh * 1e3, un / uo, uh / uo, g,
           (ceil > 0 ? sprintf(" (%.0f%% of the ceiling)", 100 * g / ceil) : "") }'
  unset w u
done
