/* cuDNN graph API plans for one convolution pass (cuda_conv_graph.h says
 * what and why). The descriptors follow cuDNN 9's backend API reference:
 * three tensors (unique ids 'x', 'w', 'y'; dims in N,C,H,W order with
 * strides giving the layout), a convolution descriptor, one convolution
 * operation, its operation graph, heuristics (mode A), then one execution
 * plan per engine config. The handle attributes of the graph and the plan
 * are deprecated in favour of device-property descriptors in recent 9.x
 * releases but work in every 9.x, which is why they are used. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_conv_graph.h"
#include "backend/device_impl.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* Engine configs asked of the heuristics: enough to find the plans that
 * finalize among the top ones, few enough that building stays quick. */
#define HEUR_MAX 24

struct cuda_conv_graph {
  cudnnBackendDescriptor_t t[3], conv, op, graph;
  cudnnBackendDescriptor_t cfg[HEUR_MAX], plan[HEUR_MAX];
  int ncfg, nplan;
};

void cuda_conv_graph_free(cuda_conv_graph *g) {
  if (!g) return;
  for (int i = 0; i < g->nplan; i++) cudnnBackendDestroyDescriptor(g->plan[i]);
  for (int i = 0; i < g->ncfg; i++) cudnnBackendDestroyDescriptor(g->cfg[i]);
  cudnnBackendDescriptor_t d[] = {g->graph, g->op, g->conv, g->t[0], g->t[1], g->t[2]};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
    if (d[i]) cudnnBackendDestroyDescriptor(d[i]);
  free(g);
}

#define GDNN(call)                                                  \
  do {                                                              \
    cudnnStatus_t dnn_e_ = (call);                                  \
    if (dnn_e_ != CUDNN_STATUS_SUCCESS) {                           \
      e = dnn_e_;                                                   \
      what = #call;                                                 \
      goto done;                                                    \
    }                                                               \
  } while (0)

static const int64_t uid[3] = {'x', 'w', 'y'};

static cudnnDataType_t dnn_type(ct_dtype t) {
  return t == CT_F32 ? CUDNN_DATA_FLOAT : t == CT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

/* Strides of a [N,C,H,W] (or [K,C,R,S]) tensor, packed NCHW or NHWC. */
static void strides_of(const int64_t *s, int nhwc, int64_t *st) {
  if (nhwc) st[1] = 1, st[3] = s[1], st[2] = s[3] * s[1], st[0] = s[2] * s[3] * s[1];
  else st[3] = 1, st[2] = s[3], st[1] = s[2] * s[3], st[0] = s[1] * s[2] * s[3];
}

static cudnnStatus_t make_tensor(int64_t id, const int64_t *dims, int nhwc, cudnnDataType_t dt,
                                 cudnnBackendDescriptor_t *out) {
  int64_t st[4], align = CUDA_CONV_GRAPH_ALIGN;
  strides_of(dims, nhwc, st);
  cudnnStatus_t e = cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, out);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, st);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
  if (e == CUDNN_STATUS_SUCCESS)
    e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendFinalize(*out);
  return e;
}

static cudnnStatus_t make_conv(const ct_conv2d_params *p, cudnnBackendDescriptor_t *out) {
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2, pad[2] = {p->pad_h, p->pad_w}, str[2] = {p->stride_h, p->stride_w};
  const int64_t dil[2] = {p->dil_h, p->dil_w};
  cudnnStatus_t e = cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, out);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  if (e == CUDNN_STATUS_SUCCESS)
    e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendSetAttribute(*out, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendFinalize(*out);
  return e;
}

/* The operation's descriptor type and attribute names, by pass: tensors in
 * x, w, y order, then the convolution, alpha and beta. */
static const cudnnBackendDescriptorType_t op_type[3] = {
    CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
};
static const cudnnBackendAttributeName_t op_attr[3][6] = {
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
};

/* 1 when the engine behind cfg is one to leave out: it compiles its
 * kernel at run time (seconds a plan), or it converts its inputs down
 * (numerical note DOWN_CONVERT_INPUTS): PyTorch leaves those out for
 * every dtype (Conv_v8.cpp, filterEngineConfigs), and cuDNN does not say
 * what precision they compute in; with det, also an engine whose results
 * may differ run to run (numerical note NONDETERMINISTIC), as PyTorch's
 * torch.backends.cudnn.deterministic leaves them out.
 * cudnnBackendGetAttribute's count is how many the attribute has; it
 * writes at most the number asked for, hence the clamps. */
static int left_out(cudnnBackendDescriptor_t cfg, int det) {
  cudnnBackendDescriptor_t eng = NULL;
  int64_t n = 0;
  cudnnBackendBehaviorNote_t bn[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  cudnnBackendNumericalNote_t nn[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int out = 0;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return 1;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) !=
      CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(eng);
    return 1;
  }
  if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, bn) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < n && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
      out |= bn[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, nn) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
      out |= nn[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
             (det && nn[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
  } else {
    out |= det; /* notes unknown: not known to be deterministic */
  }
  cudnnBackendDestroyDescriptor(eng);
  return out;
}

static long long engine_index(cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t eng = NULL;
  int64_t n = 0, idx = -1;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return -1;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
      CUDNN_STATUS_SUCCESS)
    (void)cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &idx);
  cudnnBackendDestroyDescriptor(eng);
  return (long long)idx;
}

/* A finalized variant pack binding x, w, y (uids 'x', 'w', 'y') and the
 * workspace; *vp NULL on failure. Any plan of the same pass runs on it. */
static cudnnStatus_t make_pack(void *x, void *w, void *y, void *ws, cudnnBackendDescriptor_t *vp) {
  void *ptr[3] = {x, w, y};
  *vp = NULL;
  cudnnStatus_t e = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, vp);
  if (e == CUDNN_STATUS_SUCCESS)
    e = cudnnBackendSetAttribute(*vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uid);
  if (e == CUDNN_STATUS_SUCCESS)
    e = cudnnBackendSetAttribute(*vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptr);
  if (e == CUDNN_STATUS_SUCCESS)
    e = cudnnBackendSetAttribute(*vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendFinalize(*vp);
  if (e != CUDNN_STATUS_SUCCESS && *vp) {
    cudnnBackendDestroyDescriptor(*vp);
    *vp = NULL;
  }
  return e;
}

cudnnStatus_t cuda_conv_graph_run(cudnnHandle_t h, cudnnBackendDescriptor_t plan, void *x, void *w, void *y,
                                  void *ws) {
  cudnnBackendDescriptor_t vp;
  cudnnStatus_t e = make_pack(x, w, y, ws, &vp);
  if (e == CUDNN_STATUS_SUCCESS) e = cudnnBackendExecute(h, plan, vp);
  if (vp) cudnnBackendDestroyDescriptor(vp);
  return e;
}

static int by_time(const void *a, const void *b) {
  float x = ((const cuda_graph_plan *)a)->ms, y = ((const cuda_graph_plan *)b)->ms;
  return (x < 0) - (y < 0) ? (x < 0) - (y < 0) : (x > y) - (x < y);
}

/* Times every plan (one warm-up call, then the mean of TIMED_RUNS between
 * two events) on zeroed buffers of their own, as cudnnFind* does on
 * buffers it allocates (counted in the device's peak while they live).
 * One variant pack serves every plan and run, so the events time the
 * executions, not the host building packs between them (cudnnFind's
 * times, sorted in with these, have no such cost). A plan that fails to
 * run is dropped; one whose workspace cannot be allocated stays untimed
 * (ms -1, after the timed ones), and all do when the operands' buffers
 * cannot be. */
#define TIMED_RUNS 5

static ct_status time_plans(ct_device *d, cudnnHandle_t h, const cuda_conv_desc *c, cuda_graph_plan *pl, int *n) {
  const size_t es = ct_dtype_size(c->rt);
  const int64_t *s[3] = {c->xs, c->wsh, c->ys};
  void *buf[3] = {NULL, NULL, NULL}, *ws = NULL;
  cudnnBackendDescriptor_t vp = NULL;
  cudaEvent_t ev[2] = {NULL, NULL};
  size_t wsmax = 0;
  ct_status st = CT_OK;
  cudaStream_t stream = cuda_stream(d);
  for (int i = 0; i < *n; i++)
    if (pl[i].wsb > wsmax) wsmax = pl[i].wsb;
  cudaError_t ce = cudaStreamSynchronize(stream);
  size_t counted = 0;
  for (int i = 0; i < 3 && ce == cudaSuccess; i++) {
    const size_t b = (size_t)(s[i][0] * s[i][1] * s[i][2] * s[i][3]) * es;
    if (cudaMalloc(&buf[i], b) != cudaSuccess) {
      /* No room to time them: the plans stay in the heuristic's order. */
      (void)cudaGetLastError();
      buf[i] = NULL;
      goto done;
    }
    counted += b; /* the device's peak counts these buffers while they live */
    ct_device_account(d, (long long)b);
    ce = cudaMemsetAsync(buf[i], 0, b, stream);
  }
  if (ce == cudaSuccess && wsmax) {
    if (cudaMalloc(&ws, wsmax) != cudaSuccess) {
      (void)cudaGetLastError(); /* too large: the plans that need it stay untimed */
      ws = NULL;
    } else {
      counted += wsmax;
      ct_device_account(d, (long long)wsmax);
    }
  }
  if (ce == cudaSuccess) ce = cudaEventCreate(&ev[0]);
  if (ce == cudaSuccess) ce = cudaEventCreate(&ev[1]);
  if (ce != cudaSuccess) {
    st = cuda_rt_fail(ce, __FILE__, __LINE__, "timing cuDNN graph plans (cudaMalloc/cudaEventCreate)");
    goto done;
  }
  /* x, w, y as the pass names them: the three buffers in that order. */
  if (make_pack(buf[0], buf[1], buf[2], ws, &vp) != CUDNN_STATUS_SUCCESS) goto done; /* left untimed */
  int k = 0;
  for (int i = 0; i < *n; i++) {
    cuda_graph_plan p = pl[i];
    p.ms = -1.f;
    if (p.wsb && !ws) {
      pl[k++] = p;
      continue;
    }
    cudnnStatus_t e = cudnnBackendExecute(h, p.plan, vp);
    if (e == CUDNN_STATUS_SUCCESS) ce = cudaEventRecord(ev[0], stream);
    for (int r = 0; r < TIMED_RUNS && e == CUDNN_STATUS_SUCCESS && ce == cudaSuccess; r++)
      e = cudnnBackendExecute(h, p.plan, vp);
    if (e == CUDNN_STATUS_SUCCESS && ce == cudaSuccess) ce = cudaEventRecord(ev[1], stream);
    if (e == CUDNN_STATUS_SUCCESS && ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
    float ms = 0.f;
    if (e == CUDNN_STATUS_SUCCESS && ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, ev[0], ev[1]);
    if (ce != cudaSuccess) {
      st = cuda_rt_fail(ce, __FILE__, __LINE__, "timing cuDNN graph plans");
      goto done;
    }
    if (e != CUDNN_STATUS_SUCCESS) {
      /* the plan stays in the graph's list and is freed with it */
      continue;
    }
    p.ms = ms / (float)TIMED_RUNS;
    pl[k++] = p;
  }
  *n = k;
  qsort(pl, (size_t)k, sizeof *pl, by_time);
done:
  if (vp) cudnnBackendDestroyDescriptor(vp);
  for (int i = 0; i < 2; i++)
    if (ev[i]) (void)cudaEventDestroy(ev[i]);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
  for (int i = 0; i < 3; i++)
    if (buf[i]) (void)cudaFree(buf[i]);
  if (ws) (void)cudaFree(ws);
  ct_device_account(d, -(long long)counted);
  if (st == CT_OK && ce != cudaSuccess) st = cuda_rt_fail(ce, __FILE__, __LINE__, "cudaStreamSynchronize after timing");
  return st;
}

/* g's tensors, convolution, operation and operation graph for c, each
 * finalized; h NULL leaves the graph's (deprecated) handle unset, which
 * cuDNN 9 accepts for a graph that is only checked. *failed names the
 * call that failed (NULL on success). */
static cudnnStatus_t make_graph(cuda_conv_graph *g, const cuda_conv_desc *c, cudnnHandle_t h, const char **failed) {
  cudnnStatus_t e = CUDNN_STATUS_SUCCESS;
  const char *what = NULL;
  const cudnnDataType_t dt = dnn_type(c->rt);
  const int64_t *dims[3] = {c->xs, c->wsh, c->ys};
  const float alpha = 1.f, beta = c->beta;
  for (int i = 0; i < 3; i++) GDNN(make_tensor(uid[i], dims[i], c->nhwc, dt, &g->t[i]));
  GDNN(make_conv(c->p, &g->conv));
  GDNN(cudnnBackendCreateDescriptor(op_type[c->kind], &g->op));
  for (int i = 0; i < 3; i++)
    GDNN(cudnnBackendSetAttribute(g->op, op_attr[c->kind][i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[i]));
  GDNN(cudnnBackendSetAttribute(g->op, op_attr[c->kind][3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->conv));
  GDNN(cudnnBackendSetAttribute(g->op, op_attr[c->kind][4], CUDNN_TYPE_FLOAT, 1, &alpha));
  GDNN(cudnnBackendSetAttribute(g->op, op_attr[c->kind][5], CUDNN_TYPE_FLOAT, 1, &beta));
  GDNN(cudnnBackendFinalize(g->op));
  GDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph));
  GDNN(cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->op));
  if (h) GDNN(cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  GDNN(cudnnBackendFinalize(g->graph));
done:
  *failed = what;
  return e;
}

cudnnStatus_t cuda_conv_graph_check(const cuda_conv_desc *c, const char **what) {
  *what = NULL;
  cuda_conv_graph *g = calloc(1, sizeof *g);
  if (!g) return CUDNN_STATUS_ALLOC_FAILED;
  cudnnStatus_t e = make_graph(g, c, NULL, what);
  cuda_conv_graph_free(g);
  return e;
}

ct_status cuda_conv_graph_build(ct_device *d, cudnnHandle_t h, const cuda_conv_desc *c, int bench,
                                cuda_graph_plan *out, int max, int *n, cuda_conv_graph **gout) {
  *n = 0;
  *gout = NULL;
  cuda_conv_graph *g = calloc(1, sizeof *g);
  if (!g) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda conv: out of host memory for a graph plan");
  cudnnStatus_t e = CUDNN_STATUS_SUCCESS;
  const char *what = NULL;
  cudnnBackendDescriptor_t heur = NULL;
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  /* A plan whose workspace exceeds half the free memory is left out: it
   * could not be timed, and in the memory plan it would crowd out the
   * activations (PyTorch's benchmark likewise skips what it cannot
   * allocate). */
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    free_b = (size_t)-1;
  }
  e = make_graph(g, c, h, &what);
  if (e != CUDNN_STATUS_SUCCESS) goto done;
  GDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
  GDNN(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                &g->graph));
  GDNN(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  GDNN(cudnnBackendFinalize(heur));
  {
    int64_t avail = 0;
    GDNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &avail, NULL));
    const int want = avail < HEUR_MAX ? (int)avail : HEUR_MAX;
    for (; g->ncfg < want; g->ncfg++)
      GDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &g->cfg[g->ncfg]));
    int64_t got = 0;
    if (want) GDNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, want,
                                            &got, g->cfg));
    if (got > want) got = want; /* the count is what there is, not what was written */
    cudnnStatus_t first_bad = CUDNN_STATUS_SUCCESS;
    for (int i = 0; i < (int)got && *n < max; i++) {
      if (left_out(g->cfg[i], c->deterministic)) continue;
      cudnnBackendDescriptor_t plan = NULL;
      GDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
      g->plan[g->nplan++] = plan;
      GDNN(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
      GDNN(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                    &g->cfg[i]));
      /* A config the heuristics listed may still not finalize here; any
       * refusal skips it, as cudnn-frontend does, but one that is not
       * NOT_SUPPORTED is reported when no config finalized. */
      cudnnStatus_t fe = cudnnBackendFinalize(plan);
      if (fe != CUDNN_STATUS_SUCCESS) {
        if (!cuda_dnn_unsupported(fe) && first_bad == CUDNN_STATUS_SUCCESS) first_bad = fe;
        continue;
      }
      int64_t wsb = 0, cnt = 0;
      GDNN(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &wsb));
      if (wsb > 0 && (uint64_t)wsb > free_b / 2) continue;
      cuda_graph_plan p = {plan, engine_index(g->cfg[i]), (size_t)(wsb > 0 ? wsb : 0), -1.f};
      out[(*n)++] = p;
    }
    if (!*n && first_bad != CUDNN_STATUS_SUCCESS) {
      e = first_bad;
      what = "cudnnBackendFinalize(execution plan)";
    }
  }
done:
  if (heur) cudnnBackendDestroyDescriptor(heur);
  if (e != CUDNN_STATUS_SUCCESS) {
    *n = 0;
    cuda_conv_graph_free(g);
    /* NOT_SUPPORTED anywhere on the way: no graph plan for this pass. */
    return cuda_dnn_unsupported(e) ? CT_OK : cuda_dnn_fail(e, __FILE__, __LINE__, what);
  }
  if (*n && bench) {
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(cuda_stream(d), &cap) != cudaSuccess) cap = cudaStreamCaptureStatusActive;
    ct_status s = cap == cudaStreamCaptureStatusNone ? time_plans(d, h, c, out, n) : CT_OK;
    if (s != CT_OK) {
      *n = 0;
      cuda_conv_graph_free(g);
      return s;
    }
  }
  if (!*n) {
    cuda_conv_graph_free(g);
    return CT_OK;
  }
  *gout = g;
  return CT_OK;
}
