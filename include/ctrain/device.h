/* Devices: where tensors live and ops run.
 *
 * A device is opened from a spec string: "cpu" (oneDNN + OpenMP kernels),
 * "ref" (the portable C reference kernels, slow, used by tests), "cpu:N"
 * (virtual CPU device N: its own worker thread and its own memory
 * accounting, so data/model/pipeline parallel run and are tested without a
 * GPU) and "cuda" / "cuda:N" (when built with CUDA and a GPU is present).
 * Every device carries a backend function table; callers never branch on
 * the device type.
 */
#ifndef CTRAIN_DEVICE_H
#define CTRAIN_DEVICE_H

#include <stddef.h>
#include "ctrain/status.h"
#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_device_type {
  CT_DEVICE_CPU = 0,
  CT_DEVICE_REF = 1,
  CT_DEVICE_CUDA = 2
} ct_device_type;

/* Opens a device. Fails with CT_ERR_NO_DEVICE (and a one-line reason) if
 * the spec names a device this machine or build does not have. */
ct_status ct_device_open(const char *spec, ct_device **out);
void ct_device_close(ct_device *d);

ct_device_type ct_device_get_type(const ct_device *d);
int ct_device_index(const ct_device *d);        /* N of cpu:N / cuda:N, else 0 */
const char *ct_device_name(const ct_device *d);  /* "cpu", "cpu:1", "cuda:0" */

/* Memory accounting: bytes currently allocated through this device and the
 * high-water mark since open or the last ct_device_reset_peak(). */
size_t ct_device_mem_in_use(const ct_device *d);
size_t ct_device_mem_peak(const ct_device *d);
void ct_device_reset_peak(ct_device *d);

/* Allocates/frees device memory (64-byte aligned on the CPU). Allocation
 * failure returns NULL and records a message naming the size. */
void *ct_device_alloc(ct_device *d, size_t bytes);
void ct_device_free(ct_device *d, void *p);
/* Copies between host and device or within a device. NULL device = host. */
ct_status ct_device_copy(ct_device *dst_dev, void *dst, ct_device *src_dev, const void *src, size_t bytes);
/* Waits for all queued work on the device. */
ct_status ct_device_sync(ct_device *d);

/* Runs fn(arg) on the device's own thread (virtual CPU devices) or, for
 * devices without one, immediately on the caller's thread. Work submitted
 * to one device runs in submission order; ct_device_sync() waits for it. */
ct_status ct_device_submit(ct_device *d, void (*fn)(void *), void *arg);

/* Pinned (page-locked) host memory of the device, for buffers the host
 * fills and the device reads (a loader's batches): their copies are then
 * DMA transfers that overlap compute. NULL when the device has none (cpu,
 * ref: ordinary host memory serves). */
void *ct_device_host_alloc(ct_device *d, size_t bytes);
void ct_device_host_free(ct_device *d, void *p);
/* Whether the device can capture a training step as a CUDA graph and
 * replay it (ct_step_config.cuda_graph). */
int ct_device_can_capture_graphs(const ct_device *d);
/* Writes one line per visible CUDA GPU into buf (index, name, compute
 * capability, total/free memory, driver and runtime versions) and returns
 * how many there are; or returns -1 with the one-line reason there is none
 * (built without CUDA, no driver, no GPU). */
int ct_cuda_list_devices(char *buf, size_t n);
/* What computes on the cpu device in this build, as a short phrase for
 * `ctrain devices` ("oneDNN + OpenMP kernels", or the reference kernels
 * when built without oneDNN); a static string. */
const char *ct_cpu_backend_kernels(void);

/* The backend's choices so far, as text for benchmarks' profiles (each
 * cuDNN plan's algorithm, what cudnnFind* timed, the scratch buffer's
 * size), into buf, NUL-terminated and cut to n bytes; returns the length
 * of the whole text, as snprintf; 0 where the backend keeps none. */
size_t ct_device_describe(ct_device *d, char *buf, size_t n);
/* cuda: brackets what follows with the profiler's start and stop (nsys
 * --capture-range=cudaProfilerApi) while on; CT_ERR_UNSUPPORTED on a
 * device without a profiler. */
ct_status ct_device_set_profiler_range(ct_device *d, int on);

/* Threads used by CPU kernels on this device (OpenMP/oneDNN). */
void ct_device_set_threads(ct_device *d, int n);
int ct_device_threads(const ct_device *d);

/* cuDNN's two switches, as PyTorch's torch.backends.cudnn.benchmark and
 * .deterministic. The convolution plan cache keys on both, so a change
 * applies from the next call (a CUDA graph already captured keeps the
 * algorithms it captured); set them before ct_model_prepare, which sizes
 * each convolution's planned workspace for the algorithm chosen then (a
 * later call that needs more takes the device's scratch buffer).
 *
 * Benchmark: each convolution shape's algorithms are timed once and the
 * fastest that runs is kept, instead of cuDNN's heuristic order. Turning
 * it on fails with CT_ERR_INVALID_ARG on a device without cuDNN (only
 * cuda has it); turning it off always succeeds.
 *
 * Deterministic: on cuda, convolutions take only the algorithms and
 * engines cuDNN marks deterministic (no atomics), and every other kernel
 * is deterministic already (own kernels without atomics, cuBLASLt, cuDNN
 * batch norm), so a run repeats bit for bit on the same GPU, driver and
 * libraries, and a resumed run ends where an uninterrupted one does. The
 * choice also leaves out candidates whose workspace does not fit in the
 * free memory, so this assumes the GPU is not crowded by other processes
 * in a way that changes what fits. The
 * cpu and ref devices always are deterministic for a given thread count:
 * CT_OK, nothing changes. Benchmark mode still picks among the
 * deterministic algorithms by measured time, which can differ from one
 * process to the next: leave it off for runs that must repeat. */
ct_status ct_device_set_cudnn_benchmark(ct_device *d, int on);
ct_status ct_device_set_deterministic(ct_device *d, int on);

/* TF32, as PyTorch's torch.backends.cuda.matmul.allow_tf32 and
 * torch.backends.cudnn.allow_tf32 together: f32 matmuls (cuBLASLt's
 * CUBLAS_COMPUTE_32F_FAST_TF32) and convolutions (cuDNN's default math)
 * may round their inputs to TF32 (10 mantissa bits) for the tensor cores.
 * Off by default (f32 is computed in f32), unless the environment has
 * CTRAIN_CUDA_TF32=1 when the device opens. 16-bit inputs are unaffected.
 * The plan caches key on it, so a change applies from the next call; set
 * it before ct_model_prepare, which sizes each convolution's planned
 * workspace for the algorithm chosen then. Turning it on fails with
 * CT_ERR_INVALID_ARG on a device without TF32 (cpu, ref); off always
 * succeeds. */
ct_status ct_device_set_tf32(ct_device *d, int on);

#ifdef __cplusplus
}
#endif
#endif
