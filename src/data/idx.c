/* MNIST / Fashion-MNIST IDX files (http://yann.lecun.com/exdb/mnist/): a
 * big-endian header (magic 2051 + count, rows, cols for images; magic 2049 +
 * count for labels) then one unsigned byte per pixel or label. zlib's gz
 * reader also reads uncompressed files, so raw and .gz go the same way. */
#include "core/file_open.h"
#include "data/dataset_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_IMAGES_MAGIC 2051
#define IDX_LABELS_MAGIC 2049
#define IDX_MAX_DIM 65535

static int file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* Reads exactly n bytes; on a short read says how many arrived. */
static ct_status gz_read_exact(gzFile f, const char *path, const char *what, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    size_t chunk = n - got > (1u << 30) ? (1u << 30) : n - got;
    int r = gzread(f, (char *)buf + got, (unsigned)chunk);
    if (r < 0) {
      int zerr = 0;
      const char *m = gzerror(f, &zerr);
      /* zlib's own errors (a bad CRC, a corrupt stream) are the file's content. */
      return ct_error(zerr == Z_ERRNO ? CT_ERR_IO : CT_ERR_PARSE, "%s: reading %s failed: %s", path, what,
                      zerr == Z_ERRNO ? strerror(errno) : m);
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  if (got < n)
    return ct_error(CT_ERR_PARSE, "%s: truncated: %s needs %zu bytes, the file has only %zu", path, what, n, got);
  return CT_OK;
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* After the payload the file must end: extra bytes mean the header lies. */
static ct_status expect_eof(gzFile f, const char *path) {
  unsigned char extra[256];
  long long more = 0;
  int r;
  while ((r = gzread(f, extra, sizeof extra)) > 0) more += r;
  if (r < 0) {
    int zerr = 0;
    const char *m = gzerror(f, &zerr);
    return ct_error(zerr == Z_ERRNO ? CT_ERR_IO : CT_ERR_PARSE, "%s: reading failed after the data: %s", path,
                    zerr == Z_ERRNO ? strerror(errno) : m);
  }
  if (more)
    return ct_error(CT_ERR_PARSE, "%s: %lld bytes after the data the header describes (wrong count or dims?)", path,
                    more);
  return CT_OK;
}

/* A header may claim up to 2^31 images of 65535x65535, and the dataset is
 * allocated before the pixels are read, so a corrupt 16-byte file would
 * otherwise cost a multi-gigabyte allocation. The claim is checked against
 * the file first: an uncompressed file must hold all of it after the
 * header, and a gzip one cannot inflate to more than 1032 times its size
 * (deflate's limit), which bounds the allocation by the file either way.
 * Call after the header was read (gzdirect needs a read). */
static ct_status check_claim(gzFile f, const char *path, uint32_t n, uint32_t rows, uint32_t cols) {
  struct stat st;
  if (stat(path, &st) != 0) return ct_error(CT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  unsigned long long claim = (unsigned long long)n * rows * cols, size = (unsigned long long)st.st_size;
  unsigned long long after = size > 16 ? size - 16 : 0;
  if (gzdirect(f) && claim > after)
    return ct_error(CT_ERR_PARSE,
                    "%s: truncated, or a wrong header: it claims %u images of %ux%u (%llu bytes of pixels) but the "
                    "file holds only %llu bytes after the 16-byte header",
                    path, n, rows, cols, claim, after);
  if (!gzdirect(f) && claim / 1032 > size)
    return ct_error(CT_ERR_PARSE,
                    "%s: truncated, or a wrong header: it claims %u images of %ux%u (%llu bytes of pixels) but a "
                    "gzip file of %llu bytes inflates to at most 1032 times that",
                    path, n, rows, cols, claim, size);
  return CT_OK;
}

static gzFile open_gz(const char *path, ct_status *s) {
  int fd;
  *s = ct_open_regular(path, NULL, &fd);
  if (*s != CT_OK) return NULL;
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    close(fd);
    *s = ct_error(CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  return f;
}

static ct_status read_images(ct_dataset *ds, const char *path) {
  ct_status s = CT_OK;
  gzFile f = open_gz(path, &s);
  if (!f) return s;
  unsigned char hdr[16];
  s = gz_read_exact(f, path, "the 16-byte header", hdr, sizeof hdr);
  if (s == CT_OK) {
    uint32_t magic = be32(hdr), n = be32(hdr + 4), rows = be32(hdr + 8), cols = be32(hdr + 12);
    if (magic != IDX_IMAGES_MAGIC)
      s = ct_error(CT_ERR_PARSE, "%s: magic number %u, expected %d for an IDX image file (labels have %d)", path,
                   magic, IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC);
    else if (rows < 1 || cols < 1 || rows > IDX_MAX_DIM || cols > IDX_MAX_DIM || n > (1u << 31))
      s = ct_error(CT_ERR_PARSE, "%s: bad header: %u images of %ux%u (rows and cols must be 1..%d)", path, n, rows,
                   cols, IDX_MAX_DIM);
    else if ((s = check_claim(f, path, n, rows, cols)) == CT_OK)
      s = ct_dataset_alloc(ds, path, (int64_t)n, 1, (int)rows, (int)cols);
    if (s == CT_OK)
      s = gz_read_exact(f, path, "the pixel data", ds->pixels, (size_t)n * rows * cols);
    if (s == CT_OK) s = expect_eof(f, path);
  }
  gzclose(f);
  return s;
}

static ct_status read_labels(ct_dataset *ds, const char *path, const char *images_path) {
  ct_status s = CT_OK;
  gzFile f = open_gz(path, &s);
  if (!f) return s;
  unsigned char hdr[8];
  uint8_t *raw = NULL;
  s = gz_read_exact(f, path, "the 8-byte header", hdr, sizeof hdr);
  if (s == CT_OK) {
    uint32_t magic = be32(hdr), n = be32(hdr + 4);
    if (magic != IDX_LABELS_MAGIC)
      s = ct_error(CT_ERR_PARSE, "%s: magic number %u, expected %d for an IDX label file (images have %d)", path,
                   magic, IDX_LABELS_MAGIC, IDX_IMAGES_MAGIC);
    else if ((int64_t)n != ds->n)
      s = ct_error(CT_ERR_PARSE, "%s: %u labels but %s has %lld images; the counts must be equal", path, n,
                   images_path, (long long)ds->n);
    else if (!(raw = malloc((size_t)n + 1)))
      s = ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %u bytes", path, n);
    if (s == CT_OK) s = gz_read_exact(f, path, "the labels", raw, n);
    if (s == CT_OK) s = expect_eof(f, path);
    for (uint32_t i = 0; s == CT_OK && i < n; i++) {
      if (raw[i] >= 10)
        s = ct_error(CT_ERR_PARSE, "%s: label %u of item %u is outside [0, 10)", path, raw[i], i);
      ds->labels[i] = raw[i];
    }
  }
  free(raw);
  gzclose(f);
  return s;
}

ct_status ct_idx_load(ct_dataset *ds, const char *dir, int train, int fashion, int default_dir) {
  const char *split = train ? "train" : "t10k";
  const char *kinds[2] = {"images-idx3-ubyte", "labels-idx1-ubyte"};
  char cand[2][2][1024];
  const char *found[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++)
    for (int z = 0; z < 2; z++) {
      snprintf(cand[k][z], sizeof cand[k][z], "%s/%s-%s%s", dir, split, kinds[k], z ? ".gz" : "");
      if (!found[k] && file_exists(cand[k][z])) found[k] = cand[k][z];
    }
  if (!found[0] || !found[1]) {
    char tried[4200] = "";
    for (int k = 0; k < 2; k++)
      if (!found[k])
        for (int z = 0; z < 2; z++) {
          strncat(tried, tried[0] ? ", " : "", sizeof tried - strlen(tried) - 1);
          strncat(tried, cand[k][z], sizeof tried - strlen(tried) - 1);
        }
    const char *hint =
        fashion ? (default_dir ? "install it with `apt-get install dataset-fashion-mnist`, or put the files "
                                 "elsewhere and use fashion-mnist:PATH"
                               : "put the four Fashion-MNIST IDX files there, or `apt-get install "
                                 "dataset-fashion-mnist` and use plain 'fashion-mnist'")
                : "download train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
                  "t10k-labels-idx1-ubyte.gz (the MNIST distribution) into that folder";
    return ct_error(CT_ERR_NOT_FOUND, "%s %s split not found: looked for %s; %s", fashion ? "Fashion-MNIST" : "MNIST",
                    train ? "train" : "test", tried, hint);
  }
  snprintf(ds->name, sizeof ds->name, "%s", fashion ? "fashion-mnist" : "mnist");
  ds->classes = 10;
  CT_TRY(read_images(ds, found[0]));
  return read_labels(ds, found[1], found[0]);
}
