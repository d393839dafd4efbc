#!/usr/bin/env bash
# Training throughput of two builds of ctrain (two commits) on the same
# workloads, alternating the builds within each round so that drift of a
# shared machine spreads over both; median img/s and peak RSS per build.
# This is how the "before / after" figures of a change are taken.
# Writes markdown to OUT (default bench/results/<date>-cpu-ab.md).
# Usage: bench/ab_train.sh OLD_BUILD_DIR NEW_BUILD_DIR
# Environment: ROUNDS (3), OUT, CASES_FILE (lines "name|bench_train args";
# default: AlexNet-227 fp32 and bf16 batch 64, cnn fp32 and bf16 batch 128).
# An old build is made from a worktree, e.g.:
#   git worktree add /tmp/old <commit> && cmake -S /tmp/old -B /tmp/old/build \
#     -DCMAKE_BUILD_TYPE=Release -DCTRAIN_WITH_CUDA=OFF && \
#   cmake --build /tmp/old/build -j2 --target bench_train
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -eq 2 ]] || { echo "usage: $0 OLD_BUILD_DIR NEW_BUILD_DIR" >&2; exit 2; }
OLD=$1 NEW=$2
for b in "$OLD" "$NEW"; do
  [[ -x $b/bench/bench_train ]] || { echo "$0: $b/bench/bench_train: not found (build the bench_train target)" >&2; exit 2; }
done
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$ROOT/bench/results/$(date +%Y-%m-%d)-cpu-ab.md}
export OMP_NUM_THREADS=2 GOMP_SPINCOUNT=30000
unset OMP_WAIT_POLICY
CASES=("AlexNet-227 fp32 batch 64|--model alexnet --batch 64 --input 3x227x227 --steps 4 --warmup 2"
       "AlexNet-227 bf16 batch 64|--model alexnet --batch 64 --input 3x227x227 --steps 4 --warmup 2 --precision bf16"
       "cnn fp32 batch 128|--model cnn --batch 128 --steps 30 --warmup 5"
       "cnn bf16 batch 128|--model cnn --batch 128 --steps 30 --warmup 5 --precision bf16")
if [[ -n ${CASES_FILE:-} ]]; then mapfile -t CASES <"$CASES_FILE"; fi
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
commit_of() { git -C "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt")" rev-parse --short HEAD 2>/dev/null || echo "?"; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
{
  echo "# ctrain before / after, cpu training throughput ($(date +%Y-%m-%d))"
  echo
  echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- old: $OLD (commit $(commit_of "$OLD")); new: $NEW (commit $(commit_of "$NEW"))"
  echo "- command: ROUNDS=$ROUNDS bench/ab_train.sh OLD NEW (bench_train, 2 threads, GOMP_SPINCOUNT=30000; builds alternate within each round)"
  echo "- date: $(date -Iseconds)"
  echo
  echo "| workload | old img/s (runs) | new img/s (runs) | new / old (medians) | peak RSS MB old / new |"
  echo "| --- | --- | --- | ---: | --- |"
} >"$OUT"
for c in "${CASES[@]}"; do
  name=${c%%|*} args=${c#*|}
  rm -f "$TMP"/*
  for r in $(seq "$ROUNDS"); do
    for side in old new; do
      b=$OLD; [[ $side == new ]] && b=$NEW
      # shellcheck disable=SC2086
      line=$("$b/bench/bench_train" $args | grep '^RESULT')
      tr ' ' '\n' <<<"$line" | sed -n 's/^img_s=//p' >>"$TMP/$side"
      tr ' ' '\n' <<<"$line" | sed -n 's/^rss_mb=//p' >>"$TMP/$side.rss"
    done
  done
  mo=$(median <"$TMP/old") mn=$(median <"$TMP/new")
  printf '| %s | %s (%s) | %s (%s) | %.2fx | %s / %s |\n' "$name" "$mo" "$(paste -sd, "$TMP/old")" "$mn" \
    "$(paste -sd, "$TMP/new")" "$(echo "$mn / $mo" | bc -l)" "$(median <"$TMP/old.rss")" "$(median <"$TMP/new.rss")" >>"$OUT"
done
echo "wrote $OUT"
