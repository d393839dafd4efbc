/* CUDA device lifetime, memory, copies and error text. Only the runtime
 * API (cudart) is used, never the driver API, so a binary built here runs
 * on machines without a driver and says "no CUDA driver" when asked for a
 * GPU. */
#include <cuda_profiler_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

ct_status cuda_rt_fail(cudaError_t e, const char *file, int line, const char *call) {
  ct_status s = (e == cudaErrorMemoryAllocation) ? CT_ERR_OUT_OF_MEMORY : CT_ERR_BACKEND;
  return ct_error(s, "%s:%d: %s: %s (%s)", base_name(file), line, call, cudaGetErrorString(e), cudaGetErrorName(e));
}

ct_status cuda_lt_fail(cublasStatus_t e, const char *file, int line, const char *call) {
  ct_status s = (e == CUBLAS_STATUS_ALLOC_FAILED) ? CT_ERR_OUT_OF_MEMORY : CT_ERR_BACKEND;
  return ct_error(s, "%s:%d: %s: cuBLAS status %d (%s)", base_name(file), line, call, (int)e,
                  e == CUBLAS_STATUS_NOT_SUPPORTED   ? "not supported for these types/shapes"
                  : e == CUBLAS_STATUS_INVALID_VALUE ? "invalid value"
                  : e == CUBLAS_STATUS_ALLOC_FAILED  ? "out of memory"
                  : e == CUBLAS_STATUS_NOT_INITIALIZED ? "not initialized"
                  : e == CUBLAS_STATUS_ARCH_MISMATCH ? "architecture mismatch"
                  : e == CUBLAS_STATUS_EXECUTION_FAILED ? "execution failed"
                                                        : "error");
}

ct_status cuda_dnn_fail(cudnnStatus_t e, const char *file, int line, const char *call) {
  ct_status s = (e == CUDNN_STATUS_ALLOC_FAILED) ? CT_ERR_OUT_OF_MEMORY : CT_ERR_BACKEND;
  return ct_error(s, "%s:%d: %s: %s", base_name(file), line, call, cudnnGetErrorString(e));
}

ct_status cuda_launched(const char *what, const char *file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return CT_OK;
  return ct_error(CT_ERR_BACKEND, "%s:%d: kernel launch for %s: %s (%s)", base_name(file), line, what,
                  cudaGetErrorString(e), cudaGetErrorName(e));
}

ct_status cuda_check_float(const char *op, const ct_tensor *t, int pos) {
  if (!t || cuda_float_dtype(t->dtype)) return CT_OK;
  return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: tensor argument %d has dtype %s; the CUDA kernels take f32, bf16 or f16",
                  op, pos, ct_dtype_name(t->dtype) ? ct_dtype_name(t->dtype) : "?");
}

cudaStream_t cuda_stream(ct_device *d) { return cuda_dev_of(d)->stream; }

ct_status cuda_enter(ct_device *d) {
  CUDA_TRY(cudaSetDevice(cuda_dev_of(d)->ordinal));
  return CT_OK;
}

ct_status cuda_scratch(ct_device *d, size_t bytes, void **out) {
  cuda_dev *cd = cuda_dev_of(d);
  if (bytes > cd->scratch_bytes) {
    /* Round up so a sequence of slightly growing requests reallocates
     * rarely. */
    size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
    CUDA_TRY(cudaStreamSynchronize(cd->stream));
    if (cd->scratch) {
      CUDA_TRY(cudaFree(cd->scratch));
      ct_device_account(d, -(long long)cd->scratch_bytes);
    }
    cd->scratch = NULL;
    cd->scratch_bytes = 0;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e == cudaErrorMemoryAllocation && want > bytes) {
      /* Near the memory's end the headroom may be what does not fit. */
      (void)cudaGetLastError();
      want = bytes;
      e = cudaMalloc(&p, want);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda_device.c: cudaMalloc(%zu) for %s scratch: %s", want, d->name,
                      cudaGetErrorString(e));
    }
    cd->scratch = p;
    cd->scratch_bytes = want;
    ct_device_account(d, (long long)want);
  }
  *out = cd->scratch;
  return CT_OK;
}

ct_status cuda_dnn_handle(ct_device *d, cudnnHandle_t *out) {
  cuda_dev *cd = cuda_dev_of(d);
  if (!cd->dnn) {
    cudnnHandle_t h = NULL;
    CUDNN_TRY(cudnnCreate(&h));
    cudnnStatus_t s = cudnnSetStream(h, cd->stream);
    if (s != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(h);
      return cuda_dnn_fail(s, __FILE__, __LINE__, "cudnnSetStream(h, cd->stream)");
    }
    cd->dnn = h;
  }
  *out = cd->dnn;
  return CT_OK;
}

/* Why no GPU can be used, in one line; NULL when cudaGetDeviceCount works. */
static const char *no_gpu_reason(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return NULL;
    case cudaErrorInsufficientDriver: return "no CUDA driver (libcuda.so missing or older than this CUDA runtime)";
    case cudaErrorNoDevice: return "no CUDA GPU found (none present, or CUDA_VISIBLE_DEVICES hides them all)";
    default: return NULL;
  }
}

ct_status cuda_open(ct_device *d) {
  char spec[32];
  snprintf(spec, sizeof spec, "cuda:%d", d->index);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    const char *why = no_gpu_reason(e);
    (void)cudaGetLastError();
    if (why) return ct_error(CT_ERR_NO_DEVICE, "device '%s': %s", spec, why);
    return ct_error(CT_ERR_NO_DEVICE, "device '%s': CUDA cannot list GPUs: %s (%s)", spec, cudaGetErrorString(e),
                    cudaGetErrorName(e));
  }
  if (n == 0) return ct_error(CT_ERR_NO_DEVICE, "device '%s': %s", spec, no_gpu_reason(cudaErrorNoDevice));
  if (d->index >= n) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    return ct_error(CT_ERR_NO_DEVICE, "device '%s': index out of range, %d CUDA GPU%s visible (cuda:0..cuda:%d)%s%s", spec,
                    n, n == 1 ? "" : "s", n - 1, vis ? "; CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "");
  }
  cuda_dev *cd = calloc(1, sizeof *cd);
  if (!cd) return ct_error(CT_ERR_OUT_OF_MEMORY, "device '%s': out of host memory", spec);
  cd->ordinal = d->index;
  const char *tf = getenv("CTRAIN_CUDA_TF32");
  cd->tf32 = tf && tf[0] == '1';
  /* CTRAIN_CUDA_BN_FUSE=0: batch norm and its ReLU as two passes, to
   * measure what cuDNN's fusion is worth (cuda_bnorm.c) */
  const char *bf = getenv("CTRAIN_CUDA_BN_FUSE");
  cd->bn_act_refused = bf && bf[0] == '0';
  const char *api = getenv("CTRAIN_CUDA_CONV_API");
  if (api && *api && strcmp(api, "graph") && strcmp(api, "legacy")) {
    free(cd);
    return ct_error(CT_ERR_INVALID_ARG, "device '%s': CTRAIN_CUDA_CONV_API=%s: expected graph or legacy", spec, api);
  }
  /* the graph API by default: faster training steps than the legacy API
   * alone (bench/results/2026-11-28-h200-gpu.md) */
  cd->conv_graph = !(api && !strcmp(api, "legacy"));
  /* CTRAIN_CUDA_S2D: auto (the default), 1 always where it fits, 0 never */
  const char *sd = getenv("CTRAIN_CUDA_S2D");
  if (sd && *sd && strcmp(sd, "0") && strcmp(sd, "1") && strcmp(sd, "auto")) {
    free(cd);
    return ct_error(CT_ERR_INVALID_ARG, "device '%s': CTRAIN_CUDA_S2D=%s: expected auto, 1 or 0", spec, sd);
  }
  cd->s2d = !sd || !*sd || !strcmp(sd, "auto") ? CUDA_S2D_AUTO : sd[0] == '1' ? CUDA_S2D_ALWAYS : CUDA_S2D_OFF;
  pthread_mutex_init(&cd->mu, NULL);
  d->impl = cd;
  ct_status s = CT_OK;
  cudaError_t ce = cudaSetDevice(cd->ordinal);
  if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&cd->stream, cudaStreamNonBlocking);
  if (ce != cudaSuccess) {
    s = ct_error(CT_ERR_NO_DEVICE, "device '%s': cannot start a CUDA context: %s (%s)", spec, cudaGetErrorString(ce),
                 cudaGetErrorName(ce));
  } else if ((s = cuda_lt_load()) != CT_OK) {
    s = ct_error_wrap(s, "device '%s': ", spec);
  } else {
    cublasStatus_t be = cuda_lt.Create(&cd->lt);
    if (be != CUBLAS_STATUS_SUCCESS) s = cuda_lt_fail(be, __FILE__, __LINE__, "cublasLtCreate(&cd->lt)");
  }
  if (s == CT_OK) {
    ce = cudaStreamCreateWithFlags(&cd->copy_stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&cd->copy_done, cudaEventDisableTiming);
    if (ce != cudaSuccess) s = cuda_rt_fail(ce, __FILE__, __LINE__, "cudaStreamCreate/cudaEventCreate (copy stream)");
  }
  if (s != CT_OK) {
    cuda_close(d);
    return s;
  }
  return CT_OK;
}

void cuda_close(ct_device *d) {
  cuda_dev *cd = cuda_dev_of(d);
  if (!cd) return;
  /* Teardown cannot report failures; it releases what it can. */
  (void)cudaSetDevice(cd->ordinal);
  if (cd->stream) (void)cudaStreamSynchronize(cd->stream);
  if (cd->copy_stream) (void)cudaStreamSynchronize(cd->copy_stream);
  cuda_coll_close(d);
  cuda_conv_cache_free(d);
  cuda_blas_cache_free(d);
  cuda_step_events_free(d);
  if (cd->copy_done) (void)cudaEventDestroy(cd->copy_done);
  if (cd->copy_stream) (void)cudaStreamDestroy(cd->copy_stream);
  if (cd->bn_relu) cudnnDestroyActivationDescriptor(cd->bn_relu);
  if (cd->dnn) cudnnDestroy(cd->dnn);
  if (cd->lt) cuda_lt.Destroy(cd->lt);
  if (cd->scratch) {
    (void)cudaFree(cd->scratch);
    ct_device_account(d, -(long long)cd->scratch_bytes);
  }
  if (cd->stream) (void)cudaStreamDestroy(cd->stream);
  (void)cudaGetLastError();
  pthread_mutex_destroy(&cd->mu);
  free(cd->keys);
  free(cd->sizes);
  free(cd);
  d->impl = NULL;
}

/* ---- allocation size table (open addressing, linear probing) ---- */

static size_t slot_of(const void *p, size_t cap) {
  uintptr_t h = (uintptr_t)p >> 8; /* cudaMalloc returns 256-byte aligned pointers */
  h ^= h >> 17;
  h *= (uintptr_t)0x9E3779B97F4A7C15ull;
  return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

static int table_put(cuda_dev *cd, void *p, size_t bytes) {
  if ((cd->count + 1) * 2 > cd->cap) {
    size_t ncap = cd->cap ? cd->cap * 2 : 256;
    void **nk = calloc(ncap, sizeof *nk);
    size_t *ns = calloc(ncap, sizeof *ns);
    if (!nk || !ns) {
      free(nk);
      free(ns);
      return -1;
    }
    for (size_t i = 0; i < cd->cap; i++)
      if (cd->keys[i]) {
        size_t j = slot_of(cd->keys[i], ncap);
        while (nk[j]) j = (j + 1) & (ncap - 1);
        nk[j] = cd->keys[i];
        ns[j] = cd->sizes[i];
      }
    free(cd->keys);
    free(cd->sizes);
    cd->keys = nk;
    cd->sizes = ns;
    cd->cap = ncap;
  }
  size_t j = slot_of(p, cd->cap);
  while (cd->keys[j]) j = (j + 1) & (cd->cap - 1);
  cd->keys[j] = p;
  cd->sizes[j] = bytes;
  cd->count++;
  return 0;
}

/* Removes p and returns its size; (size_t)-1 if p was not allocated here. */
static size_t table_take(cuda_dev *cd, void *p) {
  if (!cd->cap) return (size_t)-1;
  size_t j = slot_of(p, cd->cap);
  while (cd->keys[j] && cd->keys[j] != p) j = (j + 1) & (cd->cap - 1);
  if (!cd->keys[j]) return (size_t)-1;
  size_t bytes = cd->sizes[j];
  cd->keys[j] = NULL;
  cd->count--;
  /* Re-insert the rest of the probe run so later lookups still find them. */
  for (size_t k = (j + 1) & (cd->cap - 1); cd->keys[k]; k = (k + 1) & (cd->cap - 1)) {
    void *kp = cd->keys[k];
    size_t ks = cd->sizes[k];
    cd->keys[k] = NULL;
    size_t m = slot_of(kp, cd->cap);
    while (cd->keys[m]) m = (m + 1) & (cd->cap - 1);
    cd->keys[m] = kp;
    cd->sizes[m] = ks;
  }
  return bytes;
}

void *cuda_alloc(ct_device *d, size_t bytes) {
  cuda_dev *cd = cuda_dev_of(d);
  if (cuda_enter(d) != CT_OK) return NULL;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    (void)cudaMemGetInfo(&fr, &tot);
    (void)cudaGetLastError();
    ct_error(e == cudaErrorMemoryAllocation ? CT_ERR_OUT_OF_MEMORY : CT_ERR_BACKEND,
             "cuda_device.c:%d: cudaMalloc(%zu) on %s: %s (%zu of %zu bytes free)", __LINE__, bytes, d->name,
             cudaGetErrorString(e), fr, tot);
    return NULL;
  }
  pthread_mutex_lock(&cd->mu);
  int r = table_put(cd, p, bytes);
  pthread_mutex_unlock(&cd->mu);
  if (r) {
    (void)cudaFree(p);
    ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of host memory for the allocation table", d->name);
    return NULL;
  }
  return p;
}

void cuda_free(ct_device *d, void *p) {
  cuda_dev *cd = cuda_dev_of(d);
  if (!p) return;
  pthread_mutex_lock(&cd->mu);
  size_t bytes = table_take(cd, p);
  pthread_mutex_unlock(&cd->mu);
  (void)cudaSetDevice(cd->ordinal);
  /* cudaFree waits for queued work that may still read p. */
  (void)cudaFree(p);
  (void)cudaGetLastError();
  if (bytes != (size_t)-1) ct_device_account(d, -(long long)bytes);
}

ct_status cuda_copy(ct_device *d, void *dst, int dst_on_dev, const void *src, int src_on_dev, size_t bytes) {
  cuda_dev *cd = cuda_dev_of(d);
  if (!bytes) return CT_OK;
  CT_TRY(cuda_enter(d));
  enum cudaMemcpyKind kind = dst_on_dev ? (src_on_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                        : (src_on_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, cd->stream));
  /* The host side must be safe to use when this returns: a host
   * destination must hold the data, and a pinned host source would be read
   * by the DMA after we return (pageable sources are staged before
   * cudaMemcpyAsync returns). Device-to-device stays queued in order. */
  int wait = 0;
  if (!dst_on_dev) {
    wait = 1;
  } else if (!src_on_dev) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, src) != cudaSuccess) {
      (void)cudaGetLastError();
      wait = 1;
    } else {
      wait = a.type == cudaMemoryTypeHost;
    }
  }
  if (wait) CUDA_TRY(cudaStreamSynchronize(cd->stream));
  return CT_OK;
}

ct_status cuda_sync(ct_device *d) {
  CT_TRY(cuda_enter(d));
  CUDA_TRY(cudaStreamSynchronize(cuda_dev_of(d)->stream));
  return CT_OK;
}

int cuda_list_devices(char *buf, size_t n) {
  int count = 0, drv = 0, rt = 0;
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    const char *why = no_gpu_reason(e == cudaSuccess ? cudaErrorNoDevice : e);
    snprintf(buf, n, "%s (CUDA runtime %d.%d)", why ? why : cudaGetErrorString(e), rt / 1000, (rt % 1000) / 10);
    (void)cudaGetLastError();
    return -1;
  }
  size_t off = 0;
  int cur = 0;
  (void)cudaGetDevice(&cur);
  for (int i = 0; i < count && off < n; i++) {
    struct cudaDeviceProp prop;
    size_t fr = 0, tot = 0;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      off += (size_t)snprintf(buf + off, n - off, "cuda:%-3d (properties unavailable)\n", i);
      continue;
    }
    if (cudaSetDevice(i) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
      (void)cudaGetLastError();
      fr = 0;
      tot = prop.totalGlobalMem;
    }
    off += (size_t)snprintf(buf + off, n - off,
                            "cuda:%-3d %s, compute capability %d.%d, %d SMs, %.1f GiB total, %.1f GiB free, "
                            "driver %d.%d, runtime %d.%d\n",
                            i, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                            (double)prop.totalGlobalMem / 1073741824.0, (double)fr / 1073741824.0, drv / 1000,
                            (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
  }
  (void)cudaSetDevice(cur);
  (void)cudaGetLastError();
  return count;
}

/* ---- pinned staging and the copy stream ---- */

void *cuda_host_alloc(ct_device *d, size_t bytes) {
  if (cuda_enter(d) != CT_OK) return NULL;
  void *p = NULL;
  /* Portable: the loader's threads fill it and any context may DMA it. */
  cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    ct_error(CT_ERR_OUT_OF_MEMORY, "cuda_device.c:%d: cudaHostAlloc(%zu) for %s staging: %s", __LINE__, bytes,
             d->name, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

void cuda_host_free(ct_device *d, void *p) {
  (void)d;
  if (!p) return;
  (void)cudaFreeHost(p);
  (void)cudaGetLastError();
}

ct_status cuda_copy_h2d_async(ct_device *d, void *dst, const void *src, size_t bytes) {
  cuda_dev *cd = cuda_dev_of(d);
  if (!bytes) return CT_OK;
  CT_TRY(cuda_enter(d));
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cd->copy_stream));
  CUDA_TRY(cudaEventRecord(cd->copy_done, cd->copy_stream));
  /* Compute queued from now on reads dst only after the copy lands. */
  CUDA_TRY(cudaStreamWaitEvent(cd->stream, cd->copy_done, 0));
  return CT_OK;
}

ct_status cuda_set_option(ct_device *d, const char *name, int value) {
  if (!strcmp(name, "cudnn_benchmark")) {
    cuda_dev_of(d)->cudnn_benchmark = value != 0;
    return CT_OK;
  }
  if (!strcmp(name, "deterministic")) {
    cuda_dev_of(d)->deterministic = value != 0;
    return CT_OK;
  }
  if (!strcmp(name, "tf32")) {
    cuda_dev_of(d)->tf32 = value != 0;
    return CT_OK;
  }
  if (!strcmp(name, "profiler_range")) {
    /* Starts (1) or stops (0) the profiler's collection: Nsight Compute
     * run with --profile-from-start off records only what is queued in
     * between (bench_train --profiler-range, bench/gpu/ncu_table.py). */
    CT_TRY(cuda_enter(d));
    CUDA_TRY(value ? cudaProfilerStart() : cudaProfilerStop());
    return CT_OK;
  }
  return ct_error(CT_ERR_NOT_FOUND,
                  "%s: no backend option '%s' (known: cudnn_benchmark, deterministic, tf32, profiler_range)", d->name, name);
}

ct_status cuda_mem_info(ct_device *d, size_t *free_bytes, size_t *total_bytes) {
  CT_TRY(cuda_enter(d));
  CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
  return CT_OK;
}
