/* A model split into two stages on two devices (ct_model_stage), the
 * activation and its gradient handed across the cut by the caller as a
 * pipeline would: the chained forward and backward must give the whole
 * model's outputs, parameter gradients and input gradient, bit for bit
 * where both run the same kernels (the CPU). Cuts: lenet5 after its
 * flatten and after its first pool (a convolution's input, which the
 * whole model keeps in the backend's blocked layout and a stage receives
 * plain), and `make train`'s convnet (batch norm, dropout) half way,
 * with the contiguous memory format: under auto the whole model keeps
 * that cut's activation blocked and the convolution reading it takes
 * another oneDNN kernel than for the stage's plain input, which rounds
 * differently (2e-7 relative seen). */
#ifndef CTRAIN_TESTS_STAGES_H
#define CTRAIN_TESTS_STAGES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/device.h"
#include "ctrain/loss.h"
#include "ctrain/model.h"
#include "try.h"

#define NB 8

static void *to_host(const ct_tensor *t) {
  size_t b = ct_tensor_nbytes(t);
  void *h = malloc(b);
  TRY(ct_device_copy(NULL, h, t->device, t->data, b));
  return h;
}

/* Compares two device tensors of the same shape: 0 bit for bit (exact),
 * else within tol relative; prints and returns 1 on a difference. */
static int same(const char *what, const ct_tensor *a, const ct_tensor *b, int exact, double tol) {
  if (ct_tensor_numel(a) != ct_tensor_numel(b)) {
    fprintf(stderr, "FAIL: %s: %lld vs %lld elements\n", what, (long long)ct_tensor_numel(a), (long long)ct_tensor_numel(b));
    return 1;
  }
  float *ha = to_host(a), *hb = to_host(b);
  size_t n = (size_t)ct_tensor_numel(a);
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < n; i++) {
    double e = ha[i] - (double)hb[i];
    d = d > (e < 0 ? -e : e) ? d : (e < 0 ? -e : e);
    m = m > (ha[i] < 0 ? -ha[i] : ha[i]) ? m : (ha[i] < 0 ? -ha[i] : ha[i]);
  }
  int bad = exact ? memcmp(ha, hb, n * sizeof(float)) != 0 : d / m > tol;
  if (bad) fprintf(stderr, "FAIL: %s differs (max |diff| %.3g, relative %.3g)\n", what, d, d / m);
  free(ha), free(hb);
  return bad;
}

/* Trains one step's forward and backward of the whole model and of its
 * two stages [0, cut] and [cut + 1, L - 1] on spec0 and spec1. */
static int stages_case(const char *model, int cut, ct_memory_format fmt, const char *spec0, const char *spec1,
                       int exact) {
  ct_device *d0, *d1, *dw;
  if (ct_device_open(spec0, &d0) != CT_OK || ct_device_open(spec1, &d1) != CT_OK) {
    printf("SKIP: no %s/%s device (%s)\n", spec0, spec1, ct_last_error());
    return 77;
  }
  TRY(ct_device_open(spec0, &dw));
  ct_model_options mo = {0, 0, 0, 0, 5};
  ct_model *whole, *a, *b;
  TRY(ct_model_create(model, &mo, &whole));
  const int L = ct_model_layer_count(whole);
  TRY(ct_model_stage(whole, 0, cut, &a));
  TRY(ct_model_stage(whole, cut + 1, L - 1, &b));
  TRY(ct_model_set_memory_format(whole, fmt));
  TRY(ct_model_set_memory_format(a, fmt));
  TRY(ct_model_set_memory_format(b, fmt));
  TRY(ct_model_set_input_grad(whole, 1));
  TRY(ct_model_set_input_grad(a, 1));
  TRY(ct_model_set_input_grad(b, 1));
  TRY(ct_model_prepare(whole, dw, NB, 1));
  TRY(ct_model_prepare(a, d0, NB, 1));
  TRY(ct_model_prepare(b, d1, NB, 1));
  int c, h, w;
  ct_model_input_shape(whole, &c, &h, &w);
  int64_t per = (int64_t)c * h * w, shape[4] = {NB, c, h, w};
  float *x = malloc((size_t)(NB * per) * sizeof *x);
  uint32_t st = 777;
  for (int64_t i = 0; i < NB * per; i++) st = st * 1664525u + 1013904223u, x[i] = (float)((st >> 8) & 0xffff) / 32768.0f - 1.0f;
  int64_t y[NB];
  for (int i = 0; i < NB; i++) y[i] = i % 5;
  void *xw = ct_device_alloc(dw, (size_t)(NB * per) * sizeof(float)), *x0 = ct_device_alloc(d0, (size_t)(NB * per) * sizeof(float));
  void *yw = ct_device_alloc(dw, sizeof y);
  TRY(ct_device_copy(dw, xw, NULL, x, (size_t)(NB * per) * sizeof(float)));
  TRY(ct_device_copy(d0, x0, NULL, x, (size_t)(NB * per) * sizeof(float)));
  TRY(ct_device_copy(dw, yw, NULL, y, sizeof y));
  ct_tensor xtw = ct_tensor_view(xw, CT_F32, 4, shape), xt0 = ct_tensor_view(x0, CT_F32, 4, shape);
  xtw.device = dw, xt0.device = d0;
  ct_tensor yt = ct_tensor_1d(yw, CT_I64, NB);
  yt.device = dw;

  /* The whole model: forward, the loss gradient, backward. */
  const ct_tensor *ow, *oa, *ob;
  ct_tensor dw_out;
  double lv;
  TRY(ct_model_forward(whole, &xtw, 1, 3, &ow));
  TRY(ct_loss_forward(dw, CT_LOSS_CROSS_ENTROPY, ow, &yt, 0.0f, &lv));
  TRY(ct_model_output_grad(whole, &dw_out));
  TRY(ct_loss_backward(dw, CT_LOSS_CROSS_ENTROPY, ow, &yt, 0.0f, 1.0f, &dw_out));
  /* The backward may reuse the output gradient's memory: keep a copy. */
  void *dout_h = to_host(&dw_out);
  TRY(ct_model_backward(whole, &dw_out));

  /* The stages: a's output crosses to b's device, b's input gradient
   * crosses back; the loss gradient is the whole model's. */
  TRY(ct_model_forward(a, &xt0, 1, 3, &oa));
  size_t ab = ct_tensor_nbytes(oa);
  void *xb = ct_device_alloc(d1, ab), *hop = to_host(oa);
  TRY(ct_device_copy(d1, xb, NULL, hop, ab));
  free(hop);
  ct_tensor xbt = *oa;
  xbt.data = xb, xbt.device = d1;
  TRY(ct_model_forward(b, &xbt, 1, 3, &ob));
  int bad = same("the output", ow, ob, exact, 1e-5);
  ct_tensor db_out, gin_b, gin_a, gin_w;
  TRY(ct_model_output_grad(b, &db_out));
  TRY(ct_device_copy(d1, db_out.data, NULL, dout_h, ct_tensor_nbytes(&dw_out)));
  free(dout_h);
  TRY(ct_model_backward(b, &db_out));
  TRY(ct_model_input_grad(b, &gin_b));
  ct_tensor da_out;
  TRY(ct_model_output_grad(a, &da_out));
  void *gh = to_host(&gin_b);
  TRY(ct_device_copy(d0, da_out.data, NULL, gh, ct_tensor_nbytes(&gin_b)));
  free(gh);
  TRY(ct_model_backward(a, &da_out));
  TRY(ct_model_input_grad(a, &gin_a));
  TRY(ct_model_input_grad(whole, &gin_w));
  bad |= same("the input gradient", &gin_w, &gin_a, exact, 1e-5);
  int checked = 0;
  for (int i = 0; i < ct_model_state_count(whole); i++) {
    const ct_state_entry *e = ct_model_state(whole, i);
    if (e->is_buffer) continue;
    ct_model *part = ct_model_state_find(a, e->name) >= 0 ? a : b;
    const ct_state_entry *p = ct_model_state(part, ct_model_state_find(part, e->name));
    char what[160];
    snprintf(what, sizeof what, "the gradient of %s", e->name);
    bad |= same(what, &e->grad, &p->grad, exact, 1e-5);
    checked++;
  }
  if (!bad)
    printf("ok: %s cut after layer %d of %d (%s) on %s/%s: output, input gradient and %d parameter gradients %s\n",
           model, cut, L, ct_memory_format_name(fmt), spec0, spec1, checked, exact ? "bit for bit" : "within 1e-5");
  ct_device_free(d1, xb), ct_device_free(dw, xw), ct_device_free(d0, x0), ct_device_free(dw, yw);
  free(x);
  ct_model_destroy(a), ct_model_destroy(b), ct_model_destroy(whole);
  ct_device_close(d0), ct_device_close(d1), ct_device_close(dw);
  return bad;
}

/* The first layer from the middle on after which model can be cut. */
static int middle_cut(const char *model) {
  ct_model_options mo = {0, 0, 0, 0, 5};
  ct_model *m, *s;
  TRY(ct_model_create(model, &mo, &m));
  int L = ct_model_layer_count(m), cut = L / 2;
  for (; cut < L - 1; cut++)
    if (ct_model_stage(m, cut + 1, L - 1, &s) == CT_OK) break;
  if (cut < L - 1) ct_model_destroy(s);
  ct_model_destroy(m);
  return cut;
}

static int stages_check(const char *spec0, const char *spec1, int exact) {
  int r = stages_case("lenet5", 6, CT_MEMORY_FORMAT_AUTO, spec0, spec1, exact);
  if (!r) r = stages_case("lenet5", 2, CT_MEMORY_FORMAT_AUTO, spec0, spec1, exact);
  if (!r) r = stages_case("convnet", middle_cut("convnet"), CT_MEMORY_FORMAT_CONTIGUOUS, spec0, spec1, exact);
  return r;
}

#endif
