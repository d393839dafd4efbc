#!/bin/sh
# The unit tests that read outside input, and the trainer's, under
# AddressSanitizer + UBSan (-DCTRAIN_SANITIZE=ON, gcc, CUDA off): a build
# of its own in BUILD_DIR, then each test with halt_on_error, so a leak, an
# overflow or undefined behaviour fails it. The parsers' twins (mutated
# safetensors, checkpoints, datasets, model text, command lines), the
# atomic writer, safetensors, history, TensorBoard, the data loader, model
# execution and ct_fit (test_accumulate).
#
# usage: test_sanitize.sh SOURCE_DIR BUILD_DIR   (BUILD_DIR is reused: an
# incremental build when the sources did not change)
# Exit 0 pass, 1 fail (the test is named), 77 skipped (no cmake/compiler).
set -u
src=${1:?usage: test_sanitize.sh SOURCE_DIR BUILD_DIR}
bld=${2:?usage: test_sanitize.sh SOURCE_DIR BUILD_DIR}
command -v cmake >/dev/null 2>&1 || { echo "test_sanitize: cmake not found: skipping"; exit 77; }

fail() { echo "test_sanitize: FAIL: $*"; exit 1; }

tests="test_safetensors_mutate test_checkpoint_mutate test_datasets_mutate test_model_text_mutate test_cli_mutate
test_atomic_file test_atomic_special test_safetensors test_safetensors_bad test_history test_tensorboard
test_data_loader test_model_exec test_accumulate"

mkdir -p "$bld/tmp" || fail "cannot create $bld"
echo "== configure -DCTRAIN_SANITIZE=ON -DCTRAIN_WITH_CUDA=OFF"
cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 -DCTRAIN_SANITIZE=ON -DCTRAIN_WITH_CUDA=OFF \
  >"$bld/configure.log" 2>&1 || { cat "$bld/configure.log"; fail "configure"; }
echo "== build" $tests
cmake --build "$bld" -j2 --target $tests >"$bld/build.log" 2>&1 || { tail -50 "$bld/build.log"; fail "build"; }

for t in $tests; do
  start=$(date +%s)
  CTRAIN_TEST_TMP="$bld/tmp" OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$bld/tests/$t" >"$bld/$t.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || { tail -40 "$bld/$t.log"; fail "$t exited $rc under the sanitizers"; }
  echo "== $t: clean ($(( $(date +%s) - start )) s)"
done
echo "test_sanitize: PASS"
