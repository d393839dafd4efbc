/* The cpu backend's native bf16 loops (activations, dropout, add, and,
 * where oneDNN has no bf16, the first layer's weight gradient) against
 * their definition: the same op run in f32 on the bf16 inputs widened,
 * then rounded to bf16 once. That is what the widening path computed, so
 * the native loops must match it bit for bit; they are also checked
 * against the f64 reference within bf16 tolerance. Sizes are odd and span
 * several chunks and the parallel threshold; mixed bf16/f32 operands and
 * in-place calls are covered. */
#include "backend/cpu/cpu_impl.h"
#include "test_cpu_common.h"

#define N_BIG 100003 /* > PAR_MIN, not a multiple of the chunk */

/* Number of elements where bf16 result h differs bitwise from f rounded. */
static int64_t diff16(const uint16_t *h, const float *f, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += h[i] != ct_f32_to_bf16(f[i]);
  return bad;
}

static const char *act_names[CT_ACT_COUNT] = {"none", "relu", "leaky", "gelu", "silu", "sigmoid", "tanh"};

static void test_act(int64_t n) {
  for (int a = 0; a < CT_ACT_COUNT; a++) {
    tb x = TB(n), y = TB(n), dy = TB(n), dx = TB(n), y32 = TB(n), dx32 = TB(n);
    tb_rand(&x, 2.0), tb_rand(&dy, 1.0);
    tb_round_bf16(&x), tb_round_bf16(&dy);
    ct_tensor x16 = tb_cpu16(&x), y16 = tb_cpu16(&y), dy16 = tb_cpu16(&dy), dx16 = tb_cpu16(&dx);
    ct_tensor xf = tb_cpu(&x), yf = tb_cpu(&y32), dyf = tb_cpu(&dy), dxf = tb_cpu(&dx32);
    float alpha = a == CT_ACT_LEAKY_RELU ? 0.01f : 0.f;
    CHECK_OK(C_->act_fwd(g_cpu, (ct_act)a, alpha, &x16, &y16));
    CHECK_OK(C_->act_fwd(g_cpu, (ct_act)a, alpha, &xf, &yf));
    CHECK_MSG(diff16(y.h, y32.f, n) == 0, "act_fwd %s n%lld bf16 != round(f32)", act_names[a], (long long)n);
    /* backward reads y as bf16 (what the forward stored) */
    for (int64_t i = 0; i < n; i++) y32.f[i] = ct_bf16_to_f32(y.h[i]);
    CHECK_OK(C_->act_bwd(g_cpu, (ct_act)a, alpha, &x16, &y16, &dy16, &dx16));
    CHECK_OK(C_->act_bwd(g_cpu, (ct_act)a, alpha, &xf, &yf, &dyf, &dxf));
    CHECK_MSG(diff16(dx.h, dx32.f, n) == 0, "act_bwd %s n%lld bf16 != round(f32)", act_names[a], (long long)n);
    /* against the f64 reference */
    ct_tensor xr = tb_ref(&x), yr = tb_ref(&y);
    CHECK_OK(R_->act_fwd(g_ref, (ct_act)a, alpha, &xr, &yr));
    double e = tb_err16(&y);
    CHECK_MSG(e <= 1e-2, "act_fwd %s bf16 vs f64 reference: err %.3g", act_names[a], e);
    /* mixed: bf16 in, f32 out equals the f32 op on the widened input */
    tb yo = TB(n);
    ct_tensor yof = tb_cpu(&yo);
    CHECK_OK(C_->act_fwd(g_cpu, (ct_act)a, alpha, &x16, &yof));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += ct_f32_to_bf16(yo.f[i]) != y.h[i];
    CHECK_MSG(bad == 0, "act_fwd %s bf16 -> f32: %lld differ", act_names[a], (long long)bad);
    /* in place */
    memcpy(dx.h, x.h, (size_t)n * 2);
    CHECK_OK(C_->act_fwd(g_cpu, (ct_act)a, alpha, &dx16, &dx16));
    CHECK_MSG(memcmp(dx.h, y.h, (size_t)n * 2) == 0, "act_fwd %s in place differs", act_names[a]);
    tb_free(&x), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&y32), tb_free(&dx32), tb_free(&yo);
  }
}

static void test_dropout(int64_t n, int64_t group) {
  tb x = TB(n), y = TB(n), y32 = TB(n), dx = TB(n), dx32 = TB(n);
  tb_rand(&x, 3.0);
  tb_round_bf16(&x);
  ct_tensor x16 = tb_cpu16(&x), y16 = tb_cpu16(&y), xf = tb_cpu(&x), yf = tb_cpu(&y32);
  ct_tensor dx16 = tb_cpu16(&dx), dxf = tb_cpu(&dx32);
  ct_dropout_key key = {0x1234567890abcull, 7, 3, 0, 0, 0};
  const float ps[] = {0.1f, 0.5f, 0.3f};
  for (int k = 0; k < 3; k++) {
    CHECK_OK(C_->dropout_fwd(g_cpu, ps[k], group, key, &x16, &y16));
    CHECK_OK(C_->dropout_fwd(g_cpu, ps[k], group, key, &xf, &yf));
    CHECK_MSG(diff16(y.h, y32.f, n) == 0, "dropout_fwd p%.1f group %lld n%lld", ps[k], (long long)group, (long long)n);
    CHECK_OK(C_->dropout_bwd(g_cpu, ps[k], group, key, &x16, &dx16));
    CHECK_OK(C_->dropout_bwd(g_cpu, ps[k], group, key, &xf, &dxf));
    CHECK_MSG(diff16(dx.h, dx32.f, n) == 0, "dropout_bwd p%.1f group %lld", ps[k], (long long)group);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) zeros += y.h[i] == 0;
    CHECK_MSG(zeros > 0 && zeros < n, "dropout p%.1f dropped %lld of %lld", ps[k], (long long)zeros, (long long)n);
  }
  tb_free(&x), tb_free(&y), tb_free(&y32), tb_free(&dx), tb_free(&dx32);
}

static void test_add(int64_t n) {
  tb a = TB(n), b = TB(n), y = TB(n), y32 = TB(n);
  tb_rand(&a, 1.0), tb_rand(&b, 1.0);
  tb_round_bf16(&a), tb_round_bf16(&b);
  ct_tensor a16 = tb_cpu16(&a), b16 = tb_cpu16(&b), y16 = tb_cpu16(&y);
  ct_tensor af = tb_cpu(&a), bf = tb_cpu(&b), yf = tb_cpu(&y32);
  CHECK_OK(C_->add(g_cpu, &a16, &b16, CT_ACT_NONE, &y16));
  CHECK_OK(C_->add(g_cpu, &af, &bf, CT_ACT_NONE, &yf));
  CHECK_MSG(diff16(y.h, y32.f, n) == 0, "add bf16 n%lld", (long long)n);
  /* mixed: f32 + bf16 -> bf16 */
  memset(y.h, 0, (size_t)n * 2);
  CHECK_OK(C_->add(g_cpu, &af, &b16, CT_ACT_NONE, &y16));
  CHECK_MSG(diff16(y.h, y32.f, n) == 0, "add f32+bf16 n%lld", (long long)n);
  /* the folded residual ReLU, bf16 against f32 */
  CHECK_OK(C_->add(g_cpu, &a16, &b16, CT_ACT_RELU, &y16));
  CHECK_OK(C_->add(g_cpu, &af, &bf, CT_ACT_RELU, &yf));
  CHECK_MSG(diff16(y.h, y32.f, n) == 0, "add + ReLU bf16 n%lld", (long long)n);
  CHECK_OK(C_->add(g_cpu, &af, &bf, CT_ACT_NONE, &yf));
  /* in place into a */
  CHECK_OK(C_->add(g_cpu, &a16, &b16, CT_ACT_NONE, &a16));
  CHECK_MSG(diff16(a.h, y32.f, n) == 0, "add in place n%lld", (long long)n);
  tb_free(&a), tb_free(&b), tb_free(&y), tb_free(&y32);
}

/* The one-channel weight gradient (dnnl_conv_thin.c) reads bf16 x and dy
 * and writes bf16 dw, db itself where oneDNN has no bf16: bit for bit the
 * f32 run on the same values, rounded once, with beta 0 and 1. K = 13 is
 * one full group of 8 channels and 5 left over. */
static void test_thin_wgrad(void) {
  if (cpu_dnnl_bf16()) {
    printf("thin weight gradient: oneDNN has bf16 here, so bf16 goes to it (see the _avx2 variant)\n");
    return;
  }
  const int64_t N = 3, K = 13, H = 11, W = 9, OH = 9, OW = 7;
  ct_conv2d_params p = {1, 1, 0, 0, 1, 1, 1}; /* stride 1, no padding, 3x3 from dw */
  tb x = TB(N, 1, H, W), dy = TB(N, K, OH, OW), dw = TB(K, 1, 3, 3), db = TB(K), dw32 = TB(K, 1, 3, 3),
     db32 = TB(K);
  tb_rand(&x, 2.0), tb_rand(&dy, 1.0);
  tb_round_bf16(&x), tb_round_bf16(&dy);
  ct_tensor x16 = tb_cpu16(&x), dy16 = tb_cpu16(&dy), dw16 = tb_cpu16(&dw), db16 = tb_cpu16(&db);
  ct_tensor xf = tb_cpu(&x), dyf = tb_cpu(&dy), dwf = tb_cpu(&dw32), dbf = tb_cpu(&db32);
  for (int k = 0; k < 2; k++) { /* beta 0, then 1 onto bf16 starting values */
    tb_rand(&dw, 1.0), tb_rand(&db, 1.0);
    tb_round_bf16(&dw), tb_round_bf16(&db);
    memcpy(dw32.f, dw.f, sizeof(float) * (size_t)dw.n), memcpy(db32.f, db.f, sizeof(float) * (size_t)db.n);
    CHECK_OK(C_->conv2d_bwd_weights(g_cpu, &p, &x16, &dy16, &dw16, &db16, (float)k));
    CHECK_OK(C_->conv2d_bwd_weights(g_cpu, &p, &xf, &dyf, &dwf, &dbf, (float)k));
    CHECK_MSG(diff16(dw.h, dw32.f, dw.n) == 0 && diff16(db.h, db32.f, db.n) == 0,
              "thin weight gradient bf16, beta %d: differs from f32 rounded", k);
  }
  /* bf16 x and dy into f32 dw and db: the f32 run's values exactly. */
  ct_tensor dwo = tb_cpu(&dw), dbo = tb_cpu(&db);
  CHECK_OK(C_->conv2d_bwd_weights(g_cpu, &p, &x16, &dy16, &dwo, &dbo, 0.f));
  CHECK_OK(C_->conv2d_bwd_weights(g_cpu, &p, &xf, &dyf, &dwf, &dbf, 0.f));
  CHECK_MSG(!memcmp(dw.f, dw32.f, sizeof(float) * (size_t)dw.n) && !memcmp(db.f, db32.f, sizeof(float) * (size_t)db.n),
            "thin weight gradient bf16 in, f32 out: differs from f32");
  tb_free(&x), tb_free(&dy), tb_free(&dw), tb_free(&db), tb_free(&dw32), tb_free(&db32);
}

int main(void) {
  cpu_test_setup(41);
  ct_device_set_threads(g_cpu, 2);
  const int64_t sizes[] = {7, 2049, N_BIG};
  for (int i = 0; i < 3; i++) {
    test_act(sizes[i]);
    test_add(sizes[i]);
    test_dropout(sizes[i], 1);
  }
  test_dropout(N_BIG, 13 * 13);
  test_thin_wgrad();
  cpu_test_teardown();
  return test_summary("test_cpu_bf16_native");
}
