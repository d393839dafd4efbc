/* What a training step needs to run ahead of the host: copies queued in
 * order on the compute stream, numbered events the host waits on for a
 * lagged read-back of the step statistics, and stream capture of a whole
 * step into a CUDA graph that is then replayed with one launch.
 *
 * A graph replays the exact kernel arguments and addresses it captured.
 * Addresses in the model's block never move; the device's scratch buffer
 * (cuDNN/cuBLASLt workspaces, reduction partials) moves when an op asks
 * for more than it has, so every graph remembers the buffer it captured
 * and refuses to launch after it moved. */
#include <stdlib.h>

#include "backend/cuda/cuda_impl.h"

#define STEP_EVENTS 8

struct cuda_step_events {
  cudaEvent_t ev[STEP_EVENTS];
};

typedef struct cuda_graph {
  cudaGraphExec_t exec;
  void *scratch;
  size_t scratch_bytes;
} cuda_graph;

ct_status cuda_copy_async(ct_device *d, void *dst, int dst_on_dev, const void *src, int src_on_dev, size_t bytes) {
  if (!bytes) return CT_OK;
  CT_TRY(cuda_enter(d));
  enum cudaMemcpyKind kind = dst_on_dev ? (src_on_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                        : (src_on_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, cuda_dev_of(d)->stream));
  return CT_OK;
}

static ct_status events(ct_device *d, int slot, cudaEvent_t *out) {
  cuda_dev *cd = cuda_dev_of(d);
  if (slot < 0 || slot >= STEP_EVENTS)
    return ct_error(CT_ERR_INVALID_ARG, "cuda event slot %d: expected 0..%d", slot, STEP_EVENTS - 1);
  if (!cd->step_events) {
    struct cuda_step_events *se = calloc(1, sizeof *se);
    if (!se) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda %s: out of host memory for step events", d->name);
    /* Blocking sync: the host waits on these for a whole step's lag, and a
     * spinning wait would take a core from the loader's threads. */
    for (int i = 0; i < STEP_EVENTS; i++) {
      cudaError_t e = cudaEventCreateWithFlags(&se->ev[i], cudaEventDisableTiming | cudaEventBlockingSync);
      if (e != cudaSuccess) {
        for (int j = 0; j < i; j++) (void)cudaEventDestroy(se->ev[j]);
        free(se);
        return cuda_rt_fail(e, __FILE__, __LINE__, "cudaEventCreateWithFlags (step events)");
      }
    }
    cd->step_events = se;
  }
  *out = cd->step_events->ev[slot];
  return CT_OK;
}

ct_status cuda_event_record(ct_device *d, int slot) {
  CT_TRY(cuda_enter(d));
  cudaEvent_t e = NULL;
  CT_TRY(events(d, slot, &e));
  CUDA_TRY(cudaEventRecord(e, cuda_dev_of(d)->stream));
  return CT_OK;
}

ct_status cuda_event_wait(ct_device *d, int slot) {
  CT_TRY(cuda_enter(d));
  cudaEvent_t e = NULL;
  CT_TRY(events(d, slot, &e));
  CUDA_TRY(cudaEventSynchronize(e));
  return CT_OK;
}

void cuda_step_events_free(ct_device *d) {
  cuda_dev *cd = cuda_dev_of(d);
  if (!cd->step_events) return;
  for (int i = 0; i < STEP_EVENTS; i++) (void)cudaEventDestroy(cd->step_events->ev[i]);
  free(cd->step_events);
  cd->step_events = NULL;
}

ct_status cuda_graph_begin(ct_device *d) {
  CT_TRY(cuda_enter(d));
  /* Thread-local mode: another thread's unrelated CUDA calls (a loader's
   * cudaHostAlloc) do not invalidate this capture, while an illegal call
   * on this thread (a synchronisation inside the step) still does. */
  CUDA_TRY(cudaStreamBeginCapture(cuda_dev_of(d)->stream, cudaStreamCaptureModeThreadLocal));
  return CT_OK;
}

ct_status cuda_graph_end(ct_device *d, void **graph) {
  cuda_dev *cd = cuda_dev_of(d);
  *graph = NULL;
  CT_TRY(cuda_enter(d));
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(cd->stream, &g);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (g) (void)cudaGraphDestroy(g);
    return cuda_rt_fail(e, __FILE__, __LINE__, "cudaStreamEndCapture (a call inside the step is not capturable)");
  }
  cudaGraphExec_t exec = NULL;
  e = cudaGraphInstantiate(&exec, g, 0);
  (void)cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_rt_fail(e, __FILE__, __LINE__, "cudaGraphInstantiate");
  }
  cuda_graph *cg = malloc(sizeof *cg);
  if (!cg) {
    (void)cudaGraphExecDestroy(exec);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda %s: out of host memory for a graph", d->name);
  }
  cg->exec = exec;
  cg->scratch = cd->scratch;
  cg->scratch_bytes = cd->scratch_bytes;
  *graph = cg;
  return CT_OK;
}

ct_status cuda_graph_launch(ct_device *d, void *graph) {
  cuda_dev *cd = cuda_dev_of(d);
  cuda_graph *cg = graph;
  if (cg->scratch != cd->scratch || cg->scratch_bytes != cd->scratch_bytes)
    return ct_error(CT_ERR_INVALID_ARG,
                    "cuda %s: the scratch buffer moved since the graph was captured (an op needed a larger "
                    "workspace); capture again",
                    d->name);
  CT_TRY(cuda_enter(d));
  CUDA_TRY(cudaGraphLaunch(cg->exec, cd->stream));
  return CT_OK;
}

void cuda_graph_free(ct_device *d, void *graph) {
  cuda_graph *cg = graph;
  if (!cg) return;
  (void)cudaSetDevice(cuda_dev_of(d)->ordinal);
  /* A launched graph may still be running; destroying its exec is safe
   * (the runtime defers), but keep the order explicit. */
  (void)cudaStreamSynchronize(cuda_dev_of(d)->stream);
  (void)cudaGraphExecDestroy(cg->exec);
  free(cg);
}
