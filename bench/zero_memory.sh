#!/bin/sh
# Resident memory of a DDP rank without ZeRO, with --zero 1 and --zero 2
# (docs/PARALLEL.md): 2 ranks train a model of eight 1024x1024 linear
# layers (8.4M parameters) with Adam; a few seconds in, the ranks' VmRSS is
# read three times a second apart, and VmHWM (the peak so far).
#   bench/zero_memory.sh [BUILD_DIR]   (default build)
B=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
{ echo "input 4x16x16"; echo flatten; for i in 1 2 3 4 5 6 7 8; do echo "linear 1024 1024"; echo relu; done
  echo "linear 1024 10"; } > "$T/deep.txt"
root=""; [ "$(id -u)" = 0 ] && root=--allow-run-as-root
echo "| --zero | rank | VmRSS (kB), 3 samples | VmHWM (kB) |"
echo "| --- | --- | --- | --- |"
for z in 0 1 2; do
  mpirun -np 2 $root --oversubscribe "$B/ctrain" train --strategy ddp --model "$T/deep.txt" --input 4x16x16 \
    --data synthetic:4096 --batch-size 16 --epochs 2 --optimizer adam --bucket-mb 4 --threads 1 --workers 0 \
    --zero $z > "$T/log" 2>&1 &
  sleep 5
  for p in $(pgrep -f "ctrain train --strategy ddp --model $T/deep.txt"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = ctrain ] || continue # not mpirun
    rss=""
    for i in 1 2 3; do rss="$rss $(awk '/VmRSS/ {print $2}' /proc/$p/status 2>/dev/null)"; sleep 1; done
    echo "| $z | pid $p | $rss | $(awk '/VmHWM/ {print $2}' /proc/$p/status 2>/dev/null) |"
  done
  wait
done
