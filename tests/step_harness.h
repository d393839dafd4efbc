/* A model's training steps for tests that compare two ways of running the
 * same step (fused vs unfused ReLU, blocked vs plain layouts): random
 * inputs and labels, `steps` forward/cross-entropy/backward passes with an
 * SGD update (lr 0.05) between them, then a re-prepare for inference at
 * half the batch and one evaluation forward. Collects the last training
 * output, the parameter gradients, the buffers (running stats) and the
 * evaluation output. The model must be prepared for training at batch N
 * with N <= 16; a narrowed input (ct_model_narrow_input) gets the same
 * values rounded. Returns 0, or -1 with ct_last_error() set. */
#ifndef CTRAIN_TEST_STEP_HARNESS_H
#define CTRAIN_TEST_STEP_HARNESS_H

#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "exec/device_state.h"
#include "nn/model_impl.h"

typedef struct step_result {
  float *out, *grads, *bufs, *eval_out;
  size_t n_out, n_par, n_buf, n_eval;
} step_result;

static inline void step_result_free(step_result *r) {
  free(r->out), free(r->grads), free(r->bufs), free(r->eval_out);
  memset(r, 0, sizeof *r);
}

static inline float *step_copy(const void *src, size_t n) {
  float *p = malloc(sizeof(float) * (n ? n : 1));
  if (p && n) memcpy(p, src, sizeof(float) * n);
  return p;
}

/* x ([N, c, h, w] f32) as model m takes it: a narrowed input
 * (ct_model_narrow_input) rounded to its 16-bit dtype, channels-last
 * where asked, into buf (N*c*h*w floats of room). */
static inline ct_tensor step_input(const ct_model *m, const float *x, void *buf, int c, int h, int w, int64_t N) {
  int64_t per = (int64_t)c * h * w;
  ct_layout lay;
  ct_dtype dt = ct_model_input_dtype(m, &lay);
  const void *d = x;
  if (dt != CT_F32) {
    uint16_t *o = buf;
    for (int64_t i = 0; i < N * per; i++) {
      int64_t n = i / per, k = i % per / (h * w), yx = i % (h * w);
      int64_t at = lay == CT_LAYOUT_NHWC ? n * per + yx * c + k : i;
      o[at] = dt == CT_BF16 ? ct_f32_to_bf16(x[i]) : ct_f32_to_f16(x[i]);
    }
    d = buf;
  }
  ct_tensor t = ct_model_input_ndim(m) == 1 ? ct_tensor_2d((void *)d, dt, N, per) : ct_tensor_4d((void *)d, dt, N, c, h, w);
  t.layout = lay;
  return t;
}

/* Batch s of a fixed sequence for the device-step tests (host memory, as
 * the trainer's loader delivers it): x [B, c, h, w] uniform in [-1, 1) from
 * the counter-based RNG under `seed` (and stream 5, s), labels
 * (3i + s) mod 10; b views x and y. */
static inline void step_fixed_batch(ct_batch *b, float *x, int64_t *y, int64_t B, int c, int h, int w, int s,
                                    uint64_t seed) {
  const int64_t per = (int64_t)c * h * w;
  for (int64_t i = 0; i < B * per; i++) x[i] = 2.0f * ct_rng_uniform_at(seed, 5, (uint32_t)s, 0, (uint64_t)i) - 1.0f;
  for (int64_t i = 0; i < B; i++) y[i] = (i * 3 + s) % 10;
  memset(b, 0, sizeof *b);
  int64_t xs[4] = {B, c, h, w};
  b->x = ct_tensor_view(x, CT_F32, 4, xs);
  b->y = ct_tensor_1d(y, CT_I64, B);
  b->n = B;
  b->index = s;
}

static inline int step_run(ct_device *dev, ct_model *m, int c, int h, int w, int64_t N, int steps,
                           step_result *r) {
  memset(r, 0, sizeof *r);
  int64_t per = (int64_t)c * h * w, K = ct_model_output_size(m);
  float *x = malloc(sizeof(float) * (size_t)(N * per)), *x16 = malloc(sizeof(float) * (size_t)(N * per));
  if (!x || !x16 || N > 16) return free(x), free(x16), -1;
  for (int64_t i = 0; i < N * per; i++) x[i] = 2.0f * ct_rng_uniform_at(11, 7, 0, 0, (uint64_t)i) - 1.0f;
  ct_tensor xt = step_input(m, x, x16, c, h, w, N);
  int64_t y[16];
  for (int i = 0; i < N; i++) y[i] = (i * 7 + 3) % K;
  ct_tensor yt = ct_tensor_1d(y, CT_I64, N);
  const ct_tensor *out;
  ct_tensor dout;
  double lv;
  int rc = -1;
  for (int step = 0; step < steps; step++) {
    if (ct_model_forward(m, &xt, 1, (uint32_t)step, &out) != CT_OK) goto done;
    /* Copied now: the output buffer is reused during the backward. */
    if (step == steps - 1) r->n_out = (size_t)(N * K), r->out = step_copy(out->data, r->n_out);
    if (ct_loss_forward(dev, CT_LOSS_CROSS_ENTROPY, out, &yt, 0.0f, &lv) != CT_OK) goto done;
    if (ct_model_output_grad(m, &dout) != CT_OK || ct_model_zero_grad(m) != CT_OK) goto done;
    if (ct_loss_backward(dev, CT_LOSS_CROSS_ENTROPY, out, &yt, 0.0f, 1.0f, &dout) != CT_OK) goto done;
    if (ct_model_backward(m, &dout) != CT_OK) goto done;
    if (step < steps - 1) {
      size_t n;
      float *p = ct_model_params(m, &n), *g = ct_model_grads(m, &n);
      for (size_t i = 0; i < n; i++) p[i] -= 0.05f * g[i];
    }
  }
  float *g = ct_model_grads(m, &r->n_par);
  r->grads = step_copy(g, r->n_par);
  r->n_buf = m->n_buffers;
  r->bufs = step_copy(m->buffers, r->n_buf);
  if (ct_model_prepare(m, dev, N / 2, 0) != CT_OK) goto done;
  xt = step_input(m, x, x16, c, h, w, N / 2);
  if (ct_model_forward(m, &xt, 0, 0, &out) != CT_OK) goto done;
  r->n_eval = (size_t)(N / 2 * K);
  r->eval_out = step_copy(out->data, r->n_eval);
  rc = 0;
done:
  free(x), free(x16);
  return rc;
}

#endif
