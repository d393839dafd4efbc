/* The cpu backend's primitive cache: a repeated op with the same shapes
 * creates nothing new (and still computes the right thing on new data),
 * new shapes add entries, and a device with its own thread count gives
 * the same results. */
#include "backend/cpu/cpu_impl.h"
#include "test_cpu_common.h"

#if !CTRAIN_HAVE_DNNL
/* Built without oneDNN there is no primitive cache to test. */
int main(void) {
  fprintf(stderr, "test_cpu_cache: built without oneDNN (no primitive cache): skipping\n");
  return 77;
}
#else

static size_t entries(ct_device *d) { return cpu_dev_of(d)->entries; }

static void conv_step(ct_device *dev, tb *x, tb *w, tb *b, tb *y, tb *dy, tb *dx, tb *dw, tb *db) {
  ct_conv2d_params p = {1, 1, 1, 1, 1, 1, 1};
  ct_tensor xc = tb_cpu(x), wc = tb_cpu(w), bc = tb_cpu(b), yc = tb_cpu(y), dyc = tb_cpu(dy), dxc = tb_cpu(dx);
  ct_tensor dwc = tb_cpu(dw), dbc = tb_cpu(db);
  const ct_backend *be = ct_device_backend(dev);
  CHECK_OK(be->conv2d_fwd(dev, &p, &xc, &wc, &bc, CT_ACT_RELU, &yc));
  CHECK_OK(be->conv2d_bwd_data(dev, &p, &dyc, &wc, &dxc));
  CHECK_OK(be->conv2d_bwd_weights(dev, &p, &xc, &dyc, &dwc, &dbc, 0.f));
  ct_tensor l = ct_tensor_2d(x->f, CT_F32, 6, 100), lw = ct_tensor_2d(dy->f, CT_F32, 4, 100);
  ct_tensor ly = ct_tensor_2d(y->f, CT_F32, 6, 4);
  CHECK_OK(be->linear_fwd(dev, &l, &lw, NULL, CT_ACT_NONE, &ly));
}

int main(void) {
  cpu_test_setup(3);
  tb x = TB(2, 3, 10, 10), w = TB(4, 3, 3, 3), b = TB(4), y = TB(2, 4, 10, 10), dy = TB(2, 4, 10, 10);
  tb dx = TB(2, 3, 10, 10), dw = TB(4, 3, 3, 3), db = TB(4);
  tb_rand(&x, 1), tb_rand(&w, 1), tb_rand(&b, 1), tb_rand(&dy, 1);
  conv_step(g_cpu, &x, &w, &b, &y, &dy, &dx, &dw, &db);
  size_t n1 = entries(g_cpu);
  CHECK(n1 >= 4);
  /* same shapes, new values: no new entries, and the results follow the
   * new data (the cached memory objects are re-pointed, not stale) */
  tb_rand(&x, 1);
  tb y2 = TB(2, 4, 10, 10);
  conv_step(g_cpu, &x, &w, &b, &y2, &dy, &dx, &dw, &db);
  CHECK(entries(g_cpu) == n1);
  ct_conv2d_params p = {1, 1, 1, 1, 1, 1, 1};
  ct_tensor xr = tb_ref(&x), wr = tb_ref(&w), br = tb_ref(&b), yr = tb_ref(&y2);
  CHECK_OK(R_->conv2d_fwd(g_ref, &p, &xr, &wr, &br, CT_ACT_RELU, &yr));
  /* y2 was overwritten by the linear op in conv_step; recompute conv only */
  ct_tensor xc = tb_cpu(&x), wc = tb_cpu(&w), bc = tb_cpu(&b), yc = tb_cpu(&y2);
  CHECK_OK(C_->conv2d_fwd(g_cpu, &p, &xc, &wc, &bc, CT_ACT_RELU, &yc));
  CHECK(entries(g_cpu) == n1);
  CHECK_MSG(tb_err(&y2) <= 1e-5, "cached conv on new data: err %g", tb_err(&y2));
  /* a new shape adds an entry */
  tb x3 = TB(1, 3, 10, 10), y3 = TB(1, 4, 10, 10);
  tb_rand(&x3, 1);
  ct_tensor x3c = tb_cpu(&x3), y3c = tb_cpu(&y3);
  CHECK_OK(C_->conv2d_fwd(g_cpu, &p, &x3c, &wc, &bc, CT_ACT_RELU, &y3c));
  CHECK(entries(g_cpu) == n1 + 1);
  /* a one-thread device computes the same conv */
  ct_device *d1;
  CHECK_OK(ct_device_open("cpu", &d1));
  ct_device_set_threads(d1, 1);
  tb y4 = TB(2, 4, 10, 10);
  ct_tensor y4c = tb_cpu(&y4);
  CHECK_OK(C_->conv2d_fwd(d1, &p, &xc, &wc, &bc, CT_ACT_RELU, &y4c));
  double e = 0;
  for (int64_t i = 0; i < y4.n; i++) e = fmax(e, fabs(y4.f[i] - y2.f[i]));
  CHECK_MSG(e <= 1e-5, "1-thread conv differs by %g", e);
  ct_device_close(d1);
  /* unsupported dtype: a clear error, not a crash */
  int32_t junk[4] = {1, 2, 3, 4};
  ct_tensor ji = ct_tensor_2d(junk, CT_I32, 2, 2), jo = ct_tensor_2d(junk, CT_I32, 2, 2);
  ct_status s = C_->matmul(g_cpu, 0, 0, &ji, &ji, 1.f, 0.f, &jo);
  CHECK(s != CT_OK && strlen(ct_last_error()) > 0);
  tb_free(&x), tb_free(&w), tb_free(&b), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&dw), tb_free(&db);
  tb_free(&y2), tb_free(&x3), tb_free(&y3), tb_free(&y4);
  cpu_test_teardown();
  return test_summary("test_cpu_cache");
}
#endif
