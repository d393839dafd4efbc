# Sourced by the CPU benchmark scripts (run.sh, recompute.sh): the allocator
# both sides run with.
#
# glibc's malloc serves blocks over its mmap threshold with mmap and gives
# freed memory at the heap's top back to the kernel, so a PyTorch step that
# frees its activations faults them in again on the next step. On the
# shared VM of 2026-11-28 that cost PyTorch 2-4x at random (the cnn: steps
# of 19 and 93 ms in one run; ResNet-18 3x32x32: 315 against 795 img/s).
# PyTorch's CPU performance guide answers this with a caching allocator
# (jemalloc or tcmalloc); these glibc tunables do the same without a
# package: no mmap, never trim. ctrain plans its memory once and is not
# affected, but both sides run under them. BENCH_MALLOC=glibc-default
# leaves glibc's defaults (what the results before 2026-11-28 ran with).
if [[ ${BENCH_MALLOC:-keep} != glibc-default ]]; then
  export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184
fi
BENCH_MALLOC_DESC="GLIBC_TUNABLES=${GLIBC_TUNABLES:-(glibc defaults)}"
