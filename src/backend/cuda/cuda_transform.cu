/* The batch transform on the GPU (DALI-like): uint8 images in device
 * memory -> the batch the model takes (f32 NCHW, or the 16-bit
 * channels-last input of a narrowed model), with the CPU loader's semantics
 * per sample. All arithmetic is src/math/transform_params.h, the lines
 * ct_transform_apply and ct_xf_batch_host run on the host.
 *
 * Launch: grid.y walks samples (in chunks of 65535, the y limit), grid.x
 * covers one sample's c*oh*ow outputs with a grid-stride loop. Thread 0 of
 * each block derives the sample's crop/flip draw (one Philox block) into
 * shared memory, so the draw is made once per block rather than per
 * pixel. Output writes are coalesced (consecutive threads, consecutive x);
 * reads are gathers from the 4 bilinear taps, which hit L1/L2 for the
 * small images this is for. */
#include "backend/cuda/cuda_common.cuh"
#include "math/transform_params.h"

#define STREAM(d) cuda_stream(d)

__global__ void k_transform_u8(ct_xf_batch b, int64_t first) {
  const int64_t i = first + blockIdx.y;
  if (i >= b.n) return;
  __shared__ int draw[3];
  const int64_t row = b.rows ? b.rows[i] : i;
  if (threadIdx.x == 0) {
    const int64_t sample = b.samples ? b.samples[i] : row;
    ct_xf_draw(&b.p, b.seed, b.epoch, sample, &draw[0], &draw[1], &draw[2]);
    if (blockIdx.x == 0 && b.labels && b.labels_out) b.labels_out[i] = b.labels[row];
  }
  __syncthreads();
  const int oy = draw[0], ox = draw[1], flip = draw[2];
  const int64_t plane = (int64_t)b.p.oh * b.p.ow, per = (int64_t)b.p.c * plane;
  const uint8_t *img = b.src + row * ((int64_t)b.p.c * b.p.h * b.p.w);
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < per; j += (int64_t)gridDim.x * blockDim.x) {
    int k, y, x;
    if (b.nhwc) {
      /* j = (y * ow + x) * c + k: channels fastest, writes still in j order */
      int64_t pix = j / b.p.c;
      k = (int)(j - pix * b.p.c);
      y = (int)(pix / b.p.ow), x = (int)(pix - (int64_t)y * b.p.ow);
    } else {
      k = (int)(j / plane);
      int64_t r = j - (int64_t)k * plane;
      y = (int)(r / b.p.ow), x = (int)(r - (int64_t)y * b.p.ow);
    }
    ct_st(b.dst, b.dtype, i * per + j, ct_xf_pixel(&b.p, img, k, y, x, oy, ox, flip));
  }
}

extern "C" ct_status cuda_transform_u8(ct_device *d, const ct_xf_batch *b) {
  if (b->p.c < 1 || b->p.c > CT_XF_MAX_CHANNELS || b->p.oh < 1 || b->p.ow < 1 || !b->src || !b->dst ||
      !cuda_float_dtype((ct_dtype)b->dtype))
    return ct_error(CT_ERR_INVALID_ARG, "cuda transform_u8: bad batch (c=%d, output %dx%d, src %p, dst %p, dtype %d)",
                    b->p.c, b->p.oh, b->p.ow, (const void *)b->src, (void *)b->dst, (int)b->dtype);
  if (b->n <= 0) return CT_OK;
  CT_TRY(cuda_enter(d));
  int64_t per = (int64_t)b->p.c * b->p.oh * b->p.ow;
  /* Enough x-blocks for one sample's outputs, capped: the batch dimension
   * already supplies parallelism. */
  unsigned bx = ct_blocks(per);
  if (bx > 64) bx = 64;
  for (int64_t first = 0; first < b->n; first += 65535) {
    int64_t left = b->n - first;
    dim3 grid(bx, (unsigned)(left < 65535 ? left : 65535));
    k_transform_u8<<<grid, CT_THREADS, 0, STREAM(d)>>>(*b, first);
    CUDA_LAUNCHED("transform_u8");
  }
  return CT_OK;
}
