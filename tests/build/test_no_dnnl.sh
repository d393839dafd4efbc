#!/bin/sh
# A build without oneDNN (-DCTRAIN_WITH_DNNL=OFF, as on a GPU machine that
# has no libdnnl): configure says so in one line, the library, CLI and a
# few unit tests build without linking oneDNN, those tests pass (the cpu
# device then runs the reference kernels for conv/matmul/pooling), `ctrain
# train` trains mlp and cnn on synthetic data, and channels-last on the
# cpu device is refused with exit 6 (the reference reads NCHW only).
#
# usage: test_no_dnnl.sh SOURCE_DIR BUILD_DIR   (BUILD_DIR is wiped first)
# Exit 0 pass, 1 fail (the step is named), 77 skipped (no cmake/compiler).
set -u
src=${1:?usage: test_no_dnnl.sh SOURCE_DIR BUILD_DIR}
bld=${2:?usage: test_no_dnnl.sh SOURCE_DIR BUILD_DIR}
command -v cmake >/dev/null 2>&1 || { echo "test_no_dnnl: cmake not found: skipping"; exit 77; }
command -v "${CC:-cc}" >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 ||
  { echo "test_no_dnnl: no C compiler: skipping"; exit 77; }

fail() { echo "test_no_dnnl: FAIL: $*"; exit 1; }
step() { echo "== $*"; }

# The unit tests: the reference ops, the cpu device's ops against the
# reference (the op test on its cpu target) and the trainer (ct_fit).
# Model execution on the reference kernels is the main build's
# test_model_exec (its "ref" device).
tests="test_ref_ops test_ops_vs_ref test_accumulate"

rm -rf "$bld" && mkdir -p "$bld" || fail "cannot create $bld"
step "configure -DCTRAIN_WITH_DNNL=OFF -DCTRAIN_WITH_CUDA=OFF"
cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DCTRAIN_WITH_DNNL=OFF -DCTRAIN_WITH_CUDA=OFF \
  >"$bld/configure.log" 2>&1 || { cat "$bld/configure.log"; fail "configure"; }
grep -q "ctrain: oneDNN not found (or CTRAIN_WITH_DNNL=OFF): the cpu device runs the portable reference kernels" \
  "$bld/configure.log" || { cat "$bld/configure.log"; fail "configure did not print the no-oneDNN status line"; }

step "build ctrain_cli $tests"
cmake --build "$bld" -j2 --target ctrain_cli $tests >"$bld/build.log" 2>&1 ||
  { tail -50 "$bld/build.log"; fail "build"; }
# -Wall -Wextra clean without oneDNN too.
if grep -q "warning:" "$bld/build.log"; then grep -A3 "warning:" "$bld/build.log"; fail "build warnings"; fi
cli="$bld/ctrain"
[ -x "$cli" ] || fail "no $cli after the build"
# Nothing may pull oneDNN in (a stray DNNL::dnnl link or dnnl_* source).
if command -v ldd >/dev/null 2>&1 && ldd "$cli" | grep -qi dnnl; then fail "ctrain links oneDNN"; fi
if nm "$bld/libctrain.a" 2>/dev/null | grep -q " U dnnl_"; then fail "libctrain.a references dnnl_ symbols"; fi

mkdir -p "$bld/tmp"
for t in $tests; do
  step "$t"
  CTRAIN_TEST_TMP="$bld/tmp" CTRAIN_TEST_BACKENDS=cpu OMP_NUM_THREADS=2 "$bld/tests/$t" >"$bld/$t.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { tail -30 "$bld/$t.log"; fail "$t exited $rc"; }
done

step "ctrain devices"
"$cli" devices >"$bld/devices.log" 2>&1 || { cat "$bld/devices.log"; fail "ctrain devices"; }
grep -q "^cpu .*reference kernels.*without oneDNN" "$bld/devices.log" ||
  { cat "$bld/devices.log"; fail "ctrain devices does not say the cpu device runs the reference kernels"; }

for m in mlp cnn; do
  step "ctrain train --model $m (synthetic, 4 steps)"
  OMP_NUM_THREADS=2 "$cli" train --model $m --data synthetic --max-steps 4 --batch-size 16 --seed 3 \
    >"$bld/train_$m.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { cat "$bld/train_$m.log"; fail "ctrain train --model $m exited $rc"; }
  grep -q "train_loss: [0-9]" "$bld/train_$m.log" || { cat "$bld/train_$m.log"; fail "$m: no train_loss reported"; }
done

step "channels-last on the cpu device is refused (exit 6)"
"$cli" train --model cnn --data synthetic --max-steps 1 --batch-size 16 --memory-format channels-last \
  >"$bld/channels_last.log" 2>&1
rc=$?
[ $rc -eq 6 ] || { cat "$bld/channels_last.log"; fail "channels-last exited $rc, expected 6"; }
grep -q "channels-last" "$bld/channels_last.log" || { cat "$bld/channels_last.log"; fail "refusal does not name channels-last"; }

echo "test_no_dnnl: PASS"
