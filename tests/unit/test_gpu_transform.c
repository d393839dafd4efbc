/* The GPU data path against the CPU transform (label gpu; exit 77, ctest
 * "Skipped", without a CUDA device):
 *  - the backend's transform_u8 (cuda_transform.cu) on random uint8
 *    images, with row gathers, sample keys and label gathers, against
 *    ct_transform_apply per image, for resize up/down, padded crop, flip,
 *    ToFloat on/off, Normalize, 1-4 channels; and its 16-bit outputs
 *    (bf16 channels-last, f16 NCHW) against the f32 output rounded;
 *  - ct_gpu_data in both modes (raw uint8 batches through pinned loader
 *    buffers, and the whole split resident with on-device gathers by the
 *    epoch order), staged two batches at a time (raw ones in slots 0 and
 *    1) over two shuffled epochs, against the float loader's batches.
 * Bitwise: the kernel runs the same lines as the CPU (transform_params.h),
 * every multiply-add is an explicit fmaf, divisions are IEEE (no
 * --use_fast_math), so there is nothing left to round differently. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ctrain/ctrain.h"
#include "data/gpu_data.h"
#include "math/transform_params.h"
#include "test_util.h"

static ct_device *gpu;
static const ct_backend *G;
static ct_rng g;

static void *dev_upload(const void *src, size_t bytes) {
  void *d = ct_device_alloc(gpu, bytes ? bytes : 1);
  if (d && bytes) CHECK_OK(ct_device_copy(gpu, d, NULL, src, bytes));
  return d;
}

/* One transform_u8 call over n outputs from nimg images; returns the
 * number of output images that differ from ct_transform_apply. */
static int run_case(const ct_transform *t, int c, int h, int w, int64_t nimg, int64_t n, int gather, const char *what) {
  int oh, ow;
  if (ct_transform_check(t, c, h, w, &oh, &ow) != CT_OK) {
    CHECK_MSG(0, "%s: %s", what, ct_last_error());
    return 1;
  }
  size_t img = (size_t)c * h * w, per = (size_t)c * oh * ow;
  if (!gather) nimg = n;
  uint8_t *px = malloc(img * (size_t)nimg);
  for (size_t i = 0; i < img * (size_t)nimg; i++) px[i] = (uint8_t)ct_rng_u32(&g);
  int64_t *rows = malloc((size_t)n * 8), *samples = malloc((size_t)n * 8), *labels = malloc((size_t)nimg * 8),
          *lout = malloc((size_t)n * 8);
  for (int64_t i = 0; i < nimg; i++) labels[i] = (int64_t)ct_rng_below(&g, 100);
  for (int64_t i = 0; i < n; i++) {
    rows[i] = gather ? (int64_t)ct_rng_below(&g, (uint32_t)nimg) : i;
    samples[i] = gather ? (int64_t)ct_rng_below(&g, 1u << 20) : rows[i];
  }
  ct_xf_batch b;
  memset(&b, 0, sizeof b);
  ct_xf_params_from(t, c, h, w, &b.p);
  b.n = n, b.seed = 1234, b.epoch = 3;
  b.src = dev_upload(px, img * (size_t)nimg);
  b.rows = gather ? dev_upload(rows, (size_t)n * 8) : NULL;
  b.samples = gather ? dev_upload(samples, (size_t)n * 8) : NULL;
  b.labels = gather ? dev_upload(labels, (size_t)nimg * 8) : NULL;
  b.labels_out = gather ? ct_device_alloc(gpu, (size_t)n * 8) : NULL;
  b.dst = ct_device_alloc(gpu, per * (size_t)n * 4);
  float *got = malloc(per * (size_t)n * 4), *want = malloc(per * 4);
  int bad = 0;
  CHECK_OK(G->transform_u8(gpu, &b));
  CHECK_OK(ct_device_copy(NULL, got, gpu, b.dst, per * (size_t)n * 4));
  if (gather) CHECK_OK(ct_device_copy(NULL, lout, gpu, b.labels_out, (size_t)n * 8));
  for (int64_t i = 0; i < n; i++) {
    ct_transform_apply(t, px + (size_t)rows[i] * img, c, h, w, 1234, 3, samples[i], want);
    if (memcmp(want, got + (size_t)i * per, per * 4)) {
      if (bad++ < 3) {
        size_t j = 0;
        while (j < per && !memcmp(&want[j], &got[(size_t)i * per + j], 4)) j++;
        fprintf(stderr, "%s: image %lld value %zu: gpu %.9g, cpu %.9g\n", what, (long long)i, j,
                (double)got[(size_t)i * per + j], (double)want[j]);
      }
    }
    if (gather) CHECK(lout[i] == labels[rows[i]]);
  }
  /* The narrowed input (ct_model_narrow_input): bf16 channels-last and
   * f16 NCHW, each value the f32 output rounded once. */
  uint16_t *got16 = malloc(per * (size_t)n * 2);
  for (int v = 0; v < 2; v++) {
    b.dtype = v ? CT_F16 : CT_BF16, b.nhwc = !v;
    CHECK_OK(G->transform_u8(gpu, &b));
    CHECK_OK(ct_device_copy(NULL, got16, gpu, b.dst, per * (size_t)n * 2));
    int64_t plane = (int64_t)oh * ow, off16 = 0;
    for (int64_t i = 0; i < n && !off16; i++)
      for (int64_t j = 0; j < (int64_t)per && !off16; j++) {
        int64_t k = j / plane, yx = j % plane, at = b.nhwc ? yx * c + k : j;
        float f = got[(size_t)i * per + (size_t)j];
        uint16_t w16 = v ? ct_f32_to_f16(f) : ct_f32_to_bf16(f);
        if (got16[(size_t)i * per + (size_t)at] != w16) off16 = 1 + i * (int64_t)per + j;
      }
    CHECK_MSG(!off16, "%s: %s output differs at value %lld", what, v ? "f16 NCHW" : "bf16 NHWC", (long long)off16 - 1);
    bad += off16 != 0;
  }
  free(got16);
  ct_device_free(gpu, (void *)b.src);
  ct_device_free(gpu, (void *)b.rows);
  ct_device_free(gpu, (void *)b.samples);
  ct_device_free(gpu, (void *)b.labels);
  ct_device_free(gpu, b.labels_out);
  ct_device_free(gpu, b.dst);
  free(px), free(rows), free(samples), free(labels), free(lout), free(got), free(want);
  return bad;
}

static void test_kernel(void) {
  struct {
    const char *name;
    int c, h, w, rh, rw, ch, cw, pad, norm, to_float;
    float flip;
    int64_t n;
  } cs[] = {
      {"AlexNet: 28 -> 227, flip, normalize", 1, 28, 28, 227, 227, 0, 0, 0, 1, 1, 0.5f, 70},
      {"resize down 64x48 -> 20x13", 3, 64, 48, 20, 13, 0, 0, 0, 1, 1, 0.0f, 33},
      {"CIFAR crop 32 pad 4 + flip + normalize", 3, 32, 32, 0, 0, 32, 32, 4, 1, 1, 0.5f, 257},
      {"resize 40 -> 36, crop 32 pad 2, flip p=0.3", 3, 40, 40, 36, 36, 32, 32, 2, 0, 1, 0.3f, 64},
      {"raw 0..255, 4 channels, crop + flip", 4, 17, 23, 0, 0, 15, 20, 3, 0, 0, 1.0f, 9},
      {"ToFloat only", 1, 28, 28, 0, 0, 0, 0, 0, 0, 1, 0.0f, 128},
  };
  for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++)
    for (int gather = 0; gather < 2; gather++) {
      ct_transform t;
      ct_transform_default(&t);
      t.resize_h = cs[k].rh, t.resize_w = cs[k].rw, t.crop_h = cs[k].ch, t.crop_w = cs[k].cw;
      t.crop_padding = cs[k].pad, t.hflip_p = cs[k].flip, t.to_float = cs[k].to_float, t.normalize = cs[k].norm;
      for (int j = 0; j < cs[k].c; j++) t.mean[j] = 0.2f + 0.1f * j, t.std[j] = 0.3f + 0.05f * j;
      int bad = run_case(&t, cs[k].c, cs[k].h, cs[k].w, 11, cs[k].n, gather, cs[k].name);
      CHECK_MSG(bad == 0, "%s (gather %d): %d of %lld images differ", cs[k].name, gather, bad, (long long)cs[k].n);
    }
  /* Random configurations. */
  int bad = 0;
  for (int it = 0; it < 60; it++) {
    int c = 1 + (int)ct_rng_below(&g, 4), h = 1 + (int)ct_rng_below(&g, 50), w = 1 + (int)ct_rng_below(&g, 50);
    ct_transform t;
    ct_transform_default(&t);
    if (ct_rng_below(&g, 3)) t.resize_h = 1 + (int)ct_rng_below(&g, 80), t.resize_w = 1 + (int)ct_rng_below(&g, 80);
    int rh = t.resize_h ? t.resize_h : h, rw = t.resize_w ? t.resize_w : w;
    if (ct_rng_below(&g, 2)) {
      t.crop_padding = (int)ct_rng_below(&g, 5);
      t.crop_h = 1 + (int)ct_rng_below(&g, (uint32_t)(rh + 2 * t.crop_padding));
      t.crop_w = 1 + (int)ct_rng_below(&g, (uint32_t)(rw + 2 * t.crop_padding));
    }
    if (ct_rng_below(&g, 2)) t.hflip_p = ct_rng_uniform(&g);
    t.to_float = (int)ct_rng_below(&g, 4) != 0;
    if ((t.normalize = (int)ct_rng_below(&g, 2)))
      for (int k = 0; k < c; k++) t.mean[k] = ct_rng_uniform(&g), t.std[k] = 0.05f + ct_rng_uniform(&g);
    bad += run_case(&t, c, h, w, 7, 1 + ct_rng_below(&g, 40), (int)ct_rng_below(&g, 2), "random");
  }
  CHECK_MSG(bad == 0, "random configurations: %d images differ", bad);
}

static void *pinned_alloc(void *ctx, size_t bytes) { return G->host_alloc(ctx, bytes); }
static void pinned_free(void *ctx, void *p) { G->host_free(ctx, p); }

static void test_gpu_data(void) {
  int64_t n = 301;
  int c = 3, h = 20, w = 17;
  uint8_t *px = malloc((size_t)n * c * h * w);
  int64_t *labels = malloc((size_t)n * 8);
  for (size_t i = 0; i < (size_t)n * c * h * w; i++) px[i] = (uint8_t)ct_rng_u32(&g);
  for (int64_t i = 0; i < n; i++) labels[i] = (int64_t)ct_rng_below(&g, 10);
  ct_dataset *ds;
  CHECK_OK(ct_dataset_from_memory("rand", n, c, h, w, 10, px, labels, &ds));
  ct_loader_options o;
  ct_loader_options_default(&o);
  o.batch_size = 32, o.shuffle = 1, o.workers = 2, o.seed = 77;
  o.transform.resize_h = 24, o.transform.resize_w = 24;
  o.transform.crop_h = 22, o.transform.crop_w = 22, o.transform.crop_padding = 3, o.transform.hflip_p = 0.5f;
  o.transform.normalize = 1;
  for (int k = 0; k < 3; k++) o.transform.mean[k] = 0.5f - 0.1f * k, o.transform.std[k] = 0.2f + 0.05f * k;
  ct_loader *lf, *lr, *li;
  CHECK_OK(ct_loader_create(ds, &o, &lf));
  o.alloc = pinned_alloc, o.free = pinned_free, o.alloc_ctx = gpu;
  o.mode = CT_LOADER_RAW_U8;
  CHECK_OK(ct_loader_create(ds, &o, &lr));
  o.mode = CT_LOADER_INDICES;
  CHECK_OK(ct_loader_create(ds, &o, &li));
  ct_gpu_data *gr = NULL, *gi = NULL;
  CHECK_OK(ct_gpu_data_create(gpu, lr, "raw", &gr));
  CHECK_OK(ct_gpu_data_create(gpu, li, "resident", &gi));
  /* Two batches are staged before the device is synchronised, raw batch j
   * into slot j, as the device step does when the host runs ahead: under
   * the emulator's CT_EMU_COPY_AHEAD the copy stream then runs both
   * copies before either transform, so slots that alias show. */
  size_t per = (size_t)c * 22 * 22;
  float *xd[4], *got = malloc(per * 32 * 4);
  int64_t *yd[4], ygot[32];
  for (int k = 0; k < 4; k++) xd[k] = ct_device_alloc(gpu, per * 32 * 4), yd[k] = ct_device_alloc(gpu, 32 * 8);
  int bad = 0, batches = 0, more = 1;
  for (int64_t epoch = 0; epoch < 2; epoch++) {
    CHECK_OK(ct_loader_start_epoch(lf, epoch, 0));
    CHECK_OK(ct_loader_start_epoch(lr, epoch, 0));
    CHECK_OK(ct_loader_start_epoch(li, epoch, 0));
    for (more = 1; more;) {
      ct_batch *bf[2] = {0}, *br[2] = {0}, *bi[2] = {0};
      int n = 0;
      for (; n < 2; n++) {
        CHECK_OK(ct_loader_next(lf, &bf[n]));
        CHECK_OK(ct_loader_next(lr, &br[n]));
        CHECK_OK(ct_loader_next(li, &bi[n]));
        if (!bf[n] || !br[n] || !bi[n]) {
          more = 0;
          break;
        }
      }
      for (int j = 0; j < n; j++) {
        batches++;
        CHECK(br[j]->device_data == gr && bi[j]->device_data == gi);
        ct_tensor x;
        CHECK_OK(ct_gpu_data_stage(gr, br[j], j, xd[j], CT_F32, CT_LAYOUT_PLAIN, yd[j], &x));
        CHECK(x.dtype == CT_F32 && x.shape[0] == bf[j]->n && x.shape[1] == c && x.shape[2] == 22 && x.shape[3] == 22);
        CHECK_OK(ct_gpu_data_stage(gi, bi[j], j, xd[2 + j], CT_F32, CT_LAYOUT_PLAIN, yd[2 + j], &x));
      }
      CHECK_OK(ct_device_sync(gpu));
      for (int j = 0; j < n; j++)
        for (int k = j; k < 4; k += 2) { /* raw (k = j), then index (k = 2 + j) */
          const ct_batch *f = bf[j];
          CHECK_OK(ct_device_copy(NULL, got, gpu, xd[k], per * (size_t)f->n * 4));
          CHECK_OK(ct_device_copy(NULL, ygot, gpu, yd[k], (size_t)f->n * 8));
          bad += memcmp(got, f->x.data, per * (size_t)f->n * 4) != 0;
          bad += memcmp(ygot, f->y.data, (size_t)f->n * 8) != 0;
        }
      for (int j = 0; j < 2; j++) {
        if (bf[j]) ct_loader_release(lf, bf[j]);
        if (br[j]) ct_loader_release(lr, br[j]);
        if (bi[j]) ct_loader_release(li, bi[j]);
      }
    }
  }
  CHECK(batches == 20);
  CHECK_MSG(bad == 0, "%d staged batches (images or labels) differ from the float loader", bad);
  for (int k = 0; k < 4; k++) ct_device_free(gpu, xd[k]), ct_device_free(gpu, yd[k]);
  free(got);
  ct_loader_destroy(lf);
  ct_loader_destroy(lr);
  ct_loader_destroy(li);
  ct_gpu_data_destroy(gr);
  ct_gpu_data_destroy(gi);
  ct_dataset_close(ds);
  free(px);
  free(labels);
}

int main(void) {
  if (ct_device_open("cuda", &gpu) != CT_OK) {
    printf("skipped: %s\n", ct_last_error());
    return 77;
  }
  G = ct_device_backend(gpu);
  ct_rng_init(&g, 5150, CT_RNG_TEST, 0, 0);
  CHECK(G->transform_u8 != NULL);
  if (G->transform_u8) {
    test_kernel();
    test_gpu_data();
  }
  ct_device_close(gpu);
  return test_summary("gpu_transform");
}
