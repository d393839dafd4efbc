/* Self-test of the emulated cuDNN graph API (emu_cudnn_graph.cpp). The
 * legacy API's convolutions are checked against independent references in
 * emu_selftest_dnn.cpp; here each pass built through backend descriptors
 * must give the legacy call's bits on the same operands (NCHW f32 with an
 * engine without tensor cores, NHWC bf16 with beta 1), and the emulated
 * behaviour the header documents must hold: the heuristic's engine order
 * and count, a config that does not finalize, a runtime-compiled engine and
 * a down-converting one (on bf16) that do not run, finalized descriptors
 * read only, misaligned pointers and a missing workspace refused. Last, cudaEventElapsedTime's job count.
 *
 * Exit status 0 when every check passes. */
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_selftest.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {


typedef cudnnBackendDescriptor_t bd;

bd tensor(int64_t id, const int64_t *dims, bool nhwc, cudnnDataType_t dt) {
  int64_t st[4], al = 16;
  if (nhwc) st[1] = 1, st[3] = dims[1], st[2] = dims[3] * dims[1], st[0] = dims[2] * dims[3] * dims[1];
  else st[3] = 1, st[2] = dims[3], st[1] = dims[2] * dims[3], st[0] = dims[1] * dims[2] * dims[3];
  bd t;
  DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
  DNN_OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
  DNN_OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  DNN_OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, st));
  DNN_OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id));
  DNN_OK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &al));
  DNN_OK(cudnnBackendFinalize(t));
  return t;
}

struct pass_case {
  const char *name;
  int pass; /* 0 fwd, 1 bwd data, 2 bwd filter */
  bool nhwc;
  cudnnDataType_t dt;
  float beta;
};

const cudnnBackendDescriptorType_t op_type[3] = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                                 CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                                                 CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
const cudnnBackendAttributeName_t attrs[3][6] = {
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

/* x [2,6,7,5], w [4,6,3,3], pad 1, stride 2x1 -> y [2,4,4,5] */
const int64_t XS[4] = {2, 6, 7, 5}, WS[4] = {4, 6, 3, 3}, YS[4] = {2, 4, 4, 5};
const int64_t PAD[2] = {1, 1}, STR[2] = {2, 1}, DIL[2] = {1, 1};

/* The operation graph of one pass; *t gets its three tensors. */
bd graph_of(cudnnHandle_t h, const pass_case &k, bd *t) {
  const int64_t *dims[3] = {XS, WS, YS};
  for (int i = 0; i < 3; i++) t[i] = tensor("xwy"[i], dims[i], k.nhwc, k.dt);
  bd cv, op, g;
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t sd = 2;
  const float alpha = 1.f;
  DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &cv));
  DNN_OK(cudnnBackendSetAttribute(cv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
  DNN_OK(cudnnBackendSetAttribute(cv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  DNN_OK(cudnnBackendSetAttribute(cv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sd));
  DNN_OK(cudnnBackendSetAttribute(cv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, DIL));
  DNN_OK(cudnnBackendSetAttribute(cv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, STR));
  DNN_OK(cudnnBackendSetAttribute(cv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, PAD));
  DNN_OK(cudnnBackendSetAttribute(cv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, PAD));
  DNN_OK(cudnnBackendFinalize(cv));
  DNN_OK(cudnnBackendCreateDescriptor(op_type[k.pass], &op));
  for (int i = 0; i < 3; i++) DNN_OK(cudnnBackendSetAttribute(op, attrs[k.pass][i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t[i]));
  DNN_OK(cudnnBackendSetAttribute(op, attrs[k.pass][3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cv));
  DNN_OK(cudnnBackendSetAttribute(op, attrs[k.pass][4], CUDNN_TYPE_FLOAT, 1, &alpha));
  DNN_OK(cudnnBackendSetAttribute(op, attrs[k.pass][5], CUDNN_TYPE_FLOAT, 1, &k.beta));
  DNN_OK(cudnnBackendFinalize(op));
  DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g));
  DNN_OK(cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
  DNN_OK(cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  DNN_OK(cudnnBackendFinalize(g));
  /* the graph holds copies: the sources may go */
  cudnnBackendDestroyDescriptor(cv);
  cudnnBackendDestroyDescriptor(op);
  return g;
}

/* The heuristic's engine configs for g (mode), their global indices in *idx. */
std::vector<bd> configs(bd g, cudnnBackendHeurMode_t mode, std::vector<int64_t> *idx) {
  bd heur;
  DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
  DNN_OK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g));
  DNN_OK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  DNN_OK(cudnnBackendFinalize(heur));
  int64_t n = 0;
  DNN_OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr));
  std::vector<bd> cfg((size_t)n);
  for (bd &c : cfg) DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c));
  int64_t got = 0;
  if (n) DNN_OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg.data()));
  EXPECT(got == n, "heuristics gave %lld of %lld configs", (long long)got, (long long)n);
  idx->clear();
  for (bd c : cfg) {
    bd e;
    int64_t cnt = 0, i = -1;
    DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e));
    DNN_OK(cudnnBackendGetAttribute(c, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &e));
    DNN_OK(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &i));
    idx->push_back(i);
    cudnnBackendDestroyDescriptor(e);
  }
  cudnnBackendDestroyDescriptor(heur);
  return cfg;
}

cudnnStatus_t make_plan(cudnnHandle_t h, bd cfg, bd *plan) {
  DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan));
  DNN_OK(cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
  DNN_OK(cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg));
  return cudnnBackendFinalize(*plan);
}

cudnnStatus_t execute(cudnnHandle_t h, bd plan, void *x, void *w, void *y, void *ws) {
  const int64_t uid[3] = {'x', 'w', 'y'};
  void *ptr[3] = {x, w, y};
  bd vp;
  DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
  DNN_OK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uid));
  DNN_OK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptr));
  DNN_OK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws));
  DNN_OK(cudnnBackendFinalize(vp));
  cudnnStatus_t s = cudnnBackendExecute(h, plan, vp);
  cudnnBackendDestroyDescriptor(vp);
  return s;
}

uint64_t rng = 0x9E3779B97F4A7C15ull;

/* n random values of dt as bytes. */
std::vector<uint8_t> random_bytes(size_t n, cudnnDataType_t dt) {
  std::vector<uint8_t> b(n * (dt == CUDNN_DATA_FLOAT ? 4 : 2));
  for (size_t i = 0; i < n; i++) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const float f = (float)((double)(rng >> 11) / (double)(1ull << 52) - 1.0);
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dt == CUDNN_DATA_FLOAT) memcpy(&b[4 * i], &f, 4);
    else {
      const uint16_t v = (uint16_t)(u >> 16); /* bf16 by truncation; as f16 bits, some finite value */
      memcpy(&b[2 * i], &v, 2);
    }
  }
  return b;
}

void *upload(const std::vector<uint8_t> &b) {
  void *p = nullptr;
  cudaMalloc(&p, b.size());
  cudaMemcpy(p, b.data(), b.size(), cudaMemcpyHostToDevice);
  return p;
}

std::vector<uint8_t> download(const void *p, size_t n) {
  std::vector<uint8_t> b(n);
  cudaDeviceSynchronize();
  cudaMemcpy(b.data(), p, n, cudaMemcpyDeviceToHost);
  return b;
}

/* The pass through the graph API (engine `engine`) and the legacy API on
 * the same operands: the same bits. */
void same_as_legacy(cudnnHandle_t h, const pass_case &k, int64_t engine) {
  bd t[3];
  bd g = graph_of(h, k, t);
  std::vector<int64_t> idx;
  std::vector<bd> cfg = configs(g, CUDNN_HEUR_MODE_A, &idx);
  size_t ci = 0;
  while (ci < idx.size() && idx[ci] != engine) ci++;
  EXPECT(ci < idx.size(), "%s: engine %lld not listed", k.name, (long long)engine);
  if (ci == idx.size()) return;
  bd plan;
  DNN_OK(make_plan(h, cfg[ci], &plan));
  int64_t wsb = -1, cnt = 0;
  DNN_OK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &wsb));
  const size_t nx = 2 * 6 * 7 * 5, nw = 4 * 6 * 3 * 3, ny = 2 * 4 * 4 * 5;
  const std::vector<uint8_t> hx = random_bytes(nx, k.dt), hw = random_bytes(nw, k.dt), hy = random_bytes(ny, k.dt);
  void *gx = upload(hx), *gw = upload(hw), *gy = upload(hy), *lx = upload(hx), *lw = upload(hw), *ly = upload(hy);
  void *ws = nullptr;
  cudaMalloc(&ws, 1 << 20);
  DNN_OK(execute(h, plan, gx, gw, gy, wsb ? ws : nullptr));

  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cv;
  const cudnnTensorFormat_t f = k.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  cudnnCreateTensorDescriptor(&xd), cudnnCreateTensorDescriptor(&yd), cudnnCreateFilterDescriptor(&wd);
  cudnnCreateConvolutionDescriptor(&cv);
  DNN_OK(cudnnSetTensor4dDescriptor(xd, f, k.dt, 2, 6, 7, 5));
  DNN_OK(cudnnSetTensor4dDescriptor(yd, f, k.dt, 2, 4, 4, 5));
  DNN_OK(cudnnSetFilter4dDescriptor(wd, k.dt, f, 4, 6, 3, 3));
  DNN_OK(cudnnSetConvolution2dDescriptor(cv, 1, 1, 2, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  /* engine 1 has no tensor cores: FMA math for FLOAT, as the legacy call */
  DNN_OK(cudnnSetConvolutionMathType(cv, engine == 1 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  const float one = 1.f;
  if (k.pass == 0)
    DNN_OK(cudnnConvolutionForward(h, &one, xd, lx, wd, lw, cv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0,
                               &k.beta, yd, ly));
  else if (k.pass == 1)
    DNN_OK(cudnnConvolutionBackwardData(h, &one, wd, lw, yd, ly, cv, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, &k.beta,
                                    xd, lx));
  else
    DNN_OK(cudnnConvolutionBackwardFilter(h, &one, xd, lx, yd, ly, cv, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr, 0,
                                      &k.beta, wd, lw));
  void *go = k.pass == 0 ? gy : k.pass == 1 ? gx : gw, *lo = k.pass == 0 ? ly : k.pass == 1 ? lx : lw;
  const size_t bytes = (k.pass == 0 ? ny : k.pass == 1 ? nx : nw) * (k.dt == CUDNN_DATA_FLOAT ? 4 : 2);
  const std::vector<uint8_t> a = download(go, bytes), b = download(lo, bytes);
  const std::vector<uint8_t> before = k.pass == 0 ? hy : k.pass == 1 ? hx : hw;
  EXPECT(a == b, "%s: the graph API's output differs from the legacy API's", k.name);
  EXPECT(a != before, "%s: the output was not written", k.name);
  for (void *p : {gx, gw, gy, lx, lw, ly, ws}) cudaFree(p);
  cudnnDestroyTensorDescriptor(xd), cudnnDestroyTensorDescriptor(yd), cudnnDestroyFilterDescriptor(wd);
  cudnnDestroyConvolutionDescriptor(cv);
  cudnnBackendDestroyDescriptor(plan);
  for (bd c : cfg) cudnnBackendDestroyDescriptor(c);
  for (bd x : t) cudnnBackendDestroyDescriptor(x);
  cudnnBackendDestroyDescriptor(g);
}

/* The documented engine behaviour and refusals. */
void behaviour(cudnnHandle_t h) {
  const pass_case k = {"fwd bf16 nhwc", 0, true, CUDNN_DATA_BFLOAT16, 0.f};
  bd t[3];
  bd g = graph_of(h, k, t);
  std::vector<int64_t> idx;
  std::vector<bd> cfg = configs(g, CUDNN_HEUR_MODE_A, &idx);
  EXPECT(idx == std::vector<int64_t>({0, 3, 7, 5, 1}), "heuristic order");
  {
    /* the count is how many there are; only the number asked for is written */
    bd heur, two[3] = {nullptr, nullptr, nullptr};
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    DNN_OK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g));
    DNN_OK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    DNN_OK(cudnnBackendFinalize(heur));
    for (int i = 0; i < 2; i++) DNN_OK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &two[i]));
    int64_t cnt = 0;
    DNN_OK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 2, &cnt, two));
    EXPECT(cnt == 5 && two[2] == nullptr, "asked for 2 of 5 configs: count %lld", (long long)cnt);
    for (int i = 0; i < 2; i++) cudnnBackendDestroyDescriptor(two[i]);
    cudnnBackendDestroyDescriptor(heur);
  }
  std::vector<int64_t> fb;
  std::vector<bd> cfb = configs(g, CUDNN_HEUR_MODE_FALLBACK, &fb);
  EXPECT(fb == std::vector<int64_t>({1}), "fallback list");
  const int64_t al = 16;
  EXPECT(cudnnBackendSetAttribute(t[0], CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &al) ==
             CUDNN_STATUS_BAD_PARAM,
         "a finalized tensor took an attribute");
  bd plans[5];
  cudnnStatus_t fin[5];
  for (int i = 0; i < 5; i++) fin[i] = make_plan(h, cfg[(size_t)i], &plans[i]);
  EXPECT(fin[0] == CUDNN_STATUS_SUCCESS && fin[1] == CUDNN_STATUS_SUCCESS && fin[2] == CUDNN_STATUS_SUCCESS &&
             fin[4] == CUDNN_STATUS_SUCCESS,
         "plans of engines 0, 3, 7, 1 finalize");
  EXPECT(fin[3] == CUDNN_STATUS_NOT_SUPPORTED, "engine 5's plan finalized (%d)", (int)fin[3]);
  void *x, *w, *y, *ws;
  cudaMalloc(&x, 4096), cudaMalloc(&w, 4096), cudaMalloc(&y, 4096), cudaMalloc(&ws, 1 << 16);
  EXPECT(execute(h, plans[1], x, w, y, ws) == CUDNN_STATUS_EXECUTION_FAILED, "the runtime-compiled engine ran");
  EXPECT(execute(h, plans[2], x, w, y, ws) == CUDNN_STATUS_EXECUTION_FAILED, "the down-converting engine ran on bf16");
  EXPECT(execute(h, plans[0], x, w, y, nullptr) == CUDNN_STATUS_BAD_PARAM, "engine 0 ran without its workspace");
  EXPECT(execute(h, plans[4], (char *)x + 2, w, y, nullptr) == CUDNN_STATUS_BAD_PARAM, "a misaligned x was taken");
  EXPECT(execute(h, plans[4], x, w, y, nullptr) == CUDNN_STATUS_SUCCESS, "engine 1 runs without a workspace");

  /* cudaEventElapsedTime: 1 us per job; engine 0 queues two, engine 1 one */
  cudaStream_t st = nullptr;
  cudnnGetStream(h, &st);
  cudaEvent_t e0, e1, nt;
  cudaEventCreate(&e0), cudaEventCreate(&e1), cudaEventCreateWithFlags(&nt, cudaEventDisableTiming);
  cudaEventRecord(e0, st);
  DNN_OK(execute(h, plans[0], x, w, y, ws));
  DNN_OK(execute(h, plans[4], x, w, y, nullptr));
  cudaEventRecord(e1, st);
  float ms = -1.f;
  EXPECT(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0.0029f && ms < 0.0031f, "elapsed %g ms", ms);
  cudaEventRecord(nt, st);
  EXPECT(cudaEventElapsedTime(&ms, e0, nt) != cudaSuccess, "a DisableTiming event was timed");
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(nt);
  for (void *p : {x, w, y, ws}) cudaFree(p);
  for (int i = 0; i < 5; i++) cudnnBackendDestroyDescriptor(plans[i]);
  for (bd c : cfg) cudnnBackendDestroyDescriptor(c);
  for (bd c : cfb) cudnnBackendDestroyDescriptor(c);
  for (bd x2 : t) cudnnBackendDestroyDescriptor(x2);
  cudnnBackendDestroyDescriptor(g);
}

}  // namespace

int main() {
  cudnnHandle_t h;
  cudaStream_t s;
  cudaStreamCreate(&s);
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS || cudnnSetStream(h, s) != CUDNN_STATUS_SUCCESS) return 1;
  const pass_case cases[] = {
      {"fwd f32 nchw", 0, false, CUDNN_DATA_FLOAT, 0.f},
      {"bwd data f32 nchw", 1, false, CUDNN_DATA_FLOAT, 0.f},
      {"bwd filter f32 nchw", 2, false, CUDNN_DATA_FLOAT, 0.f},
      {"fwd bf16 nhwc beta 1", 0, true, CUDNN_DATA_BFLOAT16, 1.f},
      {"bwd data bf16 nhwc beta 1", 1, true, CUDNN_DATA_BFLOAT16, 1.f},
      {"bwd filter bf16 nhwc beta 1", 2, true, CUDNN_DATA_BFLOAT16, 1.f},
  };
  for (const pass_case &k : cases) same_as_legacy(h, k, k.dt == CUDNN_DATA_FLOAT ? 1 : 0);
  behaviour(h);
  cudnnDestroy(h);
  cudaStreamDestroy(s);
  return emu_selftest_summary("emu_selftest_dnn_graph");
}
