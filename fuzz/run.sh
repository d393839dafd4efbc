#!/usr/bin/env bash
# Builds the five libFuzzer targets with ASan + UBSan (clang) as
# fuzz/README.md describes, seeds each corpus from its ctest twin, and runs
# them, JOBS at a time, SECONDS each. Prints one line per target: inputs
# executed, coverage (libFuzzer's cov: edges), seconds and the result.
# Usage: fuzz/run.sh [SECONDS (600)] [BUILD_DIR (build)] [OUT (/tmp/ctrain-fuzz)]
# Needs BUILD_DIR/libctrain.a and the twins (make build). A crash leaves
# crash-* files in OUT/<target>/.
set -u
secs=${1:-600} build=${2:-build} out=${3:-/tmp/ctrain-fuzz} jobs=${JOBS:-2}
cd "$(dirname "$0")/.."
mkdir -p "$out/bin"
cc="clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc"
libs="$build/libctrain.a -lgomp -lpthread -lm -ldnnl -lpng -lz -ljpeg -ldl -lstdc++"
if grep -q "CTRAIN_HAVE_CUDA:INTERNAL=1\|CTRAIN_CUDA_FOUND" "$build/CMakeCache.txt" 2>/dev/null || nm "$build/libctrain.a" 2>/dev/null | grep -q " U cudaMalloc"; then
  libs="$libs -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib -lcudart -lcudnn -lcublas"
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
fi
core="src/core/dtype.c src/core/status.c src/core/tensor.c src/core/file_open.c"
$cc fuzz/fuzz_safetensors.c src/io/json.c src/io/safetensors.c $core -lm -o "$out/bin/fuzz_safetensors" || exit 1
$cc -DCTRAIN_HAVE_PNG -DCTRAIN_HAVE_JPEG fuzz/fuzz_datasets.c src/data/dataset.c src/data/idx.c src/data/cifar.c \
  src/data/folder.c src/data/synthetic.c src/data/transform.c src/data/image_decode.c src/core/status.c \
  src/core/rng.c src/core/file_open.c -lz -lpng -ljpeg -lm -o "$out/bin/fuzz_datasets" || exit 1
$cc fuzz/fuzz_cli.c src/cli/options.c src/cli/gpu_data_flags.c src/cli/dist.c src/cli/device_switches.c $libs -o "$out/bin/fuzz_cli" || exit 1
$cc fuzz/fuzz_checkpoint.c src/io/checkpoint.c src/io/safetensors.c src/io/safetensors_load.c src/io/json.c \
  src/core/file_open.c $libs -o "$out/bin/fuzz_checkpoint" || exit 1
$cc fuzz/fuzz_model_text.c src/nn/model_text.c src/nn/model.c src/nn/model_def.c src/nn/layers/*.c \
  src/core/file_open.c $libs -o "$out/bin/fuzz_model_text" || exit 1

run_one() { # target, twin, extra libFuzzer flags...
  local t=$1 twin=$2; shift 2
  local dir="$out/$t"
  rm -rf "$dir" && mkdir -p "$dir/corpus"
  CT_MUTATE_ITERS=0 CT_FUZZ_SEED_DIR="$dir/corpus" "$build/tests/$twin" > /dev/null 2>&1
  # Model text alone caps allocations (accepted models of millions of
  # parameters take seconds each under ASan); a dataset image may be large.
  local asan=detect_leaks=1
  [ "$t" = fuzz_model_text ] && asan=allocator_may_return_null=1:max_allocation_size_mb=32:detect_leaks=1
  (cd "$dir" && TMPDIR=/dev/shm OMP_NUM_THREADS=1 ASAN_OPTIONS=$asan \
    "$out/bin/$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 "$@" corpus \
    > log.txt 2>&1)
  local rc=$? runs cov
  runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$dir/log.txt" | grep -o "[0-9]*$")
  cov=$(grep -o "cov: [0-9]*" "$dir/log.txt" | tail -1 | grep -o "[0-9]*")
  echo "$t: ${runs:-?} inputs, cov ${cov:-?} edges, $secs s, $([ $rc = 0 ] && echo clean || echo "FAILED (rc $rc, $dir/log.txt)")"
}
targets=("fuzz_safetensors test_safetensors_mutate" "fuzz_datasets test_datasets_mutate"
         "fuzz_cli test_cli_mutate -close_fd_mask=2" "fuzz_checkpoint test_checkpoint_mutate"
         "fuzz_model_text test_model_text_mutate -max_len=4096 -dict=$PWD/fuzz/model_text.dict")
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  for ((j = i; j < i + jobs && j < ${#targets[@]}; j++)); do run_one ${targets[$j]} & done
  wait
done
