/* cuda_conv.c's algorithm fallback when a workspace does not fit, on the
 * CUDA emulator only. With every byte of device memory taken, the three
 * convolution passes, whose first-ranked cuDNN algorithm (the emulator's)
 * needs a workspace, must move on to the next candidate (none needed) and
 * give the reference's results, as PyTorch moves on when an algorithm's
 * workspace allocation fails. Then, with memory free again, the plans keep
 * the candidate that ran (a plan moves on for good).
 *
 * Why not on a GPU: its free memory cannot be pinned below one workspace
 * reliably (cuDNN and lazy kernel loading allocate too), and which
 * algorithms need a workspace is cuDNN's choice. The other fallback, an
 * algorithm cuDNN refuses to run, is emu_test_gpu_layout_first_fails. */
#include "ops/op_buf.h"
#include "unit/test_gpu_common.h"

/* Takes all of the device's free memory; returns the filler. */
static void *fill_memory(void) {
  size_t freeb = 0, total = 0;
  CHECK_OK(G_->mem_info(g_gpu, &freeb, &total));
  void *p = NULL;
  /* The allocator rounds up: step down until one fits. */
  for (size_t b = freeb; b > 0 && !p; b = b > 4096 ? b - 256 : 0) p = ct_device_alloc(g_gpu, b);
  CHECK(p != NULL);
  CHECK_OK(G_->mem_info(g_gpu, &freeb, &total));
  CHECK_MSG(freeb < 4096, "%zu bytes still free", freeb);
  return p;
}

static void passes(const char *when) {
  const ct_conv2d_params p = {1, 1, 1, 1, 1, 1, 1};
  obuf x = OB(g_gpu, 2, 8, 10, 10), w = OB(g_gpu, 16, 8, 3, 3), y = OB(g_gpu, 2, 16, 10, 10);
  obuf dy = OB(g_gpu, 2, 16, 10, 10), dx = OB(g_gpu, 2, 8, 10, 10), dw = OB(g_gpu, 16, 8, 3, 3);
  ob_rand(&x, &g_rng, 1.0, CT_F32), ob_rand(&w, &g_rng, 1.0, CT_F32), ob_rand(&dy, &g_rng, 1.0, CT_F32);
  ct_tensor xg = ob_dev(&x), wg = ob_dev(&w), yg = ob_dev(&y), dyg = ob_dev(&dy), dxg = ob_dev(&dx), dwg = ob_dev(&dw);
  ct_tensor xr = ob_ref(&x), wr = ob_ref(&w), yr = ob_ref(&y), dyr = ob_ref(&dy), dxr = ob_ref(&dx), dwr = ob_ref(&dw);
  CHECK_OK(R_->conv2d_fwd(g_ref, &p, &xr, &wr, NULL, CT_ACT_NONE, &yr));
  CHECK_OK(R_->conv2d_bwd_data(g_ref, &p, &dyr, &wr, &dxr));
  CHECK_OK(R_->conv2d_bwd_weights(g_ref, &p, &xr, &dyr, &dwr, NULL, 0.f));
  void *filler = !strcmp(when, "memory full") ? fill_memory() : NULL;
  CHECK_OK(G_->conv2d_fwd(g_gpu, &p, &xg, &wg, NULL, CT_ACT_NONE, &yg));
  CHECK_OK(G_->conv2d_bwd_data(g_gpu, &p, &dyg, &wg, &dxg));
  CHECK_OK(G_->conv2d_bwd_weights(g_gpu, &p, &xg, &dyg, &dwg, NULL, 0.f));
  CHECK_MSG(ob_err(&y, NULL) <= 1e-5, "%s: forward err %g", when, ob_err(&y, NULL));
  CHECK_MSG(ob_err(&dx, NULL) <= 1e-5, "%s: backward data err %g", when, ob_err(&dx, NULL));
  CHECK_MSG(ob_err(&dw, NULL) <= 1e-5, "%s: backward weights err %g", when, ob_err(&dw, NULL));
  ct_device_free(g_gpu, filler);
  ob_free(&x), ob_free(&w), ob_free(&y), ob_free(&dy), ob_free(&dx), ob_free(&dw);
}

int main(void) {
  unsetenv("CTRAIN_CUDA_TF32"); /* FMA math: the 1e-5 bound */
  gpu_test_setup(31);
  const size_t in_use = ct_device_mem_in_use(g_gpu);
  passes("memory full");
  passes("memory free again");
  /* The second round ran the workspace-free candidates too: the device's
   * scratch buffer was never allocated. */
  CHECK_MSG(ct_device_mem_in_use(g_gpu) == in_use, "%zu bytes in use, %zu before", ct_device_mem_in_use(g_gpu), in_use);
  gpu_test_teardown();
  return test_summary("conv_oom");
}
