#!/usr/bin/env bash
# Training throughput of the cpu device in each memory format (activation
# layout, --memory-format): contiguous (NCHW), auto (nChw16c on AVX-512,
# nChw8c below it)
# and channels-last (NHWC), alternating the formats in each round so drift
# of a shared machine spreads over all of them; median img/s per format.
# Writes bench/results/<date>-cpu-memory-format.md (OUT to override).
# Usage: bench/memory_format.sh   Environment: BUILD_DIR, ROUNDS (3), OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$ROOT/bench/results/$(date +%Y-%m-%d)-cpu-memory-format.md}
export OMP_NUM_THREADS=2 GOMP_SPINCOUNT=30000
cmake --build "$BUILD" -j2 --target bench_train >/dev/null
FORMATS=(contiguous auto channels-last)
# name | bench_train arguments
CASES=("cnn fp32|--model cnn --batch 128 --steps 40 --warmup 5"
       "cnn bf16|--model cnn --batch 128 --steps 40 --warmup 5 --precision bf16"
       "convnet fp32|--model convnet --input 1x28x28 --batch 128 --steps 20 --warmup 3"
       "resnet18 32x32 fp32|--model resnet18 --input 3x32x32 --batch 128 --steps 8 --warmup 2"
       "resnet18 32x32 bf16|--model resnet18 --input 3x32x32 --batch 128 --steps 8 --warmup 2 --precision bf16")
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
{
  echo "# cpu training throughput by memory format ($(date +%Y-%m-%d))"
  echo
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Command: bench/memory_format.sh (ROUNDS=$ROUNDS; bench_train, 2 threads, GOMP_SPINCOUNT=30000; median img/s of $ROUNDS rounds, formats alternating within a round)."
  echo
  echo "| workload | contiguous img/s | auto img/s | channels-last img/s | auto / contiguous | channels-last / contiguous |"
  echo "|---|---|---|---|---|---|"
} >"$OUT"
for c in "${CASES[@]}"; do
  name=${c%%|*} args=${c#*|}
  for r in $(seq "$ROUNDS"); do
    for f in "${FORMATS[@]}"; do
      # shellcheck disable=SC2086
      "$BUILD/bench/bench_train" $args --memory-format "$f" | grep '^RESULT' | tr ' ' '\n' | sed -n 's/^img_s=//p' >>"$TMP/$f"
    done
  done
  declare -A med
  for f in "${FORMATS[@]}"; do med[$f]=$(median <"$TMP/$f"); rm -f "$TMP/$f"; done
  awk -v n="$name" -v c="${med[contiguous]}" -v a="${med[auto]}" -v l="${med[channels-last]}" \
    'BEGIN{printf "| %s | %.0f | %.0f | %.0f | %.2f | %.2f |\n", n, c, a, l, a/c, l/c}' | tee -a "$OUT"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT"
echo "wrote $OUT"
