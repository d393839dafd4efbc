/* libFuzzer target for the dataset file readers (see fuzz/README.md): IDX
 * (MNIST / Fashion-MNIST, raw or gzip), CIFAR-10 / CIFAR-100 binary
 * batches, and PNG / JPEG images.
 *
 * These readers take paths, not memory, so each input is written to a
 * scratch file (fuzz/fuzz_scratch.h). Its first byte picks the reader and
 * the file the remaining bytes become; an IDX file gets a valid partner
 * written beside it (labels for images, images for labels) with the count
 * its header claims, so an accepted half goes on to the whole load.
 *
 * The body is shared with tests/unit/test_datasets_mutate.c, which includes
 * this file with CT_FUZZ_BODY_ONLY defined and drives it with the
 * deterministic mutation loop of tests/mutate_util.h, so gcc builds without
 * libFuzzer still run it in ctest. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "ctrain/data.h"
#include "data/image_decode.h"
#include "fuzz_scratch.h"
#include "fuzz_entry.h"

/* What the first input byte (modulo FUZZ_DS_KINDS) selects. */
enum {
  FUZZ_DS_IDX_IMAGES, /* train-images-idx3-ubyte, valid labels beside */
  FUZZ_DS_IDX_LABELS, /* train-labels-idx1-ubyte, valid images beside */
  FUZZ_DS_CIFAR10,    /* test_batch.bin */
  FUZZ_DS_CIFAR100,   /* test.bin */
  FUZZ_DS_IMAGE,      /* a PNG or JPEG file, through ct_image_decode */
  FUZZ_DS_KINDS
};

/* The most samples a partner IDX file gets; a header claiming more gets a
 * partner with none, so the pair is rejected for the count mismatch. */
#define FUZZ_DS_PARTNER_MAX 4096
/* Shape of the images in a partner images file. */
#define FUZZ_DS_PARTNER_ROWS 1
#define FUZZ_DS_PARTNER_COLS 2

/* Most pixels an accepted image may have per byte of file: a 1-bit PNG
 * inflated at deflate's limit (1032:1, 8 pixels a byte); JPEG is held to
 * less (image_decode.c). More means the decoder made up an image its file
 * cannot describe, and allocated for it. */
#define FUZZ_DS_MAX_PIXELS_PER_BYTE (1032ull * 8)

/* Inputs each reader accepted (the twin reports and checks these). */
static long fuzz_ds_accepted[FUZZ_DS_KINDS];
/* Where image checksums go (see fuzz_ds_image). */
static unsigned fuzz_ds_sink;

/* Records why an input was handled inconsistently (mutate_run prints
 * ct_last_error()) and returns -1. */
static int fuzz_ds_bad(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ct_error(CT_ERR_INTERNAL, "fuzz_datasets: %s", msg);
  return -1;
}

/* A rejection must carry a message that names the file it is about (every
 * file here lies in the scratch directory), and must not be for lack of
 * memory: an input of a few kilobytes describes at most a few hundred
 * megabytes of pixels, so running out means a reader allocated what a
 * header claimed without checking it against the file (the ctest twin caps
 * its address space so such an allocation fails instead of succeeding
 * lazily; libFuzzer's -malloc_limit_mb catches it first). */
static int fuzz_ds_rejected(ct_status s, const char *where, size_t size) {
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", ct_last_error());
  if (!msg[0]) return fuzz_ds_bad("rejected with %s and an empty message", ct_status_name(s));
  if (s == CT_ERR_OUT_OF_MEMORY) return fuzz_ds_bad("a %zu-byte file ran a reader out of memory: %s", size, msg);
  if (!strstr(msg, where)) return fuzz_ds_bad("rejected with %s, message names no file in %s: %s", ct_status_name(s),
                                              where, msg);
  return 0;
}

static uint32_t fuzz_ds_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void fuzz_ds_put_be32(uint8_t *p, uint32_t v) {
  for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (24 - 8 * k));
}

/* The bytes zlib's gz reader gives for path (what the IDX reader sees: the
 * file itself, or its inflated content when it is gzip), at most cap of
 * them, or NULL on a read error. */
static uint8_t *fuzz_ds_gz_content(const char *path, size_t cap, size_t *n) {
  gzFile f = gzopen(path, "rb");
  if (!f) return NULL;
  uint8_t *buf = malloc(cap + 1);
  size_t got = 0;
  int r = 0;
  while (buf && got < cap && (r = gzread(f, buf + got, (unsigned)(cap - got))) > 0) got += (size_t)r;
  gzclose(f);
  if (!buf || r < 0) {
    free(buf);
    return NULL;
  }
  *n = got;
  return buf;
}

/* The count field of the IDX header at path (bytes 4..8 once inflated),
 * or UINT32_MAX when the file is too short or unreadable. */
static uint32_t fuzz_ds_idx_count(const char *path) {
  size_t n = 0;
  uint8_t *h = fuzz_ds_gz_content(path, 8, &n);
  uint32_t count = h && n == 8 ? fuzz_ds_be32(h + 4) : UINT32_MAX;
  free(h);
  return count;
}

/* The partner files: label i is i % 10, pixel k of image i is i * 7 + k. */
static const char *fuzz_ds_write_labels(uint32_t n, char *path, size_t cap) {
  uint8_t *b = malloc(8 + (size_t)n);
  if (!b) return NULL;
  fuzz_ds_put_be32(b, 2049);
  fuzz_ds_put_be32(b + 4, n);
  for (uint32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)(i % 10);
  const char *p = fuzz_scratch_file("train-labels-idx1-ubyte", b, 8 + (size_t)n, path, cap);
  free(b);
  return p;
}

static const char *fuzz_ds_write_images(uint32_t n, char *path, size_t cap) {
  const size_t px = FUZZ_DS_PARTNER_ROWS * FUZZ_DS_PARTNER_COLS;
  uint8_t *b = malloc(16 + (size_t)n * px);
  if (!b) return NULL;
  fuzz_ds_put_be32(b, 2051);
  fuzz_ds_put_be32(b + 4, n);
  fuzz_ds_put_be32(b + 8, FUZZ_DS_PARTNER_ROWS);
  fuzz_ds_put_be32(b + 12, FUZZ_DS_PARTNER_COLS);
  for (uint32_t i = 0; i < n; i++)
    for (size_t k = 0; k < px; k++) b[16 + i * px + k] = (uint8_t)(i * 7 + k);
  const char *p = fuzz_scratch_file("train-images-idx3-ubyte", b, 16 + (size_t)n * px, path, cap);
  free(b);
  return p;
}

/* An accepted IDX pair: shape and count as the fuzzed file's header says,
 * exactly the bytes it holds, and the partner's samples unchanged. */
static int fuzz_ds_check_idx(const ct_dataset *ds, int images, const char *path, const uint8_t *data, size_t size) {
  int64_t n = ct_dataset_size(ds);
  int c, h, w;
  ct_dataset_shape(ds, &c, &h, &w);
  if (ct_dataset_classes(ds) != 10 || c != 1 || h < 1 || w < 1 || n < 0 || n > FUZZ_DS_PARTNER_MAX)
    return fuzz_ds_bad("IDX accepted as %lld images of %dx%dx%d, %d classes", (long long)n, c, h, w,
                       ct_dataset_classes(ds));
  size_t px = (size_t)h * (size_t)w;
  size_t want = images ? 16 + (size_t)n * px : 8 + (size_t)n;
  /* What the reader saw: the input itself unless it is gzip. */
  int gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  size_t got = size;
  uint8_t *content = gz ? fuzz_ds_gz_content(path, want + 1, &got) : NULL;
  const uint8_t *b = gz ? content : data;
  int rc = 0;
  if (!b)
    rc = fuzz_ds_bad("%s accepted but cannot be read back", path);
  else if (got != want)
    rc = fuzz_ds_bad("%s accepted as %lld samples of %dx%d (%zu bytes) but holds %zu%s bytes", path, (long long)n, h,
                     w, want, got, gz ? " or more inflated" : "");
  else if (fuzz_ds_be32(b) != (images ? 2051u : 2049u) || fuzz_ds_be32(b + 4) != (uint64_t)n ||
           (images && (fuzz_ds_be32(b + 8) != (uint32_t)h || fuzz_ds_be32(b + 12) != (uint32_t)w)))
    rc = fuzz_ds_bad("%s accepted as %lld samples of %dx%d, not what its header says", path, (long long)n, h, w);
  else if (!images && (h != FUZZ_DS_PARTNER_ROWS || w != FUZZ_DS_PARTNER_COLS))
    rc = fuzz_ds_bad("%s accepted with the partner images as %dx%d", path, h, w);
  for (int64_t i = 0; rc == 0 && i < n; i++) {
    const uint8_t *p;
    int64_t y;
    if (ct_dataset_sample(ds, i, &p, &y) != CT_OK) {
      rc = fuzz_ds_bad("sample %lld of %lld unreadable", (long long)i, (long long)n);
      break;
    }
    int64_t want_y = images ? i % 10 : b[8 + i];
    int px_ok = 1;
    for (size_t k = 0; k < px; k++)
      px_ok &= p[k] == (images ? b[16 + (size_t)i * px + k] : (uint8_t)(i * 7 + (int64_t)k));
    if (y != want_y || y < 0 || y >= 10 || !px_ok)
      rc = fuzz_ds_bad("%s: sample %lld has label %lld (want %lld, in [0, 10)), pixels %s", path, (long long)i,
                       (long long)y, (long long)want_y, px_ok ? "equal" : "differ");
  }
  free(content);
  return rc;
}

static int fuzz_ds_idx(const char *dir, int images, const uint8_t *data, size_t size) {
  char path[1024], partner[1024];
  const char *leaf = images ? "train-images-idx3-ubyte" : "train-labels-idx1-ubyte";
  if (!fuzz_scratch_file(leaf, data, size, path, sizeof path))
    return fuzz_ds_bad("cannot write %s in %s", leaf, dir);
  uint32_t count = fuzz_ds_idx_count(path);
  if (count > FUZZ_DS_PARTNER_MAX) count = 0;
  if (!(images ? fuzz_ds_write_labels(count, partner, sizeof partner)
               : fuzz_ds_write_images(count, partner, sizeof partner)))
    return fuzz_ds_bad("cannot write the partner file in %s", dir);
  char spec[1100];
  snprintf(spec, sizeof spec, "mnist:%s", dir);
  ct_dataset *ds = NULL;
  ct_status s = ct_dataset_open(spec, 1, NULL, &ds);
  if (s != CT_OK) return ds ? fuzz_ds_bad("rejected but handed back a dataset") : fuzz_ds_rejected(s, dir, size);
  fuzz_ds_accepted[images ? FUZZ_DS_IDX_IMAGES : FUZZ_DS_IDX_LABELS]++;
  int rc = fuzz_ds_check_idx(ds, images, path, data, size);
  ct_dataset_close(ds);
  return rc;
}

/* An accepted batch: whole records only, every label in range, every
 * record's pixels copied. */
static int fuzz_ds_cifar(const char *dir, int hundred, const uint8_t *data, size_t size) {
  char path[1024];
  const char *leaf = hundred ? "test.bin" : "test_batch.bin";
  if (!fuzz_scratch_file(leaf, data, size, path, sizeof path))
    return fuzz_ds_bad("cannot write %s in %s", leaf, dir);
  char spec[1100];
  snprintf(spec, sizeof spec, "%s:%s", hundred ? "cifar100" : "cifar10", dir);
  ct_dataset *ds = NULL;
  ct_status s = ct_dataset_open(spec, 0, NULL, &ds);
  if (s != CT_OK) return ds ? fuzz_ds_bad("rejected but handed back a dataset") : fuzz_ds_rejected(s, dir, size);
  fuzz_ds_accepted[hundred ? FUZZ_DS_CIFAR100 : FUZZ_DS_CIFAR10]++;
  const size_t lb = hundred ? 2 : 1, rec = lb + 3072;
  const int classes = hundred ? 100 : 10;
  int64_t n = ct_dataset_size(ds);
  int c, h, w, rc = 0;
  ct_dataset_shape(ds, &c, &h, &w);
  if (size == 0 || size % rec != 0 || n != (int64_t)(size / rec) || c != 3 || h != 32 || w != 32 ||
      ct_dataset_classes(ds) != classes)
    rc = fuzz_ds_bad("%s: %zu bytes accepted as %lld images of %dx%dx%d, %d classes", path, size, (long long)n, c, h,
                     w, ct_dataset_classes(ds));
  for (int64_t i = 0; rc == 0 && i < n; i++) {
    const uint8_t *p, *r = data + (size_t)i * rec;
    int64_t y;
    if (ct_dataset_sample(ds, i, &p, &y) != CT_OK) {
      rc = fuzz_ds_bad("sample %lld of %lld unreadable", (long long)i, (long long)n);
      break;
    }
    if (y != r[lb - 1] || y >= classes || (hundred && r[0] >= 20) || memcmp(p, r + lb, 3072) != 0)
      rc = fuzz_ds_bad("%s: record %lld accepted as label %lld (file: %u, coarse %u) or with other pixels", path,
                       (long long)i, (long long)y, r[lb - 1], r[0]);
  }
  ct_dataset_close(ds);
  return rc;
}

/* An accepted image: a sane shape within the decoder's pixel limit and
 * what the file's size can describe, and every pixel byte written (the checksum is branched on, so valgrind
 * reports pixels the decoder left uninitialised). */
static int fuzz_ds_image(const char *dir, const uint8_t *data, size_t size) {
  char path[1024];
  if (!fuzz_scratch_file("image.bin", data, size, path, sizeof path))
    return fuzz_ds_bad("cannot write image.bin in %s", dir);
  uint8_t *px = NULL;
  int h = -1, w = -1, ch = -1;
  ct_status s = ct_image_decode(path, &px, &h, &w, &ch);
  if (s != CT_OK) {
    if (px) {
      free(px);
      return fuzz_ds_bad("%s rejected but pixels handed back", path);
    }
    return fuzz_ds_rejected(s, path, size);
  }
  fuzz_ds_accepted[FUZZ_DS_IMAGE]++;
  int rc = 0;
  uint64_t npix = (uint64_t)h * (uint64_t)w;
  /* Arithmetic-coded JPEG frames (SOF9..SOF15: markers C9..CF but DAC's
   * CC) may be denser than that; only the pixel limit bounds them. */
  int arith = 0;
  for (size_t i = 0; i + 1 < size; i++)
    arith |= data[i] == 0xff && data[i + 1] >= 0xc9 && data[i + 1] <= 0xcf && data[i + 1] != 0xcc;
  if (!px || h < 1 || w < 1 || (ch != 1 && ch != 3) || npix > CT_IMAGE_MAX_PIXELS ||
      (!arith && npix > FUZZ_DS_MAX_PIXELS_PER_BYTE * size)) {
    rc = fuzz_ds_bad("%s accepted as %dx%d with %d channels, pixels %p", path, h, w, ch, (void *)px);
  } else {
    size_t nb = (size_t)h * (size_t)w * (size_t)ch;
    uint32_t sum = 0;
    for (size_t i = 0; i < nb; i++) sum = sum * 31u + px[i];
    if (sum & 1u) fuzz_ds_sink++;
  }
  free(px);
  return rc;
}

/* One input. Returns 0 if it was rejected with a status and a message
 * naming the file, or accepted with a dataset/image that matches its
 * bytes; -1 on an inconsistency (the fuzzer aborts on it). */
static int ct_fuzz_datasets_one(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const char *dir = fuzz_scratch_dir();
  if (!dir) return fuzz_ds_bad("no scratch directory");
  int kind = data[0] % FUZZ_DS_KINDS;
  data++, size--;
  switch (kind) {
    case FUZZ_DS_IDX_IMAGES: return fuzz_ds_idx(dir, 1, data, size);
    case FUZZ_DS_IDX_LABELS: return fuzz_ds_idx(dir, 0, data, size);
    case FUZZ_DS_CIFAR10: return fuzz_ds_cifar(dir, 0, data, size);
    case FUZZ_DS_CIFAR100: return fuzz_ds_cifar(dir, 1, data, size);
    default: return fuzz_ds_image(dir, data, size);
  }
}

CT_FUZZ_ENTRY(ct_fuzz_datasets_one)
