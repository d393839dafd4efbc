/* The dataset fuzz target's body (fuzz/fuzz_datasets.c) over a
 * deterministic corpus. Fed: valid files built here in the real formats
 * (IDX images and labels, raw and gzip via zlib; CIFAR-10 and CIFAR-100
 * batches of two records; PNG via libpng: RGB, gray, RGBA, 16-bit, palette;
 * JPEG via libjpeg: baseline, gray with restarts, progressive, arithmetic;
 * the image seeds only where those headers exist), each first checked to be
 * accepted by its reader, then 6000 damaged copies from mutate_run
 * (tests/mutate_util.h), mostly in the first 640 bytes where the headers
 * live, plus format-aware damage: IDX header fields set to boundary claims,
 * CIFAR labels to boundary values, PNG IHDR fields changed with every chunk
 * CRC recomputed (so the damage gets past the CRC), JPEG frame sizes and
 * component counts changed. Checked: every input is either rejected with a
 * message naming its file, and never for lack of memory (outside ASan the
 * address space is capped at 2 GB, so an allocation sized from a header's
 * claim fails instead of being mapped lazily), or accepted with a dataset or
 * image that matches its bytes and is no larger than the file can describe;
 * a full run must also see every reader accept some mutated inputs.
 * ASan/valgrind add out-of-bounds and uninitialised reads. Set
 * CT_MUTATE_ITERS=N to run longer. */
#define CT_FUZZ_BODY_ONLY
#include "../../fuzz/fuzz_datasets.c"

#include <sys/resource.h>

#include "mutate_util.h"
#include "test_util.h"

/* ASan reserves terabytes of address space for its shadow memory, so the
 * cap below is only for other builds. */
#if defined(__SANITIZE_ADDRESS__)
#define TWIN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TWIN_ASAN 1
#endif
#endif

#if __has_include(<png.h>)
#include <png.h>
#define HAVE_PNG_WRITER 1
#endif
#if __has_include(<jpeglib.h>)
#include <jpeglib.h>
#define HAVE_JPEG_WRITER 1
#endif

#define MAX_SEEDS 24
#define SEED_CAP 8192

static mutate_seed seeds[MAX_SEEDS];
static int n_seeds;
static ct_rng rng;

/* Appends [kind][body] as a seed. */
static void add_seed(int kind, const uint8_t *body, size_t n) {
  if (n_seeds == MAX_SEEDS || n == 0) {
    CHECK_MSG(0, "seed of kind %d not added (%zu bytes, %d seeds)", kind, n, n_seeds);
    return;
  }
  uint8_t *b = malloc(n + 1);
  b[0] = (uint8_t)kind;
  memcpy(b + 1, body, n);
  seeds[n_seeds].data = b;
  seeds[n_seeds].n = n + 1;
  n_seeds++;
}

static void fill(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)ct_rng_u32(&rng);
}

/* in[0..n) as a gzip stream (what gzwrite makes); 0 on failure. */
static size_t gzip_mem(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)n;
  z.next_out = out;
  z.avail_out = (uInt)cap;
  int r = deflate(&z, Z_FINISH);
  size_t len = cap - z.avail_out;
  deflateEnd(&z);
  return r == Z_STREAM_END ? len : 0;
}

/* IDX files: n images of rows x cols, or n labels in [0, 10); each raw and
 * gzipped. */
static void add_idx_seeds(int images, uint32_t n, uint32_t rows, uint32_t cols) {
  uint8_t raw[1024], gz[1024];
  size_t hdr = images ? 16 : 8, len = hdr + (size_t)n * (images ? rows * cols : 1);
  fuzz_ds_put_be32(raw, images ? 2051 : 2049);
  fuzz_ds_put_be32(raw + 4, n);
  if (images) {
    fuzz_ds_put_be32(raw + 8, rows);
    fuzz_ds_put_be32(raw + 12, cols);
    fill(raw + hdr, len - hdr);
  } else {
    for (uint32_t i = 0; i < n; i++) raw[hdr + i] = (uint8_t)ct_rng_below(&rng, 10);
  }
  int kind = images ? FUZZ_DS_IDX_IMAGES : FUZZ_DS_IDX_LABELS;
  add_seed(kind, raw, len);
  add_seed(kind, gz, gzip_mem(raw, len, gz, sizeof gz));
}

/* A CIFAR batch of `records` records with labels in range. */
static void add_cifar_seed(int hundred, int records) {
  size_t lb = hundred ? 2 : 1, rec = lb + 3072;
  uint8_t *b = malloc(rec * (size_t)records);
  fill(b, rec * (size_t)records);
  for (int r = 0; r < records; r++) {
    if (hundred) b[(size_t)r * rec] = (uint8_t)ct_rng_below(&rng, 20);
    b[(size_t)r * rec + lb - 1] = (uint8_t)ct_rng_below(&rng, hundred ? 100 : 10);
  }
  add_seed(hundred ? FUZZ_DS_CIFAR100 : FUZZ_DS_CIFAR10, b, rec * (size_t)records);
  free(b);
}

#ifdef HAVE_PNG_WRITER
/* A w x h PNG in the simplified API's format fmt (bytes per pixel bpp in
 * the buffer; a colormapped format gets a 4-entry RGB colormap). */
static void add_png_seed(png_uint_32 fmt, int w, int h, int bpp) {
  uint8_t px[512], cmap[12], out[2048];
  fill(px, (size_t)w * h * bpp);
  fill(cmap, sizeof cmap);
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = fmt;
  if (fmt & PNG_FORMAT_FLAG_COLORMAP) {
    img.colormap_entries = 4;
    for (int i = 0; i < w * h; i++) px[i] &= 3;
  }
  png_alloc_size_t n = sizeof out;
  int ok = png_image_write_to_memory(&img, out, &n, 0, px, 0, (fmt & PNG_FORMAT_FLAG_COLORMAP) ? cmap : NULL);
  CHECK_MSG(ok, "png_image_write_to_memory: %s", img.message);
  if (ok) add_seed(FUZZ_DS_IMAGE, out, (size_t)n);
}
#endif

#ifdef HAVE_JPEG_WRITER
enum { JPEG_BASELINE, JPEG_GRAY_RESTART, JPEG_PROGRESSIVE, JPEG_ARITH };

/* A w x h JPEG of one of the kinds above. */
static void add_jpeg_seed(int kind, int w, int h) {
  int ch = kind == JPEG_GRAY_RESTART ? 1 : 3;
  uint8_t px[1024];
  fill(px, (size_t)w * h * ch);
  unsigned char *out = NULL;
  unsigned long n = 0;
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  jpeg_mem_dest(&c, &out, &n);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = ch;
  c.in_color_space = ch == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 75, TRUE);
  if (kind == JPEG_GRAY_RESTART) c.restart_interval = 1;
  if (kind == JPEG_PROGRESSIVE) jpeg_simple_progression(&c);
#if defined(C_ARITH_CODING_SUPPORTED)
  if (kind == JPEG_ARITH) c.arith_code = TRUE;
#endif
  jpeg_start_compress(&c, TRUE);
  for (int y = 0; y < h; y++) {
    JSAMPROW row = (JSAMPROW)(px + (size_t)y * w * ch);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  add_seed(FUZZ_DS_IMAGE, out, (size_t)n);
  free(out);
}
#endif

/* Finds a PNG's chunks in p[0..n) and rewrites each complete one's CRC. */
static void png_fix_crcs(uint8_t *p, size_t n) {
  for (size_t at = 8; at + 12 <= n;) {
    size_t len = fuzz_ds_be32(p + at);
    if (len > n - at - 12) break;
    fuzz_ds_put_be32(p + at + 8 + len, (uint32_t)crc32(0, p + at + 4, (uInt)(4 + len)));
    at += 12 + len;
  }
}

/* The format's own damage (mutate_spec.extra), on [kind][file]. */
static void damage(ct_rng *r, uint8_t *b, size_t n) {
  static const uint32_t claims[] = {0, 1, 2, 9, 10, 255, 4096, 4097, 65535, 65536, 1u << 24, 1u << 31,
                                    (1u << 31) + 1, 0xffffffffu};
  static const uint32_t png_dims[] = {0, 1, 2, 7, 8, 9, 255, 256, 65535, 1000000, 1000001, 0x7fffffffu, 0x80000000u};
  static const uint8_t png_fields[][6] = {{1, 2, 4, 8, 16, 3}, {0, 2, 3, 4, 6, 5}, {0, 1, 2, 0, 1, 2}};
  static const uint16_t jpeg_dims[] = {0, 1, 7, 8, 9, 16, 17, 255, 1000, 65500, 65535};
  static const uint8_t labels[] = {0, 9, 10, 19, 20, 99, 100, 255};
  if (n < 2) return;
  uint8_t *p = b + 1;
  size_t m = n - 1;
  int kind = b[0] % FUZZ_DS_KINDS;
  if (kind == FUZZ_DS_IDX_IMAGES || kind == FUZZ_DS_IDX_LABELS) {
    /* A header field (count, rows, cols) claiming a boundary size; raw
     * files only, as a gzip file's CRC would catch it. */
    uint32_t field = 1 + ct_rng_below(r, kind == FUZZ_DS_IDX_IMAGES ? 3 : 1);
    if (m >= 16 && !(p[0] == 0x1f && p[1] == 0x8b))
      fuzz_ds_put_be32(p + 4 * field, claims[ct_rng_below(r, sizeof claims / sizeof *claims)]);
  } else if (kind == FUZZ_DS_CIFAR10 || kind == FUZZ_DS_CIFAR100) {
    size_t lb = kind == FUZZ_DS_CIFAR100 ? 2 : 1, rec = lb + 3072;
    if (m >= rec) p[ct_rng_below(r, (uint32_t)(m / rec)) * rec + ct_rng_below(r, (uint32_t)lb)] =
        labels[ct_rng_below(r, sizeof labels)];
  } else if (m >= 33 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) {
    /* IHDR: width, height, then bit depth, colour type, interlace; the
     * CRCs are fixed afterwards so the change reaches the decoder. */
    uint32_t what = ct_rng_below(r, 6);
    if (what < 2)
      fuzz_ds_put_be32(p + 16 + 4 * what, png_dims[ct_rng_below(r, sizeof png_dims / sizeof *png_dims)]);
    else if (what < 5)
      p[24 + (what == 2 ? 0 : what == 3 ? 1 : 4)] = png_fields[what - 2][ct_rng_below(r, 6)];
    png_fix_crcs(p, m);
  } else if (m >= 4 && p[0] == 0xff && p[1] == 0xd8) {
    /* The first SOFn frame header: height, width or component count. */
    for (size_t at = 2; at + 10 <= m; at++) {
      uint8_t mk = p[at + 1];
      if (p[at] != 0xff || mk < 0xc0 || mk > 0xcf || mk == 0xc4 || mk == 0xc8 || mk == 0xcc) continue;
      uint32_t what = ct_rng_below(r, 3);
      if (what < 2) {
        uint16_t v = jpeg_dims[ct_rng_below(r, sizeof jpeg_dims / sizeof *jpeg_dims)];
        p[at + 5 + 2 * what] = (uint8_t)(v >> 8);
        p[at + 6 + 2 * what] = (uint8_t)v;
      } else {
        p[at + 9] = (uint8_t)ct_rng_below(r, 5);
      }
      break;
    }
  }
}

/* Parses the files the body just wrote for seed sd, directly. */
static ct_status parse_written(const mutate_seed *sd) {
  const char *dir = fuzz_scratch_dir();
  char spec[1100];
  ct_dataset *ds = NULL;
  ct_status s;
  switch (sd->data[0] % FUZZ_DS_KINDS) {
    case FUZZ_DS_IDX_IMAGES:
    case FUZZ_DS_IDX_LABELS: snprintf(spec, sizeof spec, "mnist:%s", dir); break;
    case FUZZ_DS_CIFAR10: snprintf(spec, sizeof spec, "cifar10:%s", dir); break;
    case FUZZ_DS_CIFAR100: snprintf(spec, sizeof spec, "cifar100:%s", dir); break;
    default: {
      char path[1100];
      uint8_t *px = NULL;
      int h, w, c;
      snprintf(path, sizeof path, "%s/image.bin", dir);
      s = ct_image_decode(path, &px, &h, &w, &c);
      free(px);
      return s;
    }
  }
  s = ct_dataset_open(spec, sd->data[0] % FUZZ_DS_KINDS >= FUZZ_DS_CIFAR10 ? 0 : 1, NULL, &ds);
  ct_dataset_close(ds);
  return s;
}

int main(void) {
#ifndef TWIN_ASAN
  /* No input here (8 KB at most) can need more than about 500 MB: capped at
   * 2 GB of address space, a reader that allocates what a corrupt header
   * claims gets NULL (CT_ERR_OUT_OF_MEMORY, which the body reports) instead
   * of lazily mapped pages that would hide it. */
  struct rlimit as = {2ull << 30, 2ull << 30};
  CHECK(setrlimit(RLIMIT_AS, &as) == 0);
#endif
  ct_rng_init(&rng, 9, CT_RNG_TEST, 7, 0);
  add_idx_seeds(1, 3, 4, 5);
  add_idx_seeds(1, 0, 28, 28);
  add_idx_seeds(0, 6, 0, 0);
  add_cifar_seed(0, 2);
  add_cifar_seed(1, 2);
  int n_png = 0, n_jpeg = 0;
#ifdef HAVE_PNG_WRITER
  add_png_seed(PNG_FORMAT_RGB, 5, 6, 3);
  add_png_seed(PNG_FORMAT_GRAY, 7, 3, 1);
  add_png_seed(PNG_FORMAT_RGBA, 4, 4, 4);
  add_png_seed(PNG_FORMAT_LINEAR_Y, 3, 5, 2);
  add_png_seed(PNG_FORMAT_RGB_COLORMAP, 6, 2, 1);
  n_png = 5;
#endif
#ifdef HAVE_JPEG_WRITER
  add_jpeg_seed(JPEG_BASELINE, 9, 7);
  add_jpeg_seed(JPEG_GRAY_RESTART, 8, 8);
  add_jpeg_seed(JPEG_PROGRESSIVE, 10, 6);
  n_jpeg = 3;
#if defined(C_ARITH_CODING_SUPPORTED) && defined(D_ARITH_CODING_SUPPORTED)
  add_jpeg_seed(JPEG_ARITH, 6, 5);
  n_jpeg = 4;
#endif
#endif
  if (!n_png || !n_jpeg)
    printf("test_datasets_mutate: %s%s%s headers absent, those seeds skipped\n", n_png ? "" : "PNG",
           !n_png && !n_jpeg ? " and " : "", n_jpeg ? "" : "JPEG");

  /* Every seed is handled consistently and accepted by its reader. */
  for (int i = 0; i < n_seeds; i++) {
    ct_error_clear();
    CHECK_MSG(ct_fuzz_datasets_one(seeds[i].data, seeds[i].n) == 0, "seed %d (kind %d): %s", i, seeds[i].data[0],
              ct_last_error());
    ct_status s = parse_written(&seeds[i]);
    CHECK_MSG(s == CT_OK, "seed %d (kind %d) rejected: %s", i, seeds[i].data[0], ct_last_error());
  }

  long before[FUZZ_DS_KINDS];
  memcpy(before, fuzz_ds_accepted, sizeof before);
  mutate_spec sp = {.seeds = seeds,
                    .n_seeds = n_seeds,
                    .hot = 640,
                    .sig = "\xff\xd8\xd9\xda\xdb\xc0\xc2\xc4\xdd\xd0\x08\x03\x01"
                           "IHDRPLTEIDATtRNSIEND",
                    .cap = SEED_CAP,
                    .iters = 6000,
                    .extra = damage,
                    .one = ct_fuzz_datasets_one};
  const char *env = getenv("CT_MUTATE_ITERS");
  long iters = env ? atol(env) : sp.iters;
  int failures = mutate_run("test_datasets_mutate", &sp);
  CHECK_MSG(failures == 0, "%d inconsistent inputs", failures);
  /* The mutated corpus must reach the accepting side of every reader
   * (besides the seeds themselves, which mutate_run feeds once more);
   * a short run (CT_MUTATE_ITERS) may not. */
  static const char *names[FUZZ_DS_KINDS] = {"IDX images", "IDX labels", "CIFAR-10", "CIFAR-100", "images"};
  for (int k = 0; k < FUZZ_DS_KINDS; k++) {
    int k_seeds = 0;
    for (int i = 0; i < n_seeds; i++) k_seeds += seeds[i].data[0] == k;
    long mutated = fuzz_ds_accepted[k] - before[k] - k_seeds;
    printf("  %-10s %d seeds, %ld mutated inputs accepted\n", names[k], k_seeds, mutated);
    if (k_seeds && iters >= 2000) CHECK_MSG(mutated > 0, "no mutated %s input was accepted", names[k]);
  }
  for (int i = 0; i < n_seeds; i++) free((void *)seeds[i].data);
  fuzz_scratch_clear();
  return test_summary("test_datasets_mutate");
}
