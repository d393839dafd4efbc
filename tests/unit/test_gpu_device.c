/* The CUDA device layer: a GPU that is not there is refused with
 * CT_ERR_NO_DEVICE and one line (this part runs everywhere); with a GPU,
 * alloc/copy/sync/free round trips, memory accounting, and an allocation
 * far beyond the GPU's memory failing with a message that names the size,
 * and an unknown CTRAIN_CUDA_CONV_API refused. Without a GPU the rest
 * exits 77 (skipped). */
#include "backend/backend_ops.h"
#include "backend/device_impl.h"
#include "test_gpu_common.h"

int main(void) {
  ct_device *d = NULL;
  /* An index no machine has: refused before anything is allocated. */
  ct_status s = ct_device_open("cuda:1023", &d);
  CHECK(s == CT_ERR_NO_DEVICE && d == NULL);
  const char *msg = ct_last_error();
  CHECK_MSG(strlen(msg) > 10 && !strchr(msg, '\n'), "one-line reason, got '%s'", msg);
  CHECK(ct_device_open("cuda:x", &d) == CT_ERR_INVALID_ARG);
  if (ct_device_open("cuda", &d) != CT_OK) {
    printf("no CUDA device (%s): %d checks so far, %d failed\n", ct_last_error(), test_checks_, test_failures_);
    return test_failures_ ? 1 : 77;
  }
  CHECK(ct_device_get_type(d) == CT_DEVICE_CUDA);
  /* The cuda table keeps backend_ops.h's rules: every required op, the
   * memory and device entries, the groups whole. */
  CHECK_MSG(ct_backend_check(d->backend) == CT_OK, "%s", ct_last_error());
  /* A convolution API the backend does not know is refused, named. */
  const char *api = getenv("CTRAIN_CUDA_CONV_API");
  char *api_keep = api ? strdup(api) : NULL;
  setenv("CTRAIN_CUDA_CONV_API", "graf", 1);
  ct_device *bad = NULL;
  CHECK(ct_device_open("cuda", &bad) == CT_ERR_INVALID_ARG && bad == NULL);
  CHECK_MSG(strstr(ct_last_error(), "CTRAIN_CUDA_CONV_API=graf: expected graph or legacy") != NULL, "message: %s",
            ct_last_error());
  if (api_keep) setenv("CTRAIN_CUDA_CONV_API", api_keep, 1);
  else unsetenv("CTRAIN_CUDA_CONV_API");
  free(api_keep);
  /* round trip through two device buffers (H2D, D2D, D2H) */
  const size_t n = 1000003;
  float *h = malloc(n * 4), *back = malloc(n * 4);
  ct_rng r;
  ct_rng_init(&r, 5, CT_RNG_TEST, 1, 0);
  for (size_t i = 0; i < n; i++) h[i] = (float)ct_rng_normal(&r);
  size_t before = ct_device_mem_in_use(d);
  void *a = ct_device_alloc(d, n * 4), *b = ct_device_alloc(d, n * 4);
  CHECK(a && b);
  CHECK(ct_device_mem_in_use(d) == before + 2 * n * 4);
  CHECK_OK(ct_device_copy(d, a, NULL, h, n * 4));
  CHECK_OK(ct_device_copy(d, b, d, a, n * 4));
  CHECK_OK(ct_device_sync(d));
  memset(back, 0, n * 4);
  CHECK_OK(ct_device_copy(NULL, back, d, b, n * 4));
  CHECK(memcmp(h, back, n * 4) == 0);
  ct_device_free(d, a);
  ct_device_free(d, b);
  CHECK(ct_device_mem_in_use(d) == before);
  CHECK(ct_device_mem_peak(d) >= before + 2 * n * 4);
  /* 1 PiB: refused with the size in the message */
  void *huge = ct_device_alloc(d, (size_t)1 << 50);
  CHECK(huge == NULL);
  CHECK_MSG(strstr(ct_last_error(), "1125899906842624") != NULL, "message: %s", ct_last_error());
  if (huge) ct_device_free(d, huge);
  /* the device still works after the failure */
  void *c = ct_device_alloc(d, 64);
  CHECK(c != NULL);
  ct_device_free(d, c);
  free(h);
  free(back);
  ct_device_close(d);
  return test_summary("test_gpu_device");
}
