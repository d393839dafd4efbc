/* One convolution pass through cuDNN's graph (backend descriptor) API, the
 * API cuDNN 9 builds on and the one PyTorch's convolutions use: an
 * operation graph of the one convolution, the engine configs cuDNN's
 * heuristics rank for it, and an execution plan per config that
 * finalizes. The legacy API's cudnnFind/_v7 calls choose among the handful
 * of algorithms that API names; the graph API reaches every engine cuDNN
 * has for the shape, including the newest architectures' kernels.
 *
 * cuda_conv.c uses it unless CTRAIN_CUDA_CONV_API=legacy: the plans become
 * candidates ahead of the legacy algorithms (under cudnn_benchmark all are
 * timed and ordered by time), so anything the graph API refuses still runs
 * through the legacy API. Engines that compile at run time (behaviour note
 * RUNTIME_COMPILATION, seconds per plan) are skipped, and so, in the
 * deterministic mode, are those cuDNN notes NONDETERMINISTIC (atomics).
 * Alpha and beta are part of an operation, so a plan serves one beta. Pointers passed to
 * cuda_conv_graph_run must be CUDA_CONV_GRAPH_ALIGN-byte aligned (the
 * tensors are declared so). */
#ifndef CTRAIN_CUDA_CONV_GRAPH_H
#define CTRAIN_CUDA_CONV_GRAPH_H

#include "backend/cuda/cuda_impl.h"

#define CUDA_CONV_GRAPH_ALIGN 16

/* The pass: kind 0 forward (y from x, w), 1 backward data (dx from dy, w),
 * 2 backward filter (dw from x, dy); shapes x [N,C,H,W], w [K,C,R,S],
 * y [N,K,OH,OW] (no groups); every tensor in dtype rt, channels-last
 * (filter KRSC) when nhwc; out = 1 * result + beta * out. */
typedef struct cuda_conv_desc {
  int kind;
  const ct_conv2d_params *p;
  const int64_t *xs, *wsh, *ys;
  ct_dtype rt;
  int nhwc;
  float beta;
  int deterministic; /* leave out engines with the numerical note NONDETERMINISTIC */
} cuda_conv_desc;

/* One finalized execution plan. */
typedef struct cuda_graph_plan {
  cudnnBackendDescriptor_t plan;
  long long engine; /* cuDNN's global engine index */
  size_t wsb;       /* workspace bytes */
  float ms;         /* measured time of one call; -1 when not timed */
} cuda_graph_plan;

/* The descriptors behind a set of plans (they stay alive as long as the
 * plans run); freed with cuda_conv_graph_free. */
typedef struct cuda_conv_graph cuda_conv_graph;

/* Builds the plans for c, best first, at most max: the heuristic's order,
 * or with bench each plan timed on scratch buffers of its own (outside a
 * stream capture) and ordered by time, plans that failed to run dropped,
 * as are plans whose workspace exceeds half the free device memory.
 * *n 0 when cuDNN offers no engine (NOT_SUPPORTED is no error); *g NULL
 * then. Other cuDNN failures are errors. */
ct_status cuda_conv_graph_build(ct_device *d, cudnnHandle_t h, const cuda_conv_desc *c, int bench,
                                cuda_graph_plan *out, int max, int *n, cuda_conv_graph **g);

/* Builds and finalizes c's tensors, convolution, operation and operation
 * graph without a handle, then frees them: what cuDNN checks with no
 * device (attribute types and counts, shapes against the convolution,
 * strides), so a machine without a GPU tests the descriptors the plans
 * are built on against the real library (test_cudnn_graph_desc). *what
 * names the call that failed. */
cudnnStatus_t cuda_conv_graph_check(const cuda_conv_desc *c, const char **what);

/* Queues one plan on h's stream; x, w, y as c.kind names them. */
cudnnStatus_t cuda_conv_graph_run(cudnnHandle_t h, cudnnBackendDescriptor_t plan, void *x, void *w, void *y,
                                  void *ws);

void cuda_conv_graph_free(cuda_conv_graph *g);

#endif
