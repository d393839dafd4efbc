/* The cpu backend's own max pooling loops against the reference backend
 * in f32 and bf16 (the reference widens bf16 to f32 and rounds back):
 * non-overlapping windows (kernel == stride, no padding:
 * src/backend/cpu/cpu_maxpool_tiles.c) and any other window on plain NCHW
 * (overlapping, padded, ceil_mode: cpu_maxpool_windows.c; on AVX2 eight
 * planes at a time through transposed tiles), and any window
 * on C8 (nChw8c) tensors, f32, where the channel count allows, also
 * from a C8 x to a plain y where the backend pools into plain
 * (cpu_maxpool_windows.c; compared after converting back). Outputs and
 * input gradients must be equal bit for bit, including ties (inputs
 * quantised to a few levels, so many windows hold equal maxima: the first
 * must win), NaN (wins) and -inf, inputs under several windows (their
 * gradients summed as the reference sums them), and sizes with a border no
 * window covers (its gradient must be 0 even when dx held garbage). The
 * workspace size tells a fast path was taken. */
#include "backend/backend.h"
#include "test_util.h"

typedef struct pcase {
  int64_t N, C, H, W;
  int kh, kw, sh, sw, ph, pw, ceil;
} pcase;

static const pcase cases[] = {
    {3, 5, 9, 9, 2, 2, 2, 2, 0, 0, 0},    /* odd: last row/column uncovered */
    {4, 32, 26, 26, 2, 2, 2, 2, 0, 0, 0}, /* torchkeras CNN's first pool */
    {2, 4, 16, 16, 2, 2, 2, 2, 0, 0, 0},  /* rows of whole vectors (8 and 16 windows) */
    {2, 3, 33, 35, 2, 2, 2, 2, 0, 0, 0},  /* 17 windows a row, odd sizes */
    {2, 3, 10, 11, 3, 2, 3, 2, 0, 0, 0},  /* rectangular window, generic loop */
    {1, 2, 7, 7, 3, 3, 3, 3, 0, 0, 0},
    {2, 2, 4, 6, 1, 3, 1, 3, 0, 0, 0},
    /* overlapping and padded windows */
    {2, 8, 16, 16, 3, 3, 2, 2, 1, 1, 0},  /* ResNet's stem pool */
    {3, 4, 9, 7, 3, 3, 2, 2, 1, 1, 1},    /* ceil_mode: the last window overhangs */
    {2, 3, 6, 8, 3, 2, 1, 1, 1, 0, 0},    /* stride 1 (every input under several windows) */
    {1, 5, 5, 5, 2, 2, 2, 2, 1, 1, 0},    /* non-overlapping but padded */
    {2, 2, 11, 5, 5, 3, 3, 2, 2, 1, 1},
    {2, 16, 9, 7, 3, 3, 2, 2, 1, 1, 1},  /* C8 below: two blocks, overlapping, ceil_mode */
    {3, 8, 6, 10, 2, 3, 2, 1, 0, 1, 0},  /* C8: stride 1 across the width */
    {2, 4, 1, 1, 3, 3, 2, 2, 1, 1, 0},    /* a 1x1 map */
    /* plain planes go eight at a time through transposed tiles (AVX2):
     * groups, planes left over, and maps whose size is no multiple of 8 */
    {2, 9, 27, 27, 3, 3, 2, 2, 0, 0, 0},  /* AlexNet's pools: 2 groups + 2 planes */
};

/* PyTorch's output extent. */
static int64_t out_extent(int64_t n, int k, int s, int p, int ceil) {
  int64_t o = (n + 2 * p - k + (ceil ? s - 1 : 0)) / s + 1;
  if (ceil && (o - 1) * s >= n + p) o--;
  return o;
}

/* Plain NCHW <-> C8 ([N][C/8][HW][8]), elements of es bytes. */
static void relayout(const void *src, void *dst, size_t es, int64_t N, int64_t C, int64_t HW, int to_c8) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t q = 0; q < HW; q++) {
        const int64_t pl = (n * C + c) * HW + q, b8 = ((n * (C / 8) + c / 8) * HW + q) * 8 + c % 8;
        memcpy((char *)dst + (size_t)(to_c8 ? b8 : pl) * es, (const char *)src + (size_t)(to_c8 ? pl : b8) * es, es);
      }
}

/* c8: 0 all plain; 1 all C8; 2 x and dx C8, y and dy plain (the AVX2
 * cpu's maxpool_to_plain). */
static void one(ct_device *cpu, ct_device *ref, const pcase *c, uint64_t seed, ct_dtype dt, int c8) {
  const ct_backend *C = ct_device_backend(cpu), *R = ct_device_backend(ref);
  ct_pool2d_params p = {c->kh, c->kw, c->sh, c->sw, c->ph, c->pw, c->ceil, 1};
  int64_t OH = out_extent(c->H, c->kh, c->sh, c->ph, c->ceil), OW = out_extent(c->W, c->kw, c->sw, c->pw, c->ceil);
  char nm[96];
  snprintf(nm, sizeof nm, "%s%s k%dx%d s%d,%d p%d,%d ceil%d %lldx%lld", ct_dtype_name(dt),
           c8 == 2 ? " C8 to plain" : c8 ? " C8" : "", c->kh,
           c->kw, c->sh, c->sw, c->ph, c->pw, c->ceil, (long long)c->H, (long long)c->W);
  int64_t nx = c->N * c->C * c->H * c->W, ny = c->N * c->C * OH * OW;
  const size_t es = ct_dtype_size(dt);
  float *x = malloc(sizeof(float) * (size_t)nx), *dy = malloc(sizeof(float) * (size_t)ny);
  float *y1 = malloc(sizeof(float) * (size_t)ny), *y2 = malloc(sizeof(float) * (size_t)ny);
  float *dx1 = malloc(sizeof(float) * (size_t)nx), *dx2 = malloc(sizeof(float) * (size_t)nx);
  void *xh = malloc(es * (size_t)nx), *dyh = malloc(es * (size_t)ny), *y1h = malloc(es * (size_t)ny);
  void *y2h = malloc(es * (size_t)ny), *dx1h = malloc(es * (size_t)nx), *dx2h = malloc(es * (size_t)nx);
  for (int64_t i = 0; i < nx; i++) {
    float u = ct_rng_uniform_at(seed, 7, 1, 0, (uint64_t)i);
    x[i] = (float)((int)(u * 5.0f) - 2); /* 5 levels: many ties */
    if (i % 97 == 13) x[i] = NAN;
    if (i % 89 == 5) x[i] = -INFINITY;
    dx1[i] = dx2[i] = 12345.0f; /* garbage the backward must overwrite */
  }
  for (int64_t i = 0; i < ny; i++) dy[i] = 2.0f * ct_rng_uniform_at(seed, 7, 2, 0, (uint64_t)i) - 1.0f;
  ct_convert(x, CT_F32, xh, dt, (size_t)nx);
  ct_convert(dy, CT_F32, dyh, dt, (size_t)ny);
  ct_convert(dx1, CT_F32, dx1h, dt, (size_t)nx);
  ct_convert(dx2, CT_F32, dx2h, dt, (size_t)nx);
  ct_tensor xt = ct_tensor_4d(xh, dt, c->N, c->C, c->H, c->W), yt1 = ct_tensor_4d(y1h, dt, c->N, c->C, OH, OW);
  ct_tensor yt2 = yt1, dyt = yt1, dxt1 = xt, dxt2 = xt, xr = xt;
  yt2.data = y2h, dyt.data = dyh, dxt1.data = dx1h, dxt2.data = dx2h;
  xt.device = yt1.device = dxt1.device = cpu;
  ct_tensor dyc = dyt, dyr = dyt;
  dyc.device = cpu, dyr.device = ref;
  xr.device = yt2.device = dxt2.device = ref;
  /* C8: the cpu side gets laid-out copies (outputs converted back below). */
  void *x8 = NULL, *y8 = NULL, *dy8 = NULL, *dx8 = NULL;
  const int64_t HW = c->H * c->W, OHW = OH * OW;
  if (c8) {
    x8 = malloc(es * (size_t)nx), y8 = malloc(es * (size_t)ny), dy8 = malloc(es * (size_t)ny);
    dx8 = malloc(es * (size_t)nx);
    relayout(xh, x8, es, c->N, c->C, HW, 1);
    relayout(dyh, dy8, es, c->N, c->C, OHW, 1);
    relayout(dx1h, dx8, es, c->N, c->C, HW, 1);
    xt.data = x8, dxt1.data = dx8;
    xt.layout = dxt1.layout = CT_LAYOUT_C8;
    if (c8 == 1) {
      yt1.data = y8, dyc.data = dy8;
      yt1.layout = dyc.layout = CT_LAYOUT_C8;
    }
  }
  size_t wsb = C->maxpool2d_workspace_bytes(cpu, &p, &xt, &yt1);
  CHECK_MSG(wsb == (size_t)ny, "%s: workspace %zu bytes, a fast path expects %lld", nm, wsb, (long long)ny);
  void *ws1 = malloc(wsb + 1), *ws2 = malloc(R->maxpool2d_workspace_bytes(ref, &p, &xr, &yt2) + 1);
  CHECK_OK(C->maxpool2d_fwd(cpu, &p, &xt, &yt1, ws1));
  CHECK_OK(R->maxpool2d_fwd(ref, &p, &xr, &yt2, ws2));
  CHECK_OK(C->maxpool2d_bwd(cpu, &p, &dyc, ws1, &dxt1));
  CHECK_OK(R->maxpool2d_bwd(ref, &p, &dyr, ws2, &dxt2));
  if (c8 == 1) relayout(y8, y1h, es, c->N, c->C, OHW, 0);
  if (c8) relayout(dx8, dx1h, es, c->N, c->C, HW, 0);
  ct_convert(y1h, dt, y1, CT_F32, (size_t)ny);
  ct_convert(y2h, dt, y2, CT_F32, (size_t)ny);
  ct_convert(dx1h, dt, dx1, CT_F32, (size_t)nx);
  ct_convert(dx2h, dt, dx2, CT_F32, (size_t)nx);
  int64_t bad_y = 0, bad_dx = 0, nans = 0;
  for (int64_t i = 0; i < ny; i++) {
    nans += isnan(y2[i]);
    bad_y += memcmp(&y1[i], &y2[i], sizeof(float)) != 0 && !(isnan(y1[i]) && isnan(y2[i]));
  }
  for (int64_t i = 0; i < nx; i++) bad_dx += memcmp(&dx1[i], &dx2[i], sizeof(float)) != 0;
  CHECK_MSG(bad_y == 0, "%s: %lld outputs differ from the reference", nm, (long long)bad_y);
  CHECK_MSG(bad_dx == 0, "%s: %lld input gradients differ from the reference", nm, (long long)bad_dx);
  CHECK_MSG(nans > 0 || ny < 20, "%s: no NaN reached an output; the NaN rule went untested", nm);
  /* Inference (no workspace) gives the same output. */
  CHECK_OK(C->maxpool2d_fwd(cpu, &p, &xt, &yt1, NULL));
  if (c8 == 1) relayout(y8, y1h, es, c->N, c->C, OHW, 0);
  ct_convert(y1h, dt, y1, CT_F32, (size_t)ny);
  for (int64_t i = 0; i < ny; i++) bad_y += memcmp(&y1[i], &y2[i], sizeof(float)) != 0 && !(isnan(y1[i]) && isnan(y2[i]));
  CHECK_MSG(bad_y == 0, "%s: inference output differs", nm);
  free(x), free(dy), free(y1), free(y2), free(dx1), free(dx2), free(ws1), free(ws2);
  free(xh), free(dyh), free(y1h), free(y2h), free(dx1h), free(dx2h);
  free(x8), free(y8), free(dy8), free(dx8);
}

int main(void) {
#if !CTRAIN_HAVE_DNNL
  fprintf(stderr, "built without oneDNN: the cpu max pool is the reference's (its workspace is not the fast path's): skipping\n");
  return 77;
#endif
  ct_device *cpu, *ref;
  if (ct_device_open("cpu", &cpu) != CT_OK || ct_device_open("ref", &ref) != CT_OK) {
    fprintf(stderr, "%s\n", ct_last_error());
    return 1;
  }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    one(cpu, ref, &cases[i], 100 + i, CT_F32, 0);
    one(cpu, ref, &cases[i], 200 + i, CT_BF16, 0);
    if (cases[i].C % 8 == 0) one(cpu, ref, &cases[i], 300 + i, CT_F32, 1);
    if (cases[i].C % 8 == 0 && ct_device_backend(cpu)->maxpool_to_plain >> CT_LAYOUT_C8 & 1u)
      one(cpu, ref, &cases[i], 400 + i, CT_F32, 2);
  }
  ct_device_close(cpu);
  ct_device_close(ref);
  return test_summary("cpu_maxpool_fast");
}
