/* The batch transform on the host: the CUDA kernel's loop nest
 * (cuda_transform.cu) as plain C, one output pixel at a time through the
 * shared ct_xf_pixel, so it is the reference the GPU is compared with and
 * the CPU test of the kernel's arithmetic (test_transform_shared). */
#include "ctrain/dtype.h"
#include "math/transform_params.h"

void ct_xf_batch_host(const ct_xf_batch *b) {
  const ct_xf_params *p = &b->p;
  const size_t es = ct_dtype_size((ct_dtype)b->dtype);
  int64_t img = (int64_t)p->c * p->h * p->w, per = (int64_t)p->c * p->oh * p->ow;
  for (int64_t i = 0; i < b->n; i++) {
    int64_t row = b->rows ? b->rows[i] : i, sample = b->samples ? b->samples[i] : row;
    int oy, ox, flip;
    ct_xf_draw(p, b->seed, b->epoch, sample, &oy, &ox, &flip);
    if (b->labels && b->labels_out) b->labels_out[i] = b->labels[row];
    const uint8_t *src = b->src + row * img;
    for (int k = 0; k < p->c; k++)
      for (int y = 0; y < p->oh; y++)
        for (int x = 0; x < p->ow; x++) {
          int64_t j = b->nhwc ? ((int64_t)y * p->ow + x) * p->c + k : ((int64_t)k * p->oh + y) * p->ow + x;
          float v = ct_xf_pixel(p, src, k, y, x, oy, ox, flip);
          ct_convert(&v, CT_F32, (char *)b->dst + (size_t)(i * per + j) * es, (ct_dtype)b->dtype, 1);
        }
  }
}
