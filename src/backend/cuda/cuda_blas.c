/* matmul and the linear layer on cuBLASLt. ctrain's tensors are row-major
 * and cuBLASLt is column-major, so each op is written as the transposed
 * product (a row-major [R,C] buffer is a column-major [C,R] one). Storage:
 * inputs f32, bf16 or f16 (both inputs alike), output the input dtype or
 * f32; accumulation in f32 (CUBLAS_COMPUTE_32F, or TF32 tensor cores for
 * f32 when the device was opened with CTRAIN_CUDA_TF32=1). linear_fwd uses
 * the cuBLASLt bias/ReLU epilogue when the bias has the output's dtype
 * (f32, or under autocast the 16-bit weight copy's bias with a 16-bit
 * output: then the sum is rounded once, as PyTorch's fused addmm does,
 * where the separate kernel rounds the product and then the sum); other
 * activations (GELU here is the exact erf form, cuBLASLt's is the tanh
 * approximation) and dtype pairs run a separate bias+activation kernel,
 * and so does a shape for which the heuristic finds no algorithm with the
 * epilogue. Descriptors and the heuristic's choice (or that it found none)
 * are cached per shape (blas_plan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"

/* cuBLASLt workspace: NVIDIA recommends 32 MiB on Hopper. */
#define LT_WORKSPACE ((size_t)32 << 20)

typedef struct gemm_args {
  cublasOperation_t ta, tb;
  uint64_t m, n, k;
  const void *A, *B;
  void *D;
  ct_dtype at, bt, dt;
  int64_t lda, ldb, ldd;
  float alpha, beta;
  cublasLtEpilogue_t epi;
  const void *bias;
} gemm_args;

static cudaDataType_t lt_type(ct_dtype t) {
  return t == CT_F32 ? CUDA_R_32F : t == CT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

static uint32_t align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && (a & (al - 1))) al >>= 1;
  return al;
}

/* Checks the dtype combination cuBLASLt is asked for: a and b alike and
 * floating, c the same or f32. */
static ct_status check_types(const char *op, ct_dtype a, ct_dtype b, ct_dtype c) {
  if (!cuda_float_dtype(a) || a != b || (c != a && c != CT_F32))
    return ct_error(CT_ERR_UNSUPPORTED,
                    "cuda %s: dtypes %s x %s -> %s; cuBLASLt takes two f32, bf16 or f16 inputs of one dtype and "
                    "writes that dtype or f32",
                    op, ct_dtype_name(a) ? ct_dtype_name(a) : "?", ct_dtype_name(b) ? ct_dtype_name(b) : "?",
                    ct_dtype_name(c) ? ct_dtype_name(c) : "?");
  return CT_OK;
}

#define LT(call)                                                          \
  do {                                                                    \
    cublasStatus_t lt_e_ = (call);                                        \
    if (lt_e_ != CUBLAS_STATUS_SUCCESS) {                                 \
      s = cuda_lt_fail(lt_e_, __FILE__, __LINE__, #call);                 \
      goto done;                                                          \
    }                                                                     \
  } while (0)

/* A cuBLASLt plan: descriptors, layouts and the heuristic's algorithm for
 * one (transposes, shapes, leading dimensions, dtypes, epilogue, bias or
 * not, compute type, operand alignments) key, built on the first call and
 * reused on every later one (the cuDNN plan cache's rule, cuda_conv.c).
 * Only the bias pointer changes per call; it is set on the cached
 * descriptor right before the matmul, and a device's ops run on one
 * thread at a time (its stream's order), so that is not racy. */
#define BLAS_KEY 17
typedef struct blas_plan {
  int64_t key[BLAS_KEY];
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulHeuristicResult_t res;
  int none; /* the heuristic found no algorithm: every call is CT_ERR_UNSUPPORTED */
} blas_plan;

struct cuda_blas_cache {
  blas_plan *p;
  int n, cap;
};

static void plan_destroy(blas_plan *p) {
  if (p->ld) cuda_lt.MatrixLayoutDestroy(p->ld);
  if (p->lb) cuda_lt.MatrixLayoutDestroy(p->lb);
  if (p->la) cuda_lt.MatrixLayoutDestroy(p->la);
  if (p->desc) cuda_lt.MatmulDescDestroy(p->desc);
}

void cuda_blas_cache_free(ct_device *d) {
  cuda_dev *cd = cuda_dev_of(d);
  struct cuda_blas_cache *c = cd->blas_cache;
  if (!c) return;
  for (int i = 0; i < c->n; i++) plan_destroy(&c->p[i]);
  free(c->p);
  free(c);
  cd->blas_cache = NULL;
}

static void make_key(int64_t *k, const gemm_args *g, int tf32) {
  int64_t v[BLAS_KEY] = {g->ta, g->tb, (int64_t)g->m, (int64_t)g->n, (int64_t)g->k, g->at, g->bt, g->dt, g->lda,
                         g->ldb, g->ldd, g->epi, g->bias != NULL, tf32, align_of(g->A), align_of(g->B),
                         align_of(g->D)};
  memcpy(k, v, sizeof v);
}

/* Builds p for g: descriptors, layouts, preference and the heuristic. */
static ct_status plan_build(ct_device *d, const gemm_args *g, blas_plan *p) {
  cuda_dev *cd = cuda_dev_of(d);
  ct_status s = CT_OK;
  cublasLtMatmulPreference_t pref = NULL;
  cublasComputeType_t ct = (g->at == CT_F32 && cd->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT(cuda_lt.MatmulDescCreate(&p->desc, ct, CUDA_R_32F));
  LT(cuda_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta));
  LT(cuda_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb));
  if (g->epi != CUBLASLT_EPILOGUE_DEFAULT) {
    LT(cuda_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epi, sizeof g->epi));
    if (g->bias) LT(cuda_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  }
  /* Layouts describe the stored matrices, before op(). */
  int na = g->ta == CUBLAS_OP_N, nb = g->tb == CUBLAS_OP_N;
  LT(cuda_lt.MatrixLayoutCreate(&p->la, lt_type(g->at), na ? g->m : g->k, na ? g->k : g->m, g->lda));
  LT(cuda_lt.MatrixLayoutCreate(&p->lb, lt_type(g->bt), nb ? g->k : g->n, nb ? g->n : g->k, g->ldb));
  LT(cuda_lt.MatrixLayoutCreate(&p->ld, lt_type(g->dt), g->m, g->n, g->ldd));
  LT(cuda_lt.MatmulPreferenceCreate(&pref));
  uint64_t wsmax = LT_WORKSPACE;
  LT(cuda_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax, sizeof wsmax));
  /* Views into arenas may be less aligned than cudaMalloc's 256 bytes;
   * telling the heuristic keeps it from picking a kernel that needs more.
   * The alignments are part of the key, so a plan never meets a pointer
   * less aligned than the one it was chosen for. */
  uint32_t al_a = align_of(g->A), al_b = align_of(g->B), al_d = align_of(g->D);
  LT(cuda_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
  LT(cuda_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
  LT(cuda_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
  LT(cuda_lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
  int nres = 0;
  /* "No algorithm" comes back as NOT_SUPPORTED or as a count of 0. */
  cublasStatus_t he = cuda_lt.MatmulAlgoGetHeuristic(cd->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &p->res, &nres);
  if (he != CUBLAS_STATUS_SUCCESS && he != CUBLAS_STATUS_NOT_SUPPORTED) {
    s = cuda_lt_fail(he, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic");
    goto done;
  }
  p->none = he != CUBLAS_STATUS_SUCCESS || nres < 1;
done:
  if (pref) cuda_lt.MatmulPreferenceDestroy(pref);
  if (s != CT_OK) plan_destroy(p);
  return s;
}

/* The cached plan for g, built on a miss. */
static ct_status plan_get(ct_device *d, const gemm_args *g, const char *op, blas_plan **out) {
  cuda_dev *cd = cuda_dev_of(d);
  int64_t key[BLAS_KEY];
  make_key(key, g, cd->tf32);
  struct cuda_blas_cache *c = cd->blas_cache;
  for (int i = 0; c && i < c->n; i++)
    if (!memcmp(c->p[i].key, key, sizeof key)) {
      *out = &c->p[i];
      return CT_OK;
    }
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda %s: out of host memory for the cuBLASLt plan cache", op);
    cd->blas_cache = c;
  }
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 32;
    blas_plan *np = realloc(c->p, sizeof *np * (size_t)cap);
    if (!np) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda %s: out of host memory for the cuBLASLt plan cache", op);
    c->p = np;
    c->cap = cap;
  }
  blas_plan *p = &c->p[c->n];
  memset(p, 0, sizeof *p);
  memcpy(p->key, key, sizeof key);
  CT_TRY(plan_build(d, g, p));
  c->n++;
  *out = p;
  return CT_OK;
}

static ct_status gemm(ct_device *d, const gemm_args *g, const char *op) {
  cuda_dev *cd = cuda_dev_of(d);
  ct_status s = CT_OK;
  if (!g->m || !g->n) return CT_OK;
  CT_TRY(cuda_enter(d));
  blas_plan *p;
  CT_TRY(plan_get(d, g, op, &p));
  if (p->none)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: cuBLASLt has no algorithm for m=%llu n=%llu k=%llu (%s x %s -> %s%s)",
                    op, (unsigned long long)g->m, (unsigned long long)g->n, (unsigned long long)g->k,
                    ct_dtype_name(g->at), ct_dtype_name(g->bt), ct_dtype_name(g->dt),
                    g->epi != CUBLASLT_EPILOGUE_DEFAULT ? ", with an epilogue" : "");
  if (g->bias) LT(cuda_lt.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  void *ws = NULL;
  if (p->res.workspaceSize > 0) CT_TRY(cuda_scratch(d, p->res.workspaceSize, &ws));
  LT(cuda_lt.Matmul(cd->lt, p->desc, &g->alpha, g->A, p->la, g->B, p->lb, &g->beta, g->D, p->ld, g->D, p->ld,
                    &p->res.algo, ws, p->res.workspaceSize, cd->stream));
done:
  return s;
}

static gemm_args args0(void) {
  gemm_args g = {0};
  g.ta = g.tb = CUBLAS_OP_N;
  g.alpha = 1.f;
  g.epi = CUBLASLT_EPILOGUE_DEFAULT;
  return g;
}

ct_status cuda_matmul(ct_device *d, int trans_a, int trans_b, const ct_tensor *a, const ct_tensor *b, float alpha,
                      float beta, ct_tensor *c) {
  CT_TRY(check_types("matmul", a->dtype, b->dtype, c->dtype));
  if (a->ndim != 2 || b->ndim != 2 || c->ndim != 2) return ct_error(CT_ERR_SHAPE, "cuda matmul: expected 2-D tensors");
  const int64_t M = c->shape[0], N = c->shape[1], K = trans_a ? a->shape[0] : a->shape[1];
  /* Row-major C[M,N] is column-major C^T[N,M] = op(b)^T op(a)^T. */
  gemm_args g = args0();
  g.ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.m = (uint64_t)N;
  g.n = (uint64_t)M;
  g.k = (uint64_t)K;
  g.A = b->data;
  g.at = b->dtype;
  g.lda = trans_b ? K : N;
  g.B = a->data;
  g.bt = a->dtype;
  g.ldb = trans_a ? M : K;
  g.D = c->data;
  g.dt = c->dtype;
  g.ldd = N;
  g.alpha = alpha;
  g.beta = beta;
  if (K == 0) {
    /* An empty sum: cuBLASLt rejects k = 0, the contract says c = beta*c. */
    ct_tensor cc = *c;
    return beta == 0 ? cuda_fill(d, &cc, 0.f) : cuda_axpby(d, 0.f, &cc, beta, &cc);
  }
  return gemm(d, &g, "matmul");
}

ct_status cuda_linear_fwd(ct_device *d, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_act act,
                          ct_tensor *y) {
  CT_TRY(check_types("linear_fwd", x->dtype, w->dtype, y->dtype));
  CT_TRY(cuda_check_float("linear_fwd", b, 3));
  if ((int)act < 0 || act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "cuda linear_fwd: unknown activation %d", (int)act);
  const int64_t M = w->shape[0], K = w->shape[1], N = K ? ct_tensor_numel(x) / K : 0;
  if (K == 0) return ct_error(CT_ERR_SHAPE, "cuda linear_fwd: weight has 0 input features");
  /* Row-major Y[N,M] is column-major Y^T[M,N] = W X^T, W stored as
   * column-major [K,M] (transposed by op), X^T as column-major [K,N]. */
  gemm_args g = args0();
  g.ta = CUBLAS_OP_T;
  g.m = (uint64_t)M;
  g.n = (uint64_t)N;
  g.k = (uint64_t)K;
  g.A = w->data;
  g.at = w->dtype;
  g.lda = K;
  g.B = x->data;
  g.bt = x->dtype;
  g.ldb = K;
  g.D = y->data;
  g.dt = y->dtype;
  g.ldd = M;
  /* The epilogue adds bias along D's rows (= output features). */
  /* The epilogue wants a 16-byte aligned bias; a view into a flat
   * parameter buffer may not be, and then the separate kernel runs. */
  int fuse = (!b || (b->dtype == y->dtype && ((uintptr_t)b->data & 15) == 0)) &&
             (act == CT_ACT_NONE || act == CT_ACT_RELU);
  if (fuse) {
    g.epi = b ? (act == CT_ACT_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
              : (act == CT_ACT_RELU ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    g.bias = b ? b->data : NULL;
  }
  ct_status s = gemm(d, &g, "linear_fwd");
  if (s == CT_ERR_UNSUPPORTED && fuse) {
    /* No algorithm with this epilogue: the plain product, then the kernel. */
    g.epi = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    fuse = 0;
    s = gemm(d, &g, "linear_fwd");
  }
  CT_TRY(s);
  if (fuse) return CT_OK;
  return cuda_bias_act(d, y->data, y->dtype, N * M, b ? b->data : NULL, b ? b->dtype : CT_F32, M, 1, act);
}

ct_status cuda_linear_bwd_data(ct_device *d, const ct_tensor *dy, const ct_tensor *w, ct_tensor *dx) {
  CT_TRY(check_types("linear_bwd_data", dy->dtype, w->dtype, dx->dtype));
  const int64_t M = w->shape[0], K = w->shape[1], N = M ? ct_tensor_numel(dy) / M : 0;
  if (M == 0) {
    ct_tensor t = *dx;
    return cuda_fill(d, &t, 0.f);
  }
  /* dx^T[K,N] = W^T[K,M] dy^T[M,N]: both stored that way already. */
  gemm_args g = args0();
  g.m = (uint64_t)K;
  g.n = (uint64_t)N;
  g.k = (uint64_t)M;
  g.A = w->data;
  g.at = w->dtype;
  g.lda = K;
  g.B = dy->data;
  g.bt = dy->dtype;
  g.ldb = M;
  g.D = dx->data;
  g.dt = dx->dtype;
  g.ldd = K;
  return gemm(d, &g, "linear_bwd_data");
}

ct_status cuda_linear_bwd_weights(ct_device *d, const ct_tensor *x, const ct_tensor *dy, ct_tensor *dw, ct_tensor *db,
                                  float beta) {
  CT_TRY(check_types("linear_bwd_weights", x->dtype, dy->dtype, dw->dtype));
  CT_TRY(cuda_check_float("linear_bwd_weights", db, 4));
  const int64_t M = dw->shape[0], K = dw->shape[1], N = M ? ct_tensor_numel(dy) / M : 0;
  if (N > 0) {
    /* dw^T[K,M] = X^T[K,N] dy[N,M]; dy is stored column-major [M,N], so
     * op = T. */
    gemm_args g = args0();
    g.tb = CUBLAS_OP_T;
    g.m = (uint64_t)K;
    g.n = (uint64_t)M;
    g.k = (uint64_t)N;
    g.A = x->data;
    g.at = x->dtype;
    g.lda = K;
    g.B = dy->data;
    g.bt = dy->dtype;
    g.ldb = M;
    g.D = dw->data;
    g.dt = dw->dtype;
    g.ldd = K;
    g.beta = beta;
    CT_TRY(gemm(d, &g, "linear_bwd_weights"));
  } else {
    ct_tensor t = *dw;
    CT_TRY(beta == 0 ? cuda_fill(d, &t, 0.f) : CT_OK);
  }
  if (!db) return CT_OK;
  CT_TRY(cuda_enter(d));
  return cuda_channel_sum(d, dy->data, dy->dtype, N, M, 1, db->data, db->dtype, beta);
}
