/* The parts of the CPU backend that do not need oneDNN: the per-device
 * state's lifetime, op entry/exit (device lock and thread count), the
 * plain-layout guard of the reference fallbacks, and gradient
 * accumulation. A build without oneDNN keeps this file and drops dnnl_*.c. */
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu_impl.h"

ct_status cpu_dev_open(ct_device *d) {
  cpu_dev *cd = calloc(1, sizeof *cd);
  if (!cd) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate device state", d->name);
#if CTRAIN_HAVE_DNNL
  ct_status s = cpu_dnnl_open(cd, d->name);
  if (s != CT_OK) {
    free(cd);
    return s;
  }
#endif
  pthread_mutex_init(&cd->mu, NULL);
  d->impl = cd;
  return CT_OK;
}

void cpu_dev_close(ct_device *d) {
  cpu_dev *cd = cpu_dev_of(d);
  if (!cd) return;
#if CTRAIN_HAVE_DNNL
  cpu_dnnl_close(cd);
#endif
  pthread_mutex_destroy(&cd->mu);
  free(cd);
  d->impl = NULL;
}

int cpu_op_begin(ct_device *d) {
  pthread_mutex_lock(&cpu_dev_of(d)->mu);
  int prev = omp_get_max_threads();
  if (d->threads > 0 && d->threads != prev) omp_set_num_threads(d->threads);
  return prev;
}

void cpu_op_end(ct_device *d, int prev_threads) {
  if (omp_get_max_threads() != prev_threads) omp_set_num_threads(prev_threads);
  pthread_mutex_unlock(&cpu_dev_of(d)->mu);
}

static int laid_out_f32(const ct_tensor *t) {
  return t && t->layout != CT_LAYOUT_PLAIN && t->dtype != CT_BF16 && t->dtype != CT_F16;
}

ct_status cpu_need_plain(const ct_tensor *a, const ct_tensor *b, const char *what) {
  if (laid_out_f32(a) || laid_out_f32(b))
    return ct_error(CT_ERR_UNSUPPORTED, "%s: C16, C8 and NHWC f32 tensors need the oneDNN path", what);
  return CT_OK;
}

void cpu_accumulate_f32(void *dst, ct_dtype dt, const float *src, int64_t n, float beta) {
  if (dt == CT_F32) {
    float *o = dst;
    if (beta == 0.f) {
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; i++) o[i] = src[i];
    } else {
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; i++) o[i] = beta * o[i] + src[i];
    }
  } else {
    uint16_t *o = dst;
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; i++)
      o[i] = ct_f32_to_bf16(beta == 0.f ? src[i] : beta * ct_bf16_to_f32(o[i]) + src[i]);
  }
}
