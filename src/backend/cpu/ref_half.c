/* bf16/f16 for every op that has no kernel of its own in that dtype: the
 * 16-bit tensors of a call are widened to f32 temporaries, the op runs in
 * f32 (on the calling device's backend, so the CPU device still uses
 * oneDNN and its pooling loops; adaptive pooling on the reference), and
 * the outputs are rounded back to nearest even. This is the correctness
 * path of mixed precision: fp16 on a CPU without fp16 arithmetic, and bf16
 * for ops (batch norm, elementwise, softmax, adaptive pooling) whose fast
 * kernels are f32 only. Outputs accumulated with beta != 0 are widened
 * first so beta * old + new sees the old value. The temporaries are the
 * device's (ct_device_tmp_get: large blocks are kept and reused, not
 * faulted in on every call), outside the memory plan. */
#include <stdlib.h>

#include "backend/cpu/ref_ops.h"
#include "backend/device_impl.h"

#define HALF_MAX 8

typedef struct hscope {
  ct_device *dev;
  int n;
  void *bufs[HALF_MAX];
  int nout;
  ct_tensor *out_orig[HALF_MAX];
  ct_tensor out_f32[HALF_MAX];
} hscope;

static int is_half(const ct_tensor *t) { return t && (t->dtype == CT_BF16 || t->dtype == CT_F16); }

static void convert_par(const void *src, ct_dtype st, void *dst, ct_dtype dt, int64_t n) {
  const int64_t chunk = 16384;
  int64_t nc = (n + chunk - 1) / chunk;
#pragma omp parallel for if (nc > 4)
  for (int64_t c = 0; c < nc; c++) {
    int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
    ct_convert((const char *)src + (size_t)lo * ct_dtype_size(st), st, (char *)dst + (size_t)lo * ct_dtype_size(dt),
               dt, (size_t)len);
  }
}

/* f32 view of t in *o (t itself when it is not 16-bit); keep copies the
 * content (inputs, and outputs that accumulate). */
static ct_status widen(hscope *h, const ct_tensor *t, ct_tensor *o, int keep) {
  if (!t) return CT_OK;
  *o = *t;
  if (!is_half(t)) return CT_OK;
  if (h->n == HALF_MAX) return ct_error(CT_ERR_INTERNAL, "ref_half: too many tensors");
  int64_t n = ct_tensor_numel(t);
  float *p = ct_device_tmp_get(h->dev, (size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!p) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s op: cannot allocate %lld f32 elements to widen a %s tensor",
                          ct_dtype_name(t->dtype), (long long)n, ct_dtype_name(t->dtype));
  h->bufs[h->n++] = p;
  if (keep) convert_par(t->data, t->dtype, p, CT_F32, n);
  o->data = p;
  o->dtype = CT_F32;
  return CT_OK;
}

static ct_status in(hscope *h, const ct_tensor *t, ct_tensor *o) { return widen(h, t, o, 1); }

static ct_status out(hscope *h, ct_tensor *t, ct_tensor *o, int keep) {
  CT_TRY(widen(h, t, o, keep));
  if (t && is_half(t)) {
    h->out_orig[h->nout] = t;
    h->out_f32[h->nout++] = *o;
  }
  return CT_OK;
}

/* Rounds the outputs back (only when the op succeeded) and frees. */
static ct_status finish(hscope *h, ct_status s) {
  for (int i = 0; s == CT_OK && i < h->nout; i++)
    convert_par(h->out_f32[i].data, CT_F32, h->out_orig[i]->data, h->out_orig[i]->dtype, ct_tensor_numel(h->out_orig[i]));
  for (int i = 0; i < h->n; i++) ct_device_tmp_put(h->dev, h->bufs[i]);
  return s;
}

/* The backend that runs the widened call: the device's own (so f32 goes
 * to its fast kernels), or the reference without a device. */
static const ct_backend *target(ct_device *d) {
  const ct_backend *b = d ? ct_device_backend(d) : NULL;
  return b ? b : ct_ref_backend();
}

#define P(t) ((t) ? &w_##t : NULL)

ct_status ct_ref_half_matmul(ct_device *d, int ta, int tb, const ct_tensor *a, const ct_tensor *b, float alpha,
                             float beta, ct_tensor *c) {
  if (!is_half(a) && !is_half(b) && !is_half(c)) return ct_ref_matmul(d, ta, tb, a, b, alpha, beta, c);
  hscope h = {.dev = d};
  ct_tensor w_a, w_b, w_c;
  ct_status s = in(&h, a, &w_a);
  if (s == CT_OK) s = in(&h, b, &w_b);
  if (s == CT_OK) s = out(&h, c, &w_c, beta != 0.0f);
  if (s == CT_OK) s = target(d)->matmul(d, ta, tb, &w_a, &w_b, alpha, beta, &w_c);
  return finish(&h, s);
}

ct_status ct_ref_half_linear_fwd(ct_device *d, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_act act,
                                 ct_tensor *y) {
  if (!is_half(x) && !is_half(w) && !is_half(b) && !is_half(y)) return ct_ref_linear_fwd(d, x, w, b, act, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_w, w_b, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = in(&h, w, &w_w);
  if (s == CT_OK) s = in(&h, b, &w_b);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->linear_fwd(d, &w_x, &w_w, P(b), act, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_linear_bwd_data(ct_device *d, const ct_tensor *dy, const ct_tensor *w, ct_tensor *dx) {
  if (!is_half(dy) && !is_half(w) && !is_half(dx)) return ct_ref_linear_bwd_data(d, dy, w, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_w, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = in(&h, w, &w_w);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->linear_bwd_data(d, &w_dy, &w_w, &w_dx);
  return finish(&h, s);
}

ct_status ct_ref_half_linear_bwd_weights(ct_device *d, const ct_tensor *x, const ct_tensor *dy, ct_tensor *dw,
                                         ct_tensor *db, float beta) {
  if (!is_half(x) && !is_half(dy) && !is_half(dw) && !is_half(db))
    return ct_ref_linear_bwd_weights(d, x, dy, dw, db, beta);
  hscope h = {.dev = d};
  ct_tensor w_x, w_dy, w_dw, w_db;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dw, &w_dw, beta != 0.0f);
  if (s == CT_OK) s = out(&h, db, &w_db, beta != 0.0f);
  if (s == CT_OK) s = target(d)->linear_bwd_weights(d, &w_x, &w_dy, &w_dw, P(db), beta);
  return finish(&h, s);
}

ct_status ct_ref_half_conv2d_fwd(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                                 const ct_tensor *b, ct_act act, ct_tensor *y) {
  if (!is_half(x) && !is_half(w) && !is_half(b) && !is_half(y)) return ct_ref_conv2d_fwd(d, p, x, w, b, act, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_w, w_b, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = in(&h, w, &w_w);
  if (s == CT_OK) s = in(&h, b, &w_b);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->conv2d_fwd(d, p, &w_x, &w_w, P(b), act, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_conv2d_bwd_data(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy,
                                      const ct_tensor *w, ct_tensor *dx) {
  if (!is_half(dy) && !is_half(w) && !is_half(dx)) return ct_ref_conv2d_bwd_data(d, p, dy, w, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_w, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = in(&h, w, &w_w);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->conv2d_bwd_data(d, p, &w_dy, &w_w, &w_dx);
  return finish(&h, s);
}

/* The reference's own accumulation on the widened dx (a device backend
 * without the entry never reaches here: the planner does not ask it). */
ct_status ct_ref_half_conv2d_bwd_data_acc(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy,
                                          const ct_tensor *w, ct_tensor *dx) {
  if (!is_half(dy) && !is_half(w) && !is_half(dx)) return ct_ref_conv2d_bwd_data_acc(d, p, dy, w, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_w, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = in(&h, w, &w_w);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 1);
  if (s == CT_OK) s = ct_ref_conv2d_bwd_data_acc(d, p, &w_dy, &w_w, &w_dx);
  return finish(&h, s);
}

ct_status ct_ref_half_conv2d_bwd_weights(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x,
                                         const ct_tensor *dy, ct_tensor *dw, ct_tensor *db, float beta) {
  if (!is_half(x) && !is_half(dy) && !is_half(dw) && !is_half(db))
    return ct_ref_conv2d_bwd_weights(d, p, x, dy, dw, db, beta);
  hscope h = {.dev = d};
  ct_tensor w_x, w_dy, w_dw, w_db;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dw, &w_dw, beta != 0.0f);
  if (s == CT_OK) s = out(&h, db, &w_db, beta != 0.0f);
  if (s == CT_OK) s = target(d)->conv2d_bwd_weights(d, p, &w_x, &w_dy, &w_dw, P(db), beta);
  return finish(&h, s);
}

/* Max pooling runs widened on the device's backend like the rest (the
 * cpu device's 2x2 tiles or oneDNN), so its workspace (argmax positions)
 * is that backend's for the f32 shapes: the caller sizes it through
 * ct_ref_half_maxpool2d_workspace_bytes. */
static ct_tensor as_f32(const ct_tensor *t) {
  ct_tensor o = *t;
  if (is_half(t)) o.dtype = CT_F32;
  return o;
}

size_t ct_ref_half_maxpool2d_workspace_bytes(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x,
                                             const ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_maxpool2d_workspace_bytes(d, p, x, y);
  ct_tensor w_x = as_f32(x), w_y = as_f32(y);
  const ct_backend *b = target(d);
  return b->maxpool2d_workspace_bytes ? b->maxpool2d_workspace_bytes(d, p, &w_x, &w_y) : 0;
}

ct_status ct_ref_half_maxpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y,
                                    void *ws) {
  if (!is_half(x) && !is_half(y)) return ct_ref_maxpool2d_fwd(d, p, x, y, ws);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->maxpool2d_fwd(d, p, &w_x, &w_y, ws);
  return finish(&h, s);
}

ct_status ct_ref_half_maxpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, const void *ws,
                                    ct_tensor *dx) {
  if (!is_half(dy) && !is_half(dx)) return ct_ref_maxpool2d_bwd(d, p, dy, ws, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->maxpool2d_bwd(d, p, &w_dy, ws, &w_dx);
  return finish(&h, s);
}

ct_status ct_ref_half_avgpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_avgpool2d_fwd(d, p, x, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->avgpool2d_fwd(d, p, &w_x, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_avgpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, ct_tensor *dx) {
  if (!is_half(dy) && !is_half(dx)) return ct_ref_avgpool2d_bwd(d, p, dy, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->avgpool2d_bwd(d, p, &w_dy, &w_dx);
  return finish(&h, s);
}

ct_status ct_ref_half_adaptive_avgpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_adaptive_avgpool2d_fwd(d, x, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = ct_ref_adaptive_avgpool2d_fwd(d, &w_x, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_adaptive_avgpool2d_bwd(ct_device *d, const ct_tensor *dy, ct_tensor *dx) {
  if (!is_half(dy) && !is_half(dx)) return ct_ref_adaptive_avgpool2d_bwd(d, dy, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = ct_ref_adaptive_avgpool2d_bwd(d, &w_dy, &w_dx);
  return finish(&h, s);
}

ct_status ct_ref_half_adaptive_maxpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y, int32_t *idx) {
  if (!is_half(x) && !is_half(y)) return ct_ref_adaptive_maxpool2d_fwd(d, x, y, idx);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = ct_ref_adaptive_maxpool2d_fwd(d, &w_x, &w_y, idx);
  return finish(&h, s);
}

ct_status ct_ref_half_adaptive_maxpool2d_bwd(ct_device *d, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx) {
  if (!is_half(dy) && !is_half(dx)) return ct_ref_adaptive_maxpool2d_bwd(d, dy, idx, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = ct_ref_adaptive_maxpool2d_bwd(d, &w_dy, idx, &w_dx);
  return finish(&h, s);
}

/* Batch norm: x/y (and dy/dx) 16-bit, parameters and statistics f32. */
ct_status ct_ref_half_batchnorm_fwd(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                                    const ct_tensor *beta, ct_tensor *rm, ct_tensor *rv, float momentum, float eps,
                                    ct_tensor *y, ct_tensor *sm, ct_tensor *si) {
  if (!is_half(x) && !is_half(y)) return ct_ref_batchnorm_fwd(d, training, x, gamma, beta, rm, rv, momentum, eps, y, sm, si);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->batchnorm_fwd(d, training, &w_x, gamma, beta, rm, rv, momentum, eps, &w_y, sm, si);
  return finish(&h, s);
}

/* Normalised in f32 and rounded, then act on the 16-bit y: the order of
 * the training forward (batchnorm_fwd, then act_fwd in place). */
ct_status ct_ref_half_batchnorm_apply(ct_device *d, const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                                      const ct_tensor *sm, const ct_tensor *si, ct_act act, float alpha,
                                      ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_batchnorm_apply(d, x, gamma, beta, sm, si, act, alpha, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->batchnorm_apply(d, &w_x, gamma, beta, sm, si, CT_ACT_NONE, 0.0f, &w_y);
  CT_TRY(finish(&h, s));
  return act == CT_ACT_NONE ? CT_OK : target(d)->act_fwd(d, act, alpha, y, y);
}

ct_status ct_ref_half_batchnorm_bwd(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                                    const ct_tensor *sm, const ct_tensor *si, ct_tensor *dx, ct_tensor *dgamma,
                                    ct_tensor *dbeta, float beta_acc) {
  if (!is_half(x) && !is_half(dy) && !is_half(dx)) return ct_ref_batchnorm_bwd(d, x, dy, gamma, sm, si, dx, dgamma, dbeta, beta_acc);
  hscope h = {.dev = d};
  ct_tensor w_x, w_dy, w_dx;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->batchnorm_bwd(d, &w_x, &w_dy, gamma, sm, si, &w_dx, dgamma, dbeta, beta_acc);
  return finish(&h, s);
}

ct_status ct_ref_half_act_fwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_act_fwd(d, act, alpha, x, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->act_fwd(d, act, alpha, &w_x, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_act_bwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, const ct_tensor *y,
                              const ct_tensor *dy, ct_tensor *dx) {
  if (!is_half(x) && !is_half(y) && !is_half(dy) && !is_half(dx)) return ct_ref_act_bwd(d, act, alpha, x, y, dy, dx);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y, w_dy, w_dx;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = in(&h, y, &w_y);
  if (s == CT_OK) s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->act_bwd(d, act, alpha, P(x), P(y), &w_dy, &w_dx);
  return finish(&h, s);
}

ct_status ct_ref_half_dropout_fwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                                  ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_dropout_fwd(d, p, group, key, x, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->dropout_fwd(d, p, group, key, &w_x, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_dropout_bwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *dy,
                                  ct_tensor *dx) {
  if (!is_half(dy) && !is_half(dx)) return ct_ref_dropout_bwd(d, p, group, key, dy, dx);
  hscope h = {.dev = d};
  ct_tensor w_dy, w_dx;
  ct_status s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->dropout_bwd(d, p, group, key, &w_dy, &w_dx);
  return finish(&h, s);
}

ct_status ct_ref_half_add(ct_device *d, const ct_tensor *a, const ct_tensor *b, ct_act act, ct_tensor *y) {
  if (!is_half(a) && !is_half(b) && !is_half(y)) return ct_ref_add(d, a, b, act, y);
  hscope h = {.dev = d};
  ct_tensor w_a, w_b, w_y;
  ct_status s = in(&h, a, &w_a);
  if (s == CT_OK) s = in(&h, b, &w_b);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->add(d, &w_a, &w_b, act, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_axpby(ct_device *d, float alpha, const ct_tensor *x, float beta, ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_axpby(d, alpha, x, beta, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, beta != 0.0f);
  if (s == CT_OK) s = target(d)->axpby(d, alpha, &w_x, beta, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_softmax_fwd(ct_device *d, int log, const ct_tensor *x, ct_tensor *y) {
  if (!is_half(x) && !is_half(y)) return ct_ref_softmax_fwd(d, log, x, y);
  hscope h = {.dev = d};
  ct_tensor w_x, w_y;
  ct_status s = in(&h, x, &w_x);
  if (s == CT_OK) s = out(&h, y, &w_y, 0);
  if (s == CT_OK) s = target(d)->softmax_fwd(d, log, &w_x, &w_y);
  return finish(&h, s);
}

ct_status ct_ref_half_softmax_bwd(ct_device *d, int log, const ct_tensor *y, const ct_tensor *dy, ct_tensor *dx) {
  if (!is_half(y) && !is_half(dy) && !is_half(dx)) return ct_ref_softmax_bwd(d, log, y, dy, dx);
  hscope h = {.dev = d};
  ct_tensor w_y, w_dy, w_dx;
  ct_status s = in(&h, y, &w_y);
  if (s == CT_OK) s = in(&h, dy, &w_dy);
  if (s == CT_OK) s = out(&h, dx, &w_dx, 0);
  if (s == CT_OK) s = target(d)->softmax_bwd(d, log, &w_y, &w_dy, &w_dx);
  return finish(&h, s);
}
