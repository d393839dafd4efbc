#!/bin/sh
# The installed ctrain, as a user gets it (test_install.sh BUILD_DIR SOURCE_DIR):
#  1. `cmake --install` into a temporary prefix;
#  2. `pkg-config --cflags --libs ctrain` works there;
#  3. examples/fit.c (the README's example) compiles against the installed
#     copy through pkg-config, shared and static, and both run;
#  4. find_package(ctrain) builds it too, as a CMake project would;
#  5. libctrain.so's dynamic symbols and libctrain.a's globals are ct_
#     names only;
#  6. the installed `ctrain version` runs, under valgrind when it is
#     there (its CPU has no AVX-512);
#  7. `cpack -G DEB` makes a .deb that installs (into a scratch root,
#     with dpkg's own database there) and whose ctrain runs.
set -u
BUILD=$1
SRC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/ctrain_install.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
run() { # what, command...: runs it, its output shown on failure
  what=$1; shift
  if ! "$@" > "$T/out" 2>&1; then fail "$what: $(tail -20 "$T/out")"; return 1; fi
}

P="$T/prefix"
run "cmake --install" cmake --install "$BUILD" --prefix "$P" || { echo "1 failure(s)"; exit 1; }
LIB=$(ls -d "$P"/lib* | head -1)
for f in bin/ctrain include/ctrain/ctrain.h; do [ -e "$P/$f" ] || fail "not installed: $f"; done
for f in libctrain.a pkgconfig/ctrain.pc cmake/ctrain/ctrainConfig.cmake; do [ -e "$LIB/$f" ] || fail "not installed: lib/$f"; done
SONAME=$(objdump -p "$LIB/libctrain.so" 2>/dev/null | awk '/SONAME/ {print $2}')
case "$SONAME" in libctrain.so.[0-9]*) ;; *) fail "libctrain.so has soname '$SONAME'" ;; esac
[ -e "$LIB/$SONAME" ] || fail "$SONAME is not installed"

export PKG_CONFIG_PATH="$LIB/pkgconfig"
FLAGS=$(pkg-config --cflags --libs ctrain) || fail "pkg-config --cflags --libs ctrain"
echo "pkg-config: $FLAGS"
CC=${CC:-cc}
if run "cc fit.c (shared, pkg-config)" $CC -o "$T/fit" "$SRC/examples/fit.c" $FLAGS; then
  if run "fit (shared)" env LD_LIBRARY_PATH="$LIB" "$T/fit" synthetic:512 "$T/w.safetensors"; then
    grep -q "test accuracy" "$T/out" || fail "fit (shared) printed: $(cat "$T/out")"
  fi
fi
STATIC=$(pkg-config --static --libs ctrain | sed 's/-lctrain//')
if run "cc fit.c (static libctrain.a)" $CC -o "$T/fit_static" "$SRC/examples/fit.c" $(pkg-config --cflags ctrain) \
    "$LIB/libctrain.a" $STATIC; then
  run "fit (static)" "$T/fit_static" synthetic:512 "$T/w2.safetensors"
  ldd "$T/fit_static" | grep -q libctrain && fail "fit_static links libctrain.so"
fi

mkdir -p "$T/proj"
cp "$SRC/examples/fit.c" "$T/proj/"
cat > "$T/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(user C)
find_package(ctrain REQUIRED)
add_executable(fit fit.c)
target_link_libraries(fit PRIVATE ctrain::ctrain)
CM
if run "find_package(ctrain): configure" cmake -S "$T/proj" -B "$T/proj/b" -DCMAKE_PREFIX_PATH="$P" &&
   run "find_package(ctrain): build" cmake --build "$T/proj/b"; then
  run "fit (find_package)" env LD_LIBRARY_PATH="$LIB" "$T/proj/b/fit" synthetic:256 "$T/w3.safetensors"
fi

BAD=$(nm -D --defined-only "$LIB/libctrain.so" | awk '{print $NF}' | grep -v '^ct_' | head -5)
[ -z "$BAD" ] || fail "libctrain.so exports non-ct_ names: $BAD"
echo "libctrain.so exports $(nm -D --defined-only "$LIB/libctrain.so" | wc -l) names, all ct_"
BAD=$(nm -g --defined-only "$LIB/libctrain.a" | awk 'NF == 3 {print $3}' | grep -v '^ct_' | head -5)
[ -z "$BAD" ] || fail "libctrain.a has non-ct_ globals: $BAD"

run "installed ctrain version" "$P/bin/ctrain" version
if command -v valgrind > /dev/null; then
  run "installed ctrain version under valgrind" valgrind -q --tool=none --trace-children=yes "$P/bin/ctrain" version
else
  echo "note: valgrind not found; the installed ctrain ran natively only"
fi

if command -v cpack > /dev/null && command -v dpkg > /dev/null; then
  if run "cpack -G DEB" cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$T/deb"; then
    DEB=$(ls "$T"/deb/*.deb 2>/dev/null | head -1)
    mkdir -p "$T/root" "$T/admin/info" "$T/admin/updates"
    touch "$T/admin/status"
    if [ -z "$DEB" ]; then
      fail "cpack made no .deb"
    elif run "dpkg -i $(basename "$DEB")" dpkg --force-not-root --force-depends --force-script-chrootless \
        --admindir="$T/admin" --instdir="$T/root" -i "$DEB"; then
      R=$(ls -d "$T"/root/usr/lib* | head -1)
      run "ctrain version from the .deb" env LD_LIBRARY_PATH="$R" "$T/root/usr/bin/ctrain" version &&
        echo ".deb: $(basename "$DEB"), $(dpkg-deb -f "$DEB" Depends)"
    fi
  fi
else
  echo "note: cpack or dpkg not found; no .deb made"
fi

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "test_install: all passed"
