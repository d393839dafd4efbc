/* Kernel side of the CUDA emulator: force-included (g++ -include) into each
 * src/backend/cuda .cu file, compiled as C++ after the build rewrote every
 * `k<<<grid, block, smem, stream>>>(args)` into
 * `ct_emu_launch(k, grid, block, smem, stream)(args)`.
 *
 * A launch checks its configuration as the hardware would (block at most
 * 1024 threads, grid y/z at most 65535, dynamic shared memory at most 48
 * KiB) and each pointer argument (it must be device memory), then queues
 * the kernel on the stream (emu.h). When it runs, the blocks run one after
 * another and the threads of a block run as fibers (emu_kernel.cpp): each
 * runs until it ends or reaches a barrier; __syncthreads releases when all
 * threads of the block wait there, a warp shuffle when all 32 lanes of the
 * warp do. A barrier that some threads reach after others have exited, or
 * a shuffle with a missing lane, is reported as an error instead of
 * guessed at. __shared__ variables become function statics: blocks never
 * overlap, so one copy serves each block in turn. */
#ifndef CTRAIN_TESTS_EMU_KERNEL_H
#define CTRAIN_TESTS_EMU_KERNEL_H

#include <cuda_runtime_api.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* Every __shared__ variable in one section, which the scheduler fills with
 * 0xff bytes before each block: shared memory starts undefined on a GPU,
 * so a read before any write must not see the previous block's values. */
#define __shared__ static __attribute__((section("ct_emu_shared")))

namespace ct_emu {

/* The running fiber's thread index and its block's geometry. */
const uint3 &thread_idx();
extern thread_local uint3 block_idx;
extern thread_local dim3 block_dim, grid_dim;

/* Block barrier; returns the OR (op 1) / AND (op 2) / count (op 3) of the
 * threads' predicates, or 0 for a plain barrier (op 0). */
int block_barrier(int op, int pred);
/* Warp shuffle of 8 bytes: returns lane `src`'s value (all 32 lanes must
 * take part; mask must be full). */
uint64_t warp_shuffle(unsigned mask, uint64_t bits, int src_lane);

/* Queues kernel body `run` (all threads run it) over grid x block after
 * checking the configuration and that each non-NULL ptrs[i] (argument i,
 * NULL for non-pointers) is device memory aligned to aligns[i]. */
void launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, std::function<void()> run,
            const void *const *ptrs, const size_t *aligns, int nptrs);

/* Argument i's address when it is a pointer, else NULL; and the
 * alignment its pointee needs (1 for void). */
template <class T>
inline const void *arg_ptr(const T &a) {
  if constexpr (std::is_pointer_v<T>)
    return (const void *)a;
  else
    return nullptr;
}
template <class T>
inline size_t arg_align() {
  if constexpr (std::is_pointer_v<T> && !std::is_void_v<std::remove_cv_t<std::remove_pointer_t<T>>>)
    return alignof(std::remove_pointer_t<T>);
  else
    return 1;
}

template <class... P>
struct launcher {
  void (*kernel)(P...);
  const char *name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  /* Not a template: the arguments convert to the kernel's parameter
   * types at the call, as for a launch (NULL stays a null pointer). */
  void operator()(P... args) const {
    std::tuple<std::decay_t<P>...> params(args...);
    const void *ptrs[sizeof...(P) + 1];
    const size_t aligns[sizeof...(P) + 1] = {arg_align<std::decay_t<P>>()...};
    int n = 0;
    std::apply([&](const auto &...p) { ((ptrs[n++] = arg_ptr(p)), ...); }, params);
    auto k = kernel;
    launch(name, grid, block, smem, stream, [k, params]() { std::apply(k, params); }, ptrs, aligns, n);
  }
};

template <class... P>
inline launcher<P...> make_launcher(void (*k)(P...), const char *name, dim3 g, dim3 b, size_t smem,
                                    cudaStream_t s) {
  return launcher<P...>{k, name, g, b, smem, s};
}

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <class T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

}  // namespace ct_emu

#define ct_emu_launch(k, g, b, smem, s) ::ct_emu::make_launcher(k, #k, dim3(g), dim3(b), (size_t)(smem), (s))

#define threadIdx (::ct_emu::thread_idx())
#define blockIdx (::ct_emu::block_idx)
#define blockDim (::ct_emu::block_dim)
#define gridDim (::ct_emu::grid_dim)
#define warpSize 32

inline void __syncthreads() { ::ct_emu::block_barrier(0, 0); }
inline int __syncthreads_or(int p) { return ::ct_emu::block_barrier(1, p != 0); }
inline int __syncthreads_and(int p) { return ::ct_emu::block_barrier(2, p != 0); }
inline int __syncthreads_count(int p) { return ::ct_emu::block_barrier(3, p != 0); }

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  int lane = (int)(::ct_emu::thread_idx().x + ::ct_emu::block_dim.x *
                                                  (::ct_emu::thread_idx().y + ::ct_emu::block_dim.y * ::ct_emu::thread_idx().z)) &
             31;
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane; /* outside the sub-warp: own value, as the hardware */
  return ::ct_emu::from_bits<T>(::ct_emu::warp_shuffle(mask, ::ct_emu::to_bits(v), src));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  int lane = (int)(::ct_emu::thread_idx().x + ::ct_emu::block_dim.x *
                                                  (::ct_emu::thread_idx().y + ::ct_emu::block_dim.y * ::ct_emu::thread_idx().z)) &
             31;
  int src = lane + (int)delta;
  if (src / width != lane / width) src = lane;
  return ::ct_emu::from_bits<T>(::ct_emu::warp_shuffle(mask, ::ct_emu::to_bits(v), src));
}

inline float __uint_as_float(unsigned u) { return ::ct_emu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return (unsigned)::ct_emu::to_bits(f); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }

#endif
