/* The per-sample transform arithmetic shared with the CUDA batch transform
 * (src/math/transform_params.h), checked on the CPU:
 *  - its Philox copy and draws against src/core/rng.c (ct_rng_*);
 *  - ct_xf_batch_host (the kernel's loop nest: one ct_xf_pixel per output
 *    value) against ct_transform_apply, bit for bit, on random uint8
 *    images for random and named configs (resize up/down, padded crop,
 *    flip, ToFloat on/off, Normalize, 1-4 channels), with row gathers,
 *    sample keys and label gathers;
 *  - the loader's raw-uint8 and index modes: the host batch transform of
 *    what they deliver equals the float loader's batch;
 *  - the GPU data path refused on the CPU device.
 * Every comparison is also run once with a wrong key (another epoch) to
 * show it can fail. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "data/gpu_data.h"
#include "math/transform_params.h"
#include "test_util.h"

static ct_rng g;

static void test_philox_and_draws(void) {
  for (int it = 0; it < 2000; it++) {
    uint32_t key[2] = {ct_rng_u32(&g), ct_rng_u32(&g)}, ctr[4] = {ct_rng_u32(&g), ct_rng_u32(&g), ct_rng_u32(&g), ct_rng_u32(&g)};
    uint32_t a[4], b[4];
    ct_philox4x32(key, ctr, a);
    ct_xf_philox(key, ctr, b);
    CHECK(memcmp(a, b, sizeof a) == 0);
  }
  /* Many draws from one stream, with bounds that make Lemire's rejection
   * loop run (n close to 2^32) and small ones. */
  int mism = 0;
  for (int it = 0; it < 500; it++) {
    uint64_t seed = ((uint64_t)ct_rng_u32(&g) << 32) | ct_rng_u32(&g);
    uint32_t ea = ct_rng_u32(&g), sb = ct_rng_u32(&g);
    ct_rng r;
    ct_xf_rng x;
    ct_rng_init(&r, seed, CT_RNG_AUGMENT, ea, sb);
    ct_xf_rng_init(&x, seed, CT_XF_RNG_AUGMENT, ea, sb);
    for (int k = 0; k < 20; k++) {
      uint32_t n = k % 3 == 0 ? 0xC0000001u + ct_rng_u32(&g) % 1000 : 1 + ct_rng_u32(&g) % 300;
      if (k % 5 == 4) mism += ct_rng_uniform(&r) != ct_xf_uniform(&x);
      else mism += ct_rng_below(&r, n) != ct_xf_below(&x, n);
    }
  }
  CHECK_MSG(mism == 0, "%d draws differ from ct_rng", mism);
}

/* A random transform valid for c x h x w (resize, crop with padding, flip,
 * ToFloat, Normalize each on or off). */
static ct_transform random_transform(int c, int h, int w) {
  ct_transform t;
  ct_transform_default(&t);
  if (ct_rng_below(&g, 3)) {
    t.resize_h = 1 + (int)ct_rng_below(&g, 2 * h + 8);
    t.resize_w = 1 + (int)ct_rng_below(&g, 2 * w + 8);
  }
  int rh = t.resize_h ? t.resize_h : h, rw = t.resize_w ? t.resize_w : w;
  if (ct_rng_below(&g, 2)) {
    t.crop_padding = (int)ct_rng_below(&g, 5);
    t.crop_h = 1 + (int)ct_rng_below(&g, (uint32_t)(rh + 2 * t.crop_padding));
    t.crop_w = 1 + (int)ct_rng_below(&g, (uint32_t)(rw + 2 * t.crop_padding));
  }
  if (ct_rng_below(&g, 2)) t.hflip_p = ct_rng_below(&g, 2) ? 0.5f : ct_rng_uniform(&g);
  t.to_float = (int)ct_rng_below(&g, 4) != 0;
  if (ct_rng_below(&g, 2)) {
    t.normalize = 1;
    for (int k = 0; k < c; k++) {
      t.mean[k] = ct_rng_uniform(&g) * (t.to_float ? 1.0f : 255.0f);
      t.std[k] = 0.05f + ct_rng_uniform(&g) * (t.to_float ? 1.0f : 60.0f);
    }
  }
  return t;
}

/* n images of c x h x w, random bytes (never all zero). */
static uint8_t *random_images(int64_t n, int c, int h, int w) {
  size_t bytes = (size_t)n * c * h * w;
  uint8_t *p = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)ct_rng_u32(&g);
  p[0] = 17;
  return p;
}

/* Runs the batch transform over rows/samples/labels and compares each
 * output image with ct_transform_apply (key: sample, epoch). Returns the
 * number of mismatching images; with wrong_epoch the reference uses
 * epoch + 1 (a negative control). */
static int compare_batch(const ct_transform *t, int c, int h, int w, const uint8_t *imgs, int64_t nimg, int64_t n,
                         uint64_t seed, int64_t epoch, int wrong_epoch, const char *what) {
  int oh, ow;
  if (ct_transform_check(t, c, h, w, &oh, &ow) != CT_OK) {
    CHECK_MSG(0, "%s: transform rejected: %s", what, ct_last_error());
    return 1;
  }
  size_t per = (size_t)c * oh * ow, img = (size_t)c * h * w;
  int64_t *rows = malloc((size_t)n * 8), *samples = malloc((size_t)n * 8), *labels = malloc((size_t)nimg * 8),
          *lout = malloc((size_t)n * 8);
  for (int64_t i = 0; i < nimg; i++) labels[i] = (int64_t)ct_rng_below(&g, 1000);
  for (int64_t i = 0; i < n; i++) rows[i] = (int64_t)ct_rng_below(&g, (uint32_t)nimg), samples[i] = ct_rng_below(&g, 1u << 30);
  float *got = malloc(per * (size_t)n * 4), *want = malloc(per * 4);
  ct_xf_batch b;
  memset(&b, 0, sizeof b);
  ct_xf_params_from(t, c, h, w, &b.p);
  b.n = n, b.seed = seed, b.epoch = epoch, b.src = imgs, b.rows = rows, b.samples = samples, b.dst = got;
  b.labels = labels, b.labels_out = lout;
  ct_xf_batch_host(&b);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    ct_transform_apply(t, imgs + (size_t)rows[i] * img, c, h, w, seed, epoch + (wrong_epoch ? 1 : 0), samples[i], want);
    if (memcmp(want, got + (size_t)i * per, per * 4)) {
      if (!wrong_epoch && bad < 3) {
        size_t j = 0;
        while (j < per && !memcmp(&want[j], &got[(size_t)i * per + j], 4)) j++;
        fprintf(stderr, "%s: image %lld value %zu: host batch %.9g, ct_transform_apply %.9g\n", what, (long long)i, j,
                (double)got[(size_t)i * per + j], (double)want[j]);
      }
      bad++;
    }
    if (!wrong_epoch) CHECK(lout[i] == labels[rows[i]]);
  }
  /* The 16-bit outputs (a narrowed model input): f16 channels-last and
   * bf16 NCHW, each the f32 value rounded once. */
  uint16_t *got16 = malloc(per * (size_t)n * 2);
  for (int v = 0; v < 2 && !wrong_epoch; v++) {
    b.dst = got16, b.dtype = v ? CT_BF16 : CT_F16, b.nhwc = !v;
    ct_xf_batch_host(&b);
    size_t plane = (size_t)oh * ow, off = 0;
    for (size_t j = 0; j < per * (size_t)n && !off; j++) {
      size_t i = j / per, r = j % per, k = r / plane, at = b.nhwc ? i * per + (r % plane) * (size_t)c + k : j;
      if (got16[at] != (v ? ct_f32_to_bf16(got[j]) : ct_f32_to_f16(got[j]))) off = j + 1;
    }
    CHECK_MSG(!off, "%s: %s output differs at value %zu", what, v ? "bf16 NCHW" : "f16 NHWC", off - 1);
  }
  free(got16);
  free(rows), free(samples), free(labels), free(lout), free(got), free(want);
  return bad;
}

static void test_batch_vs_apply_random(void) {
  int total_bad = 0, cases = 0, control_caught = 0, controls = 0;
  for (int it = 0; it < 400; it++) {
    int c = 1 + (int)ct_rng_below(&g, 4), h = 1 + (int)ct_rng_below(&g, 40), w = 1 + (int)ct_rng_below(&g, 40);
    ct_transform t = random_transform(c, h, w);
    int64_t nimg = 1 + ct_rng_below(&g, 6);
    uint8_t *imgs = random_images(nimg, c, h, w);
    char what[160];
    snprintf(what, sizeof what, "random case %d (c%d %dx%d resize %dx%d crop %dx%d pad %d flip %g norm %d)", it, c, h, w,
             t.resize_h, t.resize_w, t.crop_h, t.crop_w, t.crop_padding, (double)t.hflip_p, t.normalize);
    total_bad += compare_batch(&t, c, h, w, imgs, nimg, 5, 42 + it, it % 7, 0, what);
    cases++;
    /* With random crops, a wrong epoch must show (unless the crop has a
     * single position and the flip is off). */
    int rh = t.resize_h ? t.resize_h : h, rw = t.resize_w ? t.resize_w : w;
    if (t.crop_h && (rh + 2 * t.crop_padding - t.crop_h) * (rw + 2 * t.crop_padding - t.crop_w) >= 16) {
      controls++;
      control_caught += compare_batch(&t, c, h, w, imgs, nimg, 5, 42 + it, it % 7, 1, "control") > 0;
    }
    free(imgs);
  }
  CHECK_MSG(total_bad == 0, "%d images of %d cases differ", total_bad, cases);
  CHECK_MSG(controls > 20 && control_caught == controls, "negative control caught %d of %d", control_caught, controls);
}

static void test_batch_vs_apply_named(void) {
  struct {
    const char *name;
    int c, h, w, rh, rw, ch, cw, pad, norm, to_float;
    float flip;
  } cs[] = {
      {"resize up 28->227 (AlexNet on Fashion-MNIST)", 1, 28, 28, 227, 227, 0, 0, 0, 1, 1, 0.5f},
      {"resize down 64x48->20x13", 3, 64, 48, 20, 13, 0, 0, 0, 1, 1, 0.0f},
      {"CIFAR crop 32 pad 4 + flip + normalize", 3, 32, 32, 0, 0, 32, 32, 4, 1, 1, 0.5f},
      {"resize 40->36, crop 32 pad 2, flip p=0.3", 3, 40, 40, 36, 36, 32, 32, 2, 0, 1, 0.3f},
      {"raw 0..255, 4 channels, crop+flip", 4, 17, 23, 0, 0, 15, 20, 3, 0, 0, 1.0f},
      {"1x1 image resized to 9x5", 2, 1, 1, 9, 5, 0, 0, 0, 1, 1, 0.5f},
  };
  for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
    ct_transform t;
    ct_transform_default(&t);
    t.resize_h = cs[k].rh, t.resize_w = cs[k].rw, t.crop_h = cs[k].ch, t.crop_w = cs[k].cw;
    t.crop_padding = cs[k].pad, t.hflip_p = cs[k].flip, t.to_float = cs[k].to_float, t.normalize = cs[k].norm;
    for (int j = 0; j < cs[k].c; j++) t.mean[j] = 0.2f + 0.1f * j, t.std[j] = 0.3f + 0.05f * j;
    uint8_t *imgs = random_images(4, cs[k].c, cs[k].h, cs[k].w);
    int bad = compare_batch(&t, cs[k].c, cs[k].h, cs[k].w, imgs, 4, 9, 7, 3, 0, cs[k].name);
    CHECK_MSG(bad == 0, "%s: %d of 9 images differ", cs[k].name, bad);
    free(imgs);
  }
}

/* The loader's device modes deliver what the GPU path needs: the host
 * batch transform of their batches equals the float loader's batches. */
static void test_loader_modes(void) {
  int64_t n = 37;
  int c = 3, h = 12, w = 10;
  uint8_t *px = random_images(n, c, h, w);
  int64_t labels[37];
  for (int64_t i = 0; i < n; i++) labels[i] = (int64_t)ct_rng_below(&g, 5);
  ct_dataset *ds;
  CHECK_OK(ct_dataset_from_memory("rand", n, c, h, w, 5, px, labels, &ds));
  ct_loader_options o;
  ct_loader_options_default(&o);
  o.batch_size = 8;
  o.shuffle = 1;
  o.workers = 2;
  o.seed = 99;
  o.transform.resize_h = 14, o.transform.resize_w = 9;
  o.transform.crop_h = 12, o.transform.crop_w = 9, o.transform.crop_padding = 2, o.transform.hflip_p = 0.5f;
  o.transform.normalize = 1;
  for (int k = 0; k < 3; k++) o.transform.mean[k] = 0.4f, o.transform.std[k] = 0.25f;
  ct_loader *lf, *lr, *li;
  CHECK_OK(ct_loader_create(ds, &o, &lf));
  o.mode = CT_LOADER_RAW_U8;
  CHECK_OK(ct_loader_create(ds, &o, &lr));
  o.mode = CT_LOADER_INDICES;
  CHECK_OK(ct_loader_create(ds, &o, &li));
  int sc, sh, sw;
  ct_loader_shape(lr, &sc, &sh, &sw);
  CHECK(sc == 3 && sh == 12 && sw == 9); /* the transform's output shape in every mode */
  CHECK(ct_loader_get_options(li)->mode == CT_LOADER_INDICES && ct_loader_dataset(li) == ds);
  const uint8_t *all;
  CHECK_OK(ct_dataset_sample(ds, 0, &all, NULL));
  ct_xf_params p;
  ct_xf_params_from(&o.transform, c, h, w, &p);
  size_t per = (size_t)c * 12 * 9;
  float *got = malloc(per * 8 * 4);
  int64_t lout[8];
  int marker = 5;
  ct_loader_set_device_data(li, &marker);
  for (int64_t epoch = 0; epoch < 2; epoch++) {
    CHECK_OK(ct_loader_start_epoch(lf, epoch, 0));
    CHECK_OK(ct_loader_start_epoch(lr, epoch, 0));
    CHECK_OK(ct_loader_start_epoch(li, epoch, 0));
    int batches = 0, bad = 0;
    for (;;) {
      ct_batch *bf, *br, *bi;
      CHECK_OK(ct_loader_next(lf, &bf));
      CHECK_OK(ct_loader_next(lr, &br));
      CHECK_OK(ct_loader_next(li, &bi));
      if (!bf || !br || !bi) {
        CHECK(!bf && !br && !bi);
        break;
      }
      batches++;
      CHECK(br->n == bf->n && bi->n == bf->n && br->index == bf->index && bi->epoch == epoch);
      CHECK(br->x.dtype == CT_U8 && br->x.shape[1] == c && br->x.shape[2] == h && br->x.shape[3] == w);
      CHECK(bi->x.data == NULL && bi->device_data == &marker && br->device_data == NULL);
      CHECK(bi->order_n == n && bi->samples == bi->order + bi->index * 8);
      for (int64_t i = 0; i < bf->n; i++) {
        CHECK(br->samples[i] == bf->samples[i] && bi->samples[i] == bf->samples[i]);
        CHECK(memcmp((uint8_t *)br->x.data + (size_t)i * c * h * w, all + (size_t)br->samples[i] * c * h * w,
                     (size_t)c * h * w) == 0);
        CHECK(((int64_t *)bi->y.data)[i] == labels[bi->samples[i]]);
      }
      /* Raw mode: the batch's own images, keyed by its samples. */
      ct_xf_batch xb;
      memset(&xb, 0, sizeof xb);
      xb.p = p, xb.n = br->n, xb.seed = o.seed, xb.epoch = br->epoch, xb.src = br->x.data, xb.samples = br->samples;
      xb.dst = got;
      ct_xf_batch_host(&xb);
      bad += memcmp(got, bf->x.data, per * (size_t)bf->n * 4) != 0;
      /* Index mode: gathered from the whole split by the epoch order. */
      memset(&xb, 0, sizeof xb);
      xb.p = p, xb.n = bi->n, xb.seed = o.seed, xb.epoch = bi->epoch, xb.src = all;
      xb.rows = bi->order + (bi->samples - bi->order), xb.labels = labels, xb.labels_out = lout, xb.dst = got;
      ct_xf_batch_host(&xb);
      bad += memcmp(got, bf->x.data, per * (size_t)bf->n * 4) != 0;
      for (int64_t i = 0; i < bf->n; i++) CHECK(lout[i] == ((int64_t *)bf->y.data)[i]);
      ct_loader_release(lf, bf);
      ct_loader_release(lr, br);
      ct_loader_release(li, bi);
    }
    CHECK(batches == 5);
    CHECK_MSG(bad == 0, "epoch %lld: %d device-mode batches differ from the float loader", (long long)epoch, bad);
  }
  /* Not CUDA: the GPU data path is refused with the reason. */
  ct_device *cpu;
  CHECK_OK(ct_device_open("cpu", &cpu));
  ct_gpu_data *gd = (ct_gpu_data *)&marker;
  CHECK(ct_gpu_data_create(cpu, li, "train", &gd) == CT_ERR_UNSUPPORTED && gd == NULL);
  CHECK(strstr(ct_last_error(), "--device cuda") != NULL);
  CHECK(ct_gpu_data_bytes(lf) == 0);
  CHECK(ct_gpu_data_bytes(lr) >= (size_t)8 * c * h * w + 64);
  CHECK(ct_gpu_data_bytes(li) >= (size_t)n * c * h * w + 2 * 8 * (size_t)n);
  ct_device_close(cpu);
  o.mode = 3;
  ct_loader *bad_mode = NULL;
  CHECK(ct_loader_create(ds, &o, &bad_mode) == CT_ERR_INVALID_ARG && bad_mode == NULL);
  free(got);
  ct_loader_destroy(lf);
  ct_loader_destroy(lr);
  ct_loader_destroy(li);
  ct_dataset_close(ds);
  free(px);
}

int main(void) {
  ct_rng_init(&g, 2026, CT_RNG_TEST, 5, 0);
  test_philox_and_draws();
  test_batch_vs_apply_random();
  test_batch_vs_apply_named();
  test_loader_modes();
  return test_summary("transform_shared");
}
