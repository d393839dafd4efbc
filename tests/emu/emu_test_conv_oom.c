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
  gb x = GB(2, 8, 10, 10), w = GB(16, 8, 3, 3), y = GB(2, 16, 10, 10), dy = GB(2, 16, 10, 10);
  gb dx = GB(2, 8, 10, 10), dw = GB(16, 8, 3, 3);
  gb_rand(&x, 1.0, CT_F32), gb_rand(&w, 1.0, CT_F32), gb_rand(&dy, 1.0, CT_F32);
  ct_tensor xg = gb_gpu(&x), wg = gb_gpu(&w), yg = gb_gpu(&y), dyg = gb_gpu(&dy), dxg = gb_gpu(&dx), dwg = gb_gpu(&dw);
  ct_tensor xr = gb_ref(&x), wr = gb_ref(&w), yr = gb_ref(&y), dyr = gb_ref(&dy), dxr = gb_ref(&dx), dwr = gb_ref(&dw);
  CHECK_OK(R_->conv2d_fwd(g_ref, &p, &xr, &wr, NULL, CT_ACT_NONE, &yr));
  CHECK_OK(R_->conv2d_bwd_data(g_ref, &p, &dyr, &wr, &dxr));
  CHECK_OK(R_->conv2d_bwd_weights(g_ref, &p, &xr, &dyr, &dwr, NULL, 0.f));
  void *filler = !strcmp(when, "memory full") ? fill_memory() : NULL;
  CHECK_OK(G_->conv2d_fwd(g_gpu, &p, &xg, &wg, NULL, CT_ACT_NONE, &yg));
  CHECK_OK(G_->conv2d_bwd_data(g_gpu, &p, &dyg, &wg, &dxg));
  CHECK_OK(G_->conv2d_bwd_weights(g_gpu, &p, &xg, &dyg, &dwg, NULL, 0.f));
  CHECK_MSG(gb_err(&y) <= 1e-5, "%s: forward err %g", when, gb_err(&y));
  CHECK_MSG(gb_err(&dx) <= 1e-5, "%s: backward data err %g", when, gb_err(&dx));
  CHECK_MSG(gb_err(&dw) <= 1e-5, "%s: backward weights err %g", when, gb_err(&dw));
  ct_device_free(g_gpu, filler);
  gb_free(&x), gb_free(&w), gb_free(&y), gb_free(&dy), gb_free(&dx), gb_free(&dw);
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
