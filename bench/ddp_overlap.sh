#!/usr/bin/env bash
# DDP's overlap measured on this machine (bench_ddp under mpirun, one thread
# per rank) and projected to GPU machines (bench/ddp_projection.py, from the
# H100 per-layer profile in bench/results/). Builds nothing.
# Usage: bench/ddp_overlap.sh BUILD_DIR
#   BUILD_DIR holds bench/bench_ddp (cmake --build BUILD_DIR --target bench_ddp).
# Writes OUT (default bench/results/<date>-cpu-ddp-overlap.md) and, beside
# it, OUT's name with -MODEL.json for each model (bench_ddp --json: the
# input of bench/ddp_projection.py).
# Environment: OUT, NP (2),
# ROUNDS (15), CASES_FILE (lines "name|bench_ddp arguments"; default: the cnn
# batch 32, AlexNet-227 batch 2, ResNet-50 112x112 batch 2),
# GPU_PROFILE and GPU_IMG_S (the GPU figures the projection starts from).
# About 4-5 minutes on the 2-core VM at ROUNDS=15.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
BUILD=$(cd "$1" && pwd)
BIN=$BUILD/bench/bench_ddp
[[ -x $BIN ]] || { echo "$0: $BIN: not found (cmake --build $1 --target bench_ddp)" >&2; exit 2; }
NP=${NP:-2}
ROUNDS=${ROUNDS:-15}
OUT=${OUT:-$ROOT/bench/results/$(date +%Y-%m-%d)-cpu-ddp-overlap.md}
# The H100 run of 2026-11-22, call 6 (final code): per-layer profile, and
# the trainer's img/s at batch 256 from 2026-11-22-h100-gpu.md's table.
GPU_PROFILE=${GPU_PROFILE:-$ROOT/bench/results/2026-11-22-h100-6-profile.md}
GPU_IMG_S=${GPU_IMG_S:-"alexnet=31109 resnet50=4754"}
SWEEP="--sweep 4K,1M,8M,32M,150M --sweep-reps 1"
# Small per-rank batches: this VM's noise grows with the step, the
# communication does not, so short steps show it best.
CASES=("cnn|--model cnn --classes 10 --batch 32 --steps 10 --comm-reps 10"
       "alexnet|--model alexnet --input 3x227x227 --classes 1000 --batch 2 --steps 3 --comm-reps 2"
       "resnet50|--model resnet50 --input 3x112x112 --classes 1000 --batch 2 --steps 3 --comm-reps 2")
if [[ -n ${CASES_FILE:-} ]]; then mapfile -t CASES <"$CASES_FILE"; fi
MPI=(mpirun -np "$NP" --bind-to core --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) -eq 0 ]] && MPI+=(--allow-run-as-root)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")
dirty=$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -c . || true)
t0=$(date +%s)
la0=$(cut -d' ' -f1-3 /proc/loadavg)
jsons=()
for c in "${CASES[@]}"; do
  name=${c%%|*} args=${c#*|}
  echo "== $name: ${MPI[*]} bench_ddp $args --rounds $ROUNDS $SWEEP" >&2
  # shellcheck disable=SC2086
  "${MPI[@]}" "$BIN" $args --rounds "$ROUNDS" $SWEEP --json "$TMP/$name.json" >"$TMP/$name.log" 2>&1 || {
    cat "$TMP/$name.log" >&2; exit 1; }
  grep '^RESULT' "$TMP/$name.log" >&2
  # Kept beside OUT: the projection can be run again from them with other
  # link figures, without measuring again.
  cp "$TMP/$name.json" "${OUT%.md}-$name.json"
  jsons+=("${OUT%.md}-$name.json")
done
la1=$(cut -d' ' -f1-3 /proc/loadavg)
secs=$(( $(date +%s) - t0 ))
# shellcheck disable=SC2086
/usr/bin/python3 "$ROOT/bench/ddp_projection.py" --cpu "${jsons[@]}" --gpu-profile "$GPU_PROFILE" \
  --gpu-img-s $GPU_IMG_S --gpu-name H100 >"$TMP/tables.md"
{
  echo "# DDP overlap on the CPU, and a projection to GPU machines ($(date +%Y-%m-%d))"
  echo
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores ($(lscpu | sed -n 's/^L3 cache: *//p') L3), $(awk '/MemTotal/{printf "%.0f GB", $2/1e6}' /proc/meminfo), $(lscpu | sed -n 's/^Hypervisor vendor: *//p') VM; $(mpirun --version | head -1)"
  echo "- code: commit $commit with $dirty changed or new file(s) in the working tree (bench_ddp from $BUILD)"
  echo "- command: \`bench/ddp_overlap.sh $1\` (ROUNDS=$ROUNDS, NP=$NP), which ran \`${MPI[*]} bench_ddp ARGS --rounds $ROUNDS $SWEEP\` per model (ARGS below), then \`bench/ddp_projection.py\`"
  echo "- date: $(date -Iseconds); measurement ${secs} s; load average before $la0, after $la1"
  echo "- GPU figures: \`${GPU_PROFILE#"$ROOT"/}\` (per-layer times) and the trainer's img/s $GPU_IMG_S (2026-11-22-h100-gpu.md, call 6)"
  echo "- bench_ddp's JSON per model: \`$(basename "${OUT%.md}")-MODEL.json\` beside this file; \`bench/ddp_projection.py --cpu FILES --gpu-profile ... --gpu-img-s ... --link NAME:ALPHA_US:BW_GBS\` projects them again with other links"
  echo
  for c in "${CASES[@]}"; do echo "  - ${c%%|*}: \`${c#*|}\`"; done
  echo
  cat "$TMP/tables.md"
  cat <<'EOF'
## Method

- **bench_ddp** (`bench/bench_ddp.c`) runs one rank per process, one
  thread each, bound to a core; each rank trains the zoo model on its own
  synthetic batch. In every round it runs, in a rotating order: the step
  with no hooks (*compute*), the step with hooks that only note when the
  backward calls `grads_ready` (*timeline*: when each layer's gradients are
  final), the step with `ct_ddp`'s hooks as `ct_fit` installs them
  (*ddp*), DDP's hooks called with no backward (*comm alone*: the same
  buckets started and waited for by the same code), and a sweep of
  blocking `ct_comm_allreduce` calls. Figures are medians over all rounds;
  for a step, the slower rank's time of each step; for `wait`, the rank
  that waited least (the other rank's wait also holds its lead over the
  slower one, which is imbalance, not communication). Differences between
  variants (ddp - compute) are taken per round, where the variants ran
  within seconds of each other, and their median over rounds is reported;
  the *noise* column is the same statistic for two variants doing the same
  work (timeline and compute).
- **hidden share** = 1 - exposed / comm alone, with exposed =
  `ct_ddp_get_stats` `wait_seconds` per step (time in the sync hook).
  **effective** = 1 - (ddp step - compute step) / comm alone: what the
  step actually saved. On this machine the two differ because MPI moves
  and sums the data inside MPI calls, on the rank's own (only) core: the
  calls DDP makes from `grads_ready` during the backward run the
  all-reduces there (the *in hooks* column), so the wait at the end can
  be short while the backward grows instead (compare *in hooks* with
  *ddp - compute*).
- **Per-layer backward times** on this machine are the *timeline*'s
  `grads_ready` times (the raw output's "final at" column, and the JSON),
  not `bench_train --profile`'s re-run layers: the model needs the moment
  each bucket's last gradient is final inside a real backward, layers
  without parameters and fused activations included.
- **The model** (`bench/ddp_projection.py`): ddp.c's bucket rule (reverse
  state order, 1 MB first then 25 MB, each bucket its slice of the
  gradient buffer); a bucket starts when its last gradient is final; ring
  all-reduce t = 2(N-1)·α + 2(N-1)/N · bytes / BW; buckets one at a time
  on the link; step = (step - backward) + max(end of backward, end of the
  last bucket); weak scaling, efficiency = T(1) / T(N).
- **The check**: α and BW fitted to the run's own sweep (α from its
  4 KiB all-reduce, BW from a line through that over the larger sizes up
  to twice the largest bucket); the model then
  predicts the DDP step from the compute-alone phases and the timeline's
  `grads_ready` times. *overlap* is the projection's model as it is used
  for GPUs; *serial* adds the communication to the compute.
- **The projection** takes the H100's per-layer backward times (bench_train
  `--profile`: each layer timed between two device syncs, so their sum
  exceeds the real step) and the trainer's measured step at batch 256 per
  GPU. The backward is taken as its share of the per-layer sums times the
  measured step, spread over the layers as profiled; the rest of the step
  (forward, loss, optimizer) does not overlap communication. The gradients
  are fp32 (mixed precision keeps fp32 master gradients, as PyTorch's
  autocast does), sized from the CPU run's parameters (1000 classes, the
  same as the GPU run's: the parameter totals agree).

## Limits

- **Shared memory on 2 cores is not a network.** MPI's all-reduce here is
  memcpy and additions done by the ranks' own cores; it reaches well under
  1 GB/s through the non-blocking collectives `ct_comm` uses, and its cost
  per byte varies with the message size and from run to run, which a
  latency + bytes/BW line fits only roughly (the sweep's residuals above). A GPU's NCCL runs on its
  own SMs and copy engines while the backward computes; here the copying
  and summing take the core away from the backward (the *in hooks*
  column), so this machine cannot test the overlap assumption the GPU
  projection rests on. What the check does test is the bookkeeping: the
  bucket rule (the bucket count is compared with `ct_ddp_bucket_count`),
  when buckets become ready, the communication total against the fitted
  line, and which of the two models the measured step follows.
- **The CPU's compute/communication ratio is not a GPU's.** Per image,
  one core's backward is thousands of times slower than an H100's (the
  tables above), while the links differ by other factors, so this
  machine's hidden share says nothing about a GPU's.
- **Link figures are assumptions**, not measurements: α per ring step and
  bus bandwidth as in the table above (NVLink: 360 GB/s, about 80% of
  NVLink4's 450 GB/s per direction; the networks at line rate, which
  protocol overhead lowers). NVLink beyond 8 GPUs needs an NVLink-switch
  domain of that size (a DGX H100 node has 8); the network rows assume a
  flat ring in which every hop is the named link (one NIC per GPU).
- **Not modelled:** NCCL's choice of algorithm and protocol (trees, NVLS
  and CollNet at scale, LL/LL128/Simple by size), hierarchical rings
  (NVLink inside a node, the network between), contention with other jobs,
  stragglers and rank skew, the slowdown of the backward's kernels by
  NCCL's SMs and memory traffic, gradient compression or fp16/bf16
  all-reduce, and the GPU profile's own error (per-layer times between
  syncs, scaled to the trainer's step). The ring's latency term,
  2(N-1)·α per bucket, grows with N (1.26 ms per bucket at 64 ranks and
  10 µs); NCCL's trees cut it to about 2·log2(N)·α, so the model is
  pessimistic there.
- This VM's speed drifts (up to 1.5x within minutes), and other work on
  its 2 cores adds more: the variants are interleaved within each round
  and the figures are medians, but they still carry noise; the *noise*
  column gives its size for each model, and the load averages at the top
  show whether anything else ran.

## Raw output
EOF
  for c in "${CASES[@]}"; do
    name=${c%%|*}
    echo
    echo "### $name"
    echo
    echo '```'
    cat "$TMP/$name.log"
    echo '```'
  done
} >"$OUT"
echo "wrote $OUT" >&2
