/* Channels-last (CT_LAYOUT_NHWC) activations on CUDA (src/plan/layout.h,
 * cuda_conv.c, cuda_pool.cu): conv2d forward, backward-data (overwriting
 * and accumulating) and backward-weights (every plain/NHWC mix of input
 * and output, bias, fused ReLU, accumulating weight gradient; 1x1
 * filters and single-channel inputs, which run untransposed), max/average
 * pooling forward and backward with NHWC tensors and global adaptive
 * pooling from NHWC to a plain 1x1 output, against the ref device on
 * plain tensors; the cast of a plain f32 batch into NHWC 16-bit (the
 * model input of a channels-last first convolution); and
 * one SGD training step of cnn, alexnet and resnet18 (fp32, and bf16,
 * whose NHWC batch norms take their ReLU fused) with the layout
 * choice on vs off (the weight updates compared normwise: fp32 at 1e-3,
 * bf16 and fp16 at 5e-2: cuDNN may pick other algorithms for NHWC, so not
 * bitwise). The convolutions run under both the heuristic and the
 * cudnnFind* (cudnn_benchmark) algorithm choice; the emulator's
 * CT_EMU_DNN_NO_NHWC run (emu_test_gpu_layout_no_nhwc) takes every NHWC
 * algorithm away, so the same checks then cover the NCHW fallback. The
 * backend's describe op then lists those plans (and, under
 * CT_EMU_DNN_FIRST_FAILS, the algorithms it gave up on). Last, an f32
 * TF32 step of a model with odd parameter sizes leaves no candidate for
 * a misaligned operand.
 * Labelled gpu; exits 77 without a CUDA device. */
#include "op_util.h"
#include "test_util.h"

#include "backend/backend.h"
#include "exec/device_state.h"
#include "exec/exec_impl.h"
#include "plan/layout.h"
#include "nn/model_impl.h"
#include "optim/optimizer_device.h"
#include "train/device_step.h"

static uint64_t rs = 424242;
static float frand(void) { return test_frand(&rs); }

/* max |a - b| / max(1e-30, max |b|) */
static double nerr(const float *a, const float *b, size_t n) {
  double m = 0, s = 1e-30;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= m)) m = d;
    if (fabs((double)b[i]) > s) s = fabs((double)b[i]);
  }
  return m / s;
}

typedef struct buf {
  ct_tensor h, g; /* host plain, device in its layout */
  float *hv, *tmp;
} buf;

static buf mk(ct_device *gpu, int64_t a, int64_t b, int64_t c, int64_t d, int nhwc, int rnd) {
  buf t;
  int64_t n = a * b * c * d;
  t.hv = calloc((size_t)n, 4), t.tmp = calloc((size_t)n, 4);
  for (int64_t i = 0; rnd && i < n; i++) t.hv[i] = frand();
  t.h = ct_tensor_4d(t.hv, CT_F32, a, b, c, d);
  t.g = t.h;
  t.g.device = gpu;
  t.g.layout = nhwc ? CT_LAYOUT_NHWC : CT_LAYOUT_PLAIN;
  t.g.data = ct_device_alloc(gpu, (size_t)n * 4);
  CHECK(t.g.data != NULL);
  if (nhwc) to_nhwc(t.hv, t.tmp, a, b, c * d);
  else memcpy(t.tmp, t.hv, (size_t)n * 4);
  CHECK_OK(ct_device_copy(gpu, t.g.data, NULL, t.tmp, (size_t)n * 4));
  return t;
}

/* The device result, back in plain order. */
static float *down(ct_device *gpu, buf *t) {
  int64_t n = ct_tensor_numel(&t->h);
  float *out = malloc((size_t)n * 4);
  CHECK_OK(ct_device_sync(gpu));
  CHECK_OK(ct_device_copy(NULL, t->tmp, gpu, t->g.data, (size_t)n * 4));
  if (t->g.layout == CT_LAYOUT_NHWC) from_nhwc(t->tmp, out, t->h.shape[0], t->h.shape[1], t->h.shape[2] * t->h.shape[3]);
  else memcpy(out, t->tmp, (size_t)n * 4);
  return out;
}

static void rm(ct_device *gpu, buf *t) {
  ct_device_free(gpu, t->g.data);
  free(t->hv), free(t->tmp);
}

/* C input channels, a KxK filter (padding K/2, stride 2 by 1). C = 1 and
 * K = 1 give operands that read the same in both layouts, which the pass
 * uses untransposed. */
static void conv_case(ct_device *gpu, ct_device *ref, int xn, int yn, int groups, int64_t C, int K) {
  const ct_backend *G = ct_device_backend(gpu), *R = ct_device_backend(ref);
  ct_conv2d_params p = {2, 1, K / 2, K / 2, 1, 1, groups};
  int64_t N = 3, H = 11, W = 9, O = 12;
  int64_t OH = (H + 2 * (K / 2) - K) / 2 + 1, OW = (W + 2 * (K / 2) - K) / 1 + 1;
  buf x = mk(gpu, N, C, H, W, xn, 1), w = mk(gpu, O, C / groups, K, K, 0, 1), b = mk(gpu, 1, 1, 1, O, 0, 1);
  buf y = mk(gpu, N, O, OH, OW, yn, 0), dy = mk(gpu, N, O, OH, OW, yn, 1), dx = mk(gpu, N, C, H, W, xn, 0);
  buf dw = mk(gpu, O, C / groups, K, K, 0, 1), db = mk(gpu, 1, 1, 1, O, 0, 1);
  ct_tensor b1 = b.h, b1g = b.g, db1 = db.h, db1g = db.g;
  b1.ndim = b1g.ndim = db1.ndim = db1g.ndim = 1, b1.shape[0] = b1g.shape[0] = db1.shape[0] = db1g.shape[0] = O;
  CHECK_OK(G->conv2d_fwd(gpu, &p, &x.g, &w.g, &b1g, CT_ACT_RELU, &y.g));
  CHECK_OK(R->conv2d_fwd(ref, &p, &x.h, &w.h, &b1, CT_ACT_RELU, &y.h));
  float *r = down(gpu, &y);
  CHECK_MSG(nerr(r, y.hv, (size_t)ct_tensor_numel(&y.h)) <= 1e-5, "conv fwd x %s y %s groups %d: err %g",
            xn ? "NHWC" : "NCHW", yn ? "NHWC" : "NCHW", groups, nerr(r, y.hv, (size_t)ct_tensor_numel(&y.h)));
  free(r);
  /* Backward-data overwriting, then accumulating (dx, now the gradient,
   * gets it once more): a dx staged in the pass's layout must be added on
   * the way back. */
  for (int acc = 0; acc <= 1; acc++) {
    CHECK_OK((acc ? G->conv2d_bwd_data_acc : G->conv2d_bwd_data)(gpu, &p, &dy.g, &w.g, &dx.g));
    CHECK_OK((acc ? R->conv2d_bwd_data_acc : R->conv2d_bwd_data)(ref, &p, &dy.h, &w.h, &dx.h));
    r = down(gpu, &dx);
    CHECK_MSG(nerr(r, dx.hv, (size_t)ct_tensor_numel(&dx.h)) <= 1e-5, "conv bwd data%s x %s y %s: err %g",
              acc ? " acc" : "", xn ? "NHWC" : "NCHW", yn ? "NHWC" : "NCHW",
              nerr(r, dx.hv, (size_t)ct_tensor_numel(&dx.h)));
    free(r);
  }
  /* beta 1: the staged NHWC weight gradient must be added, not stored. */
  CHECK_OK(G->conv2d_bwd_weights(gpu, &p, &x.g, &dy.g, &dw.g, &db1g, 1.f));
  CHECK_OK(R->conv2d_bwd_weights(ref, &p, &x.h, &dy.h, &dw.h, &db1, 1.f));
  r = down(gpu, &dw);
  CHECK_MSG(nerr(r, dw.hv, (size_t)ct_tensor_numel(&dw.h)) <= 1e-5, "conv bwd weights x %s y %s: err %g",
            xn ? "NHWC" : "NCHW", yn ? "NHWC" : "NCHW", nerr(r, dw.hv, (size_t)ct_tensor_numel(&dw.h)));
  free(r);
  r = down(gpu, &db);
  CHECK_MSG(nerr(r, db.hv, (size_t)O) <= 1e-5, "conv bias grad x %s y %s", xn ? "NHWC" : "NCHW", yn ? "NHWC" : "NCHW");
  free(r);
  rm(gpu, &x), rm(gpu, &w), rm(gpu, &b), rm(gpu, &y), rm(gpu, &dy), rm(gpu, &dx), rm(gpu, &dw), rm(gpu, &db);
}

/* The cast from a plain f32 batch into an NHWC 16-bit one (what the
 * executor asks for the model input of a channels-last first
 * convolution) gives the host conversion's bits in NHWC order; the other
 * direction is refused, not misread. */
static void check_input_cast(ct_device *gpu) {
  const ct_backend *G = ct_device_backend(gpu);
  const int64_t N = 3, C = 5, HW = 7 * 6, n = N * C * HW;
  buf x = mk(gpu, N, C, 7, 6, 0, 1);
  const ct_dtype dts[2] = {CT_BF16, CT_F16};
  for (int k = 0; k < 2; k++) {
    uint16_t *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
    to_nhwc(x.hv, x.tmp, N, C, HW);
    ct_convert(x.tmp, CT_F32, want, dts[k], (size_t)n);
    ct_tensor y = x.g;
    y.dtype = dts[k], y.layout = CT_LAYOUT_NHWC, y.data = ct_device_alloc(gpu, (size_t)n * 2);
    CHECK_OK(G->cast(gpu, &x.g, &y));
    CHECK_OK(ct_device_sync(gpu));
    CHECK_OK(ct_device_copy(NULL, got, gpu, y.data, (size_t)n * 2));
    CHECK_MSG(!memcmp(want, got, (size_t)n * 2), "cast f32 plain -> %s NHWC differs from the host's", ct_dtype_name(dts[k]));
    ct_tensor back = x.g;
    CHECK(G->cast(gpu, &y, &back) == CT_ERR_UNSUPPORTED);
    ct_device_free(gpu, y.data);
    free(want), free(got);
  }
  rm(gpu, &x);
}

static void check_pool(ct_device *gpu, ct_device *ref, int is_max) {
  const ct_backend *G = ct_device_backend(gpu), *R = ct_device_backend(ref);
  ct_pool2d_params p = {3, 3, 2, 2, 1, 1, 0, 1};
  int64_t N = 2, C = 5, H = 9, W = 8, OH = (H + 2 - 3) / 2 + 1, OW = (W + 2 - 3) / 2 + 1;
  buf x = mk(gpu, N, C, H, W, 1, 1), y = mk(gpu, N, C, OH, OW, 1, 0), dy = mk(gpu, N, C, OH, OW, 1, 1);
  buf dx = mk(gpu, N, C, H, W, 1, 0);
  void *wsg = NULL, *wsr = NULL;
  if (is_max) {
    wsg = ct_device_alloc(gpu, G->maxpool2d_workspace_bytes(gpu, &p, &x.g, &y.g));
    wsr = malloc(R->maxpool2d_workspace_bytes(ref, &p, &x.h, &y.h));
    CHECK_OK(G->maxpool2d_fwd(gpu, &p, &x.g, &y.g, wsg));
    CHECK_OK(R->maxpool2d_fwd(ref, &p, &x.h, &y.h, wsr));
    CHECK_OK(G->maxpool2d_bwd(gpu, &p, &dy.g, wsg, &dx.g));
    CHECK_OK(R->maxpool2d_bwd(ref, &p, &dy.h, wsr, &dx.h));
  } else {
    CHECK_OK(G->avgpool2d_fwd(gpu, &p, &x.g, &y.g));
    CHECK_OK(R->avgpool2d_fwd(ref, &p, &x.h, &y.h));
    CHECK_OK(G->avgpool2d_bwd(gpu, &p, &dy.g, &dx.g));
    CHECK_OK(R->avgpool2d_bwd(ref, &p, &dy.h, &dx.h));
  }
  float *r = down(gpu, &y);
  CHECK_MSG(nerr(r, y.hv, (size_t)ct_tensor_numel(&y.h)) <= 1e-6, "%s pool NHWC fwd", is_max ? "max" : "avg");
  free(r);
  r = down(gpu, &dx);
  CHECK_MSG(nerr(r, dx.hv, (size_t)ct_tensor_numel(&dx.h)) <= 1e-6, "%s pool NHWC bwd", is_max ? "max" : "avg");
  free(r);
  /* A window whose offsets would not fit the workspace's int32 is refused. */
  if (is_max) {
    ct_pool2d_params huge = p;
    huge.kernel_h = huge.kernel_w = 65536;
    CHECK(G->maxpool2d_fwd(gpu, &huge, &x.g, &y.g, NULL) == CT_ERR_UNSUPPORTED);
  }
  /* A mixed pair is refused, never misread. */
  y.g.layout = CT_LAYOUT_PLAIN;
  CHECK(G->avgpool2d_fwd(gpu, &p, &x.g, &y.g) == CT_ERR_UNSUPPORTED);
  x.g.layout = y.g.layout = CT_LAYOUT_C16;
  CHECK(G->maxpool2d_fwd(gpu, &p, &x.g, &y.g, NULL) == CT_ERR_UNSUPPORTED);
  ct_device_free(gpu, wsg), free(wsr);
  rm(gpu, &x), rm(gpu, &y), rm(gpu, &dy), rm(gpu, &dx);
}

/* Global adaptive pooling (a 1x1 output): an NHWC input with a plain
 * output (the same bytes for one pixel), as the last stage of a ResNet
 * runs; an NHWC input pooled to 2x2 with a plain output is refused. */
static void check_global_pool(ct_device *gpu, ct_device *ref, int is_max) {
  const ct_backend *G = ct_device_backend(gpu), *R = ct_device_backend(ref);
  int64_t N = 2, C = 6, H = 5, W = 4;
  buf x = mk(gpu, N, C, H, W, 1, 1), y = mk(gpu, N, C, 1, 1, 0, 0), dy = mk(gpu, N, C, 1, 1, 0, 1);
  buf dx = mk(gpu, N, C, H, W, 1, 0);
  int32_t *ig = ct_device_alloc(gpu, (size_t)(N * C) * 4), *ir = malloc((size_t)(N * C) * 4);
  if (is_max) {
    CHECK_OK(G->adaptive_maxpool2d_fwd(gpu, &x.g, &y.g, ig));
    CHECK_OK(R->adaptive_maxpool2d_fwd(ref, &x.h, &y.h, ir));
    CHECK_OK(G->adaptive_maxpool2d_bwd(gpu, &dy.g, ig, &dx.g));
    CHECK_OK(R->adaptive_maxpool2d_bwd(ref, &dy.h, ir, &dx.h));
  } else {
    CHECK_OK(G->adaptive_avgpool2d_fwd(gpu, &x.g, &y.g));
    CHECK_OK(R->adaptive_avgpool2d_fwd(ref, &x.h, &y.h));
    CHECK_OK(G->adaptive_avgpool2d_bwd(gpu, &dy.g, &dx.g));
    CHECK_OK(R->adaptive_avgpool2d_bwd(ref, &dy.h, &dx.h));
  }
  float *r = down(gpu, &y);
  CHECK_MSG(nerr(r, y.hv, (size_t)(N * C)) <= 1e-6, "global %s pool NHWC -> plain fwd", is_max ? "max" : "avg");
  free(r);
  r = down(gpu, &dx);
  CHECK_MSG(nerr(r, dx.hv, (size_t)ct_tensor_numel(&dx.h)) <= 1e-6, "global %s pool bwd into NHWC",
            is_max ? "max" : "avg");
  free(r);
  buf y2 = mk(gpu, N, C, 2, 2, 0, 0);
  CHECK(G->adaptive_avgpool2d_fwd(gpu, &x.g, &y2.g) == CT_ERR_UNSUPPORTED);
  ct_device_free(gpu, ig), free(ir);
  rm(gpu, &x), rm(gpu, &y), rm(gpu, &dy), rm(gpu, &dx), rm(gpu, &y2);
}

/* One device training step; returns the update (weights after minus
 * weights before, host copy). The update, not the weights, is compared:
 * SGD at lr 0.01 moves a weight by far less than the tolerances below, so
 * two sets of weights would agree even if one layer's gradient were
 * garbage. */
static float *train_step(ct_device *gpu, const char *name, int c, int h, int w, ct_precision prec, int nhwc,
                         int *n_nhwc, int *n_fused, size_t *np) {
  ct_model_options mo = {c, h, w, 10, 7};
  ct_model *m = NULL;
  float *pg = NULL;
  CHECK_OK(ct_model_create(name, &mo, &m));
  if (!m) return NULL;
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].cls == &ct_layer_dropout || m->layers[i].cls == &ct_layer_dropout2d) m->layers[i].fp[0] = 0.0f;
  if (prec != CT_PRECISION_FP32) CHECK_OK(ct_model_set_precision(m, prec, CT_OPT_O1));
  CHECK_OK(ct_model_set_memory_format(m, nhwc ? CT_MEMORY_FORMAT_CHANNELS_LAST : CT_MEMORY_FORMAT_CONTIGUOUS));
  enum { B = 4 };
  ct_model_reserve_optimizer_state(m, 1);
  CHECK_OK(ct_model_prepare(m, gpu, B, 1));
  /* A 16-bit channels-last model casts its input straight into NHWC for
   * its first convolution (executor.c: edge_layout); otherwise it reads
   * the input as it comes, plain. */
  const ct_layer *l0 = &m->layers[0];
  if (l0->cls == &ct_layer_conv2d && l0->inputs[0] < 0) {
    const ct_layout want = nhwc && prec != CT_PRECISION_FP32 ? CT_LAYOUT_NHWC : CT_LAYOUT_PLAIN;
    CHECK_MSG(l0->x[0].layout == want, "%s prec %d nhwc %d: the first convolution reads its input in layout %d, "
              "expected %d", name, (int)prec, nhwc, (int)l0->x[0].layout, (int)want);
  }
  ct_model_params(m, np);
  float *p0 = malloc(*np * 4);
  CHECK_OK(ct_device_copy(NULL, p0, gpu, ct_model_params(m, NULL), *np * 4));
  *n_nhwc = *n_fused = 0;
  size_t reserves = 0;
  for (int i = 0; i < m->n_layers; i++) {
    *n_nhwc += m->layers[i].y.layout == CT_LAYOUT_NHWC;
    /* a batch norm whose ReLU the backend fuses keeps a reserve */
    *n_fused += m->layers[i].ws_reserve > 0;
    reserves += m->layers[i].ws_reserve;
  }
  /* A trial plan after a smaller batch (what ctrain summary --recompute
   * does) must size the reserves for the planned batch again, not for the
   * tensors' current shape, or the bound plan and the layers disagree. */
  ct_exec_shape_tensors(m, 1);
  size_t peak = 0, again = 0;
  CHECK_OK(ct_model_plan_peak_with_recompute(m, 2, &peak));
  for (int i = 0; i < m->n_layers; i++) again += m->layers[i].ws_reserve;
  CHECK_MSG(again == reserves, "%s: reserves %zu bytes after a trial plan, %zu when prepared", name, again, reserves);
  int64_t per = (int64_t)c * h * w;
  float *x = malloc(sizeof(float) * (size_t)(B * per));
  rs = 99;
  for (int64_t i = 0; i < B * per; i++) x[i] = frand();
  int64_t y[B] = {1, 4, 7, 2};
  ct_batch b;
  memset(&b, 0, sizeof b);
  int64_t xs[4] = {B, c, h, w};
  b.x = ct_tensor_view(x, CT_F32, 4, xs);
  b.y = ct_tensor_1d(y, CT_I64, B);
  b.n = B;
  ct_optim_config oc = ct_optim_config_default(CT_OPTIM_SGD);
  ct_optimizer *o = NULL;
  CHECK_OK(ct_optimizer_create(&oc, *np, &o));
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, 0, 0, 1.0);
  double loss = 0;
  int64_t t1 = 0, t5 = 0;
  int skipped = 1;
  CHECK_OK(ct_device_train_begin(m, gpu, o, &gs));
  CHECK_OK(ct_device_train_step(m, gpu, o, &b, CT_LOSS_CROSS_ENTROPY, 0, 0, 0, &gs, &loss, &t1, &t5, &skipped));
  CHECK(!skipped);
  pg = malloc(*np * 4);
  CHECK_OK(ct_device_sync(gpu));
  CHECK_OK(ct_device_copy(NULL, pg, gpu, ct_model_params(m, NULL), *np * 4));
  for (size_t i = 0; i < *np; i++) pg[i] -= p0[i];
  free(p0);
  ct_optimizer_destroy(o);
  ct_model_destroy(m);
  free(x);
  return pg;
}

/* fused: the batch norms expected to run with ReLU fused in the NHWC
 * step on the emulator (emu_cudnn.cpp fuses NHWC 16-bit data); on a GPU
 * cuDNN decides, so the count is printed, not checked. */
static void compare_step(ct_device *gpu, const char *name, int c, int h, int w, ct_precision prec, int min_nhwc,
                         int fused) {
  int na = 0, nb = 0, fa = 0, fb = 0;
  size_t npa = 0, npb = 0;
  float *a = train_step(gpu, name, c, h, w, prec, 1, &na, &fa, &npa);
  float *b = train_step(gpu, name, c, h, w, prec, 0, &nb, &fb, &npb);
  const char *no = getenv("CT_EMU_BN_NO_FUSED");
  if (getenv("CTRAIN_TEST_EMU"))
    CHECK_MSG(fa == (no && *no && strcmp(no, "0") ? 0 : fused),
              "%s prec %d: %d batch norms with ReLU fused, expected %d", name, (int)prec, fa, fused);
  CHECK_MSG(fb == 0, "%s prec %d: plain layout, still %d fused batch norms", name, (int)prec, fb);
  /* Normwise on the updates: f32 1e-3 (cuDNN's NHWC and NCHW algorithms
   * round differently), 16-bit 5e-2 (an activation may round to another
   * 16-bit neighbour); a wrong gradient is off by O(1). */
  double tol = prec == CT_PRECISION_FP32 ? 1e-3 : 5e-2;
  CHECK_MSG(na >= min_nhwc, "%s: %d NHWC activations, expected at least %d", name, na, min_nhwc);
  CHECK_MSG(nb == 0, "%s: layout choice off, still %d NHWC activations", name, nb);
  if (a && b && npa == npb) {
    double mx = 0;
    for (size_t i = 0; i < npb; i++) mx = fmax(mx, fabs((double)b[i]));
    CHECK_MSG(mx > 0, "%s prec %d: the plain step changed no weight; the comparison is blind", name, (int)prec);
    double e = nerr(a, b, npa);
    CHECK_MSG(e <= tol, "%s prec %d: updates of one step differ NHWC vs plain (%g)", name, (int)prec, e);
    printf("%-9s prec %d: %d NHWC activations, %d fused batch norms, update err %.3g\n", name, (int)prec, na, fa, e);
  }
  free(a), free(b);
}

/* The backend's describe op after the convolutions above: snprintf's
 * contract (length query, a cut that still ends in NUL), a line per pass
 * kind, the measured times of the benchmark plans, under the
 * emulator's CT_EMU_DNN_FIRST_FAILS the candidates it gave up on. */
static void check_describe(ct_device *gpu) {
  const ct_backend *be = ct_device_backend(gpu);
  CHECK(be->describe != NULL);
  if (!be->describe) return;
  size_t need = be->describe(gpu, NULL, 0);
  char small[24], *all = malloc(need + 1);
  CHECK(be->describe(gpu, small, sizeof small) == need && strlen(small) == sizeof small - 1);
  CHECK(all && be->describe(gpu, all, need + 1) == need && strlen(all) == need);
  if (!all) return;
  CHECK_MSG(strstr(all, "scratch buffer") && strstr(all, "conv2d_fwd ") && strstr(all, "conv2d_bwd_data ") &&
                strstr(all, "conv2d_bwd_weights") && strstr(all, "accumulating") && strstr(all, "timed (ms):"),
            "describe:\n%s", all);
  const char *ff = getenv("CT_EMU_DNN_FIRST_FAILS");
  if (ff && *ff == '1') CHECK_MSG(strstr(all, "cuDNN refused it") != NULL, "describe:\n%s", all);
  free(all);
}

/* The describe op's whole text (malloc'ed), or NULL. */
static char *describe_text(ct_device *gpu) {
  const ct_backend *be = ct_device_backend(gpu);
  size_t need = be->describe(gpu, NULL, 0);
  char *all = malloc(need + 1);
  if (all) be->describe(gpu, all, need + 1);
  return all;
}

/* Unless CTRAIN_CUDA_CONV_API=legacy, after the 16-bit steps: the graph
 * API's engines were candidates, and (where cuDNN refused none) ran. */
static void check_graph_describe(ct_device *gpu) {
  const char *api = getenv("CTRAIN_CUDA_CONV_API");
  if (api && !strcmp(api, "legacy")) return;
  char *all = describe_text(gpu);
  if (!all) return;
  fputs(all, stdout);
  CHECK_MSG(strstr(all, "graph and legacy API") && strstr(all, "ranked: *e"), "describe:\n%s", all);
  const char *nn = getenv("CT_EMU_DNN_NO_NHWC");
  if (!nn || *nn != '1') CHECK_MSG(strstr(all, ": engine ") != NULL, "describe:\n%s", all);
  free(all);
}

/* A model whose parameter sizes are not multiples of 4 floats (27
 * weights and 3 biases before the second convolution's weight), one f32
 * step with TF32 on (the f32 case that takes cuDNN's graph engines), on a
 * device of its own so that only its plans are listed: no plan may have
 * left a candidate because an operand was misaligned (each parameter
 * starts at a multiple of 256 bytes, model.c). On the emulator the graph
 * engines then ran; on a GPU cuDNN may refuse one for its own reasons. */
static void check_odd_sizes_aligned(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/ct_odd_model_XXXXXX.txt", test_tmpdir());
  if (test_write_temp(path, 4,
                      "input 1x16x16\nconv2d 1 3 3 padding=1\nrelu\nconv2d 3 8 3 padding=1\nrelu\n"
                      "flatten\nlinear 2048 10\n"))
    return;
  ct_device *gpu = NULL;
  CHECK_OK(ct_device_open("cuda", &gpu));
  if (gpu) CHECK_OK(ct_device_set_tf32(gpu, 1));
  int na = 0, fa = 0;
  size_t np = 0;
  float *upd = gpu ? train_step(gpu, path, 1, 16, 16, CT_PRECISION_FP32, 0, &na, &fa, &np) : NULL;
  remove(path);
  char *all = gpu ? describe_text(gpu) : NULL;
  if (all) {
    CHECK_MSG(strstr(all, "not aligned") == NULL, "odd sizes: a plan left a candidate for alignment:\n%s", all);
    const char *api = getenv("CTRAIN_CUDA_CONV_API");
    if (getenv("CTRAIN_TEST_EMU") && !(api && !strcmp(api, "legacy")))
      CHECK_MSG(strstr(all, "f32  nchw x 4x3x16x16 w 8x3x3x3 stride 1 pad 1 groups 1: engine "),
                "odd sizes: the second convolution did not run a graph engine:\n%s", all);
  }
  CHECK_MSG(upd != NULL, "odd sizes: no step");
  free(all), free(upd);
  ct_device_close(gpu);
}

int main(void) {
  ct_device *gpu, *ref;
  unsetenv("CTRAIN_CUDA_TF32"); /* the f32 convolution checks assume FMA math (TF32 off) */
  if (ct_device_open("cuda", &gpu) != CT_OK) {
    printf("skipped: %s\n", ct_last_error());
    return 77;
  }
  CHECK_OK(ct_device_open("ref", &ref));
  CHECK(ct_device_backend(gpu)->act_layout == CT_LAYOUT_NHWC);
  for (int xn = 0; xn < 2; xn++)
    for (int yn = 0; yn < 2; yn++) {
      conv_case(gpu, ref, xn, yn, 1, 6, 3);
      conv_case(gpu, ref, xn, yn, 1, 6, 1); /* 1x1: the filter is used where it lies */
      conv_case(gpu, ref, xn, yn, 1, 1, 3); /* one input channel: x, dx likewise */
    }
  conv_case(gpu, ref, 1, 1, 2, 6, 3);
  /* Again with the algorithms chosen by cudnnFind* timing runs
   * (--cudnn-benchmark), a plan cache of their own. */
  CHECK_OK(ct_device_backend(gpu)->set_option(gpu, "cudnn_benchmark", 1));
  conv_case(gpu, ref, 1, 1, 1, 6, 3);
  conv_case(gpu, ref, 0, 1, 1, 6, 3);
  conv_case(gpu, ref, 0, 1, 1, 6, 1);
  CHECK_OK(ct_device_backend(gpu)->set_option(gpu, "cudnn_benchmark", 0));
  CHECK(ct_device_backend(gpu)->set_option(gpu, "cudnn_benchmarks", 1) == CT_ERR_NOT_FOUND);
  check_describe(gpu);
  check_input_cast(gpu);
  check_pool(gpu, ref, 1);
  check_pool(gpu, ref, 0);
  check_global_pool(gpu, ref, 1);
  check_global_pool(gpu, ref, 0);
  compare_step(gpu, "cnn", 1, 28, 28, CT_PRECISION_FP32, 2, 0);
  compare_step(gpu, "cnn", 1, 28, 28, CT_PRECISION_BF16, 2, 0);
  compare_step(gpu, "cnn", 1, 28, 28, CT_PRECISION_FP16, 2, 0);
  /* A rerun under one of the emulator's cuDNN fault modes
   * (CTRAIN_TEST_EMU_VARIANT, tests/emu/CMakeLists.txt) leaves out AlexNet:
   * its steps are most of the emulator's time, and cnn and resnet18 take
   * the same fallbacks (plain input, a flatten after NHWC). */
  if (!getenv("CTRAIN_TEST_EMU_VARIANT")) {
    compare_step(gpu, "alexnet", 3, 64, 64, CT_PRECISION_FP32, 6, 0);
    compare_step(gpu, "alexnet", 3, 64, 64, CT_PRECISION_BF16, 6, 0);
  }
  compare_step(gpu, "resnet18", 3, 32, 32, CT_PRECISION_FP32, 0, 0);
  /* bf16 NHWC: the stem's and each block's first batch norm take their
   * ReLU fused (9), against the plain step's unfused ones */
  compare_step(gpu, "resnet18", 3, 32, 32, CT_PRECISION_BF16, 1, 9);
  check_graph_describe(gpu);
  ct_device_close(ref);
  ct_device_close(gpu);
  check_odd_sizes_aligned();
  return test_summary("gpu_layout");
}
