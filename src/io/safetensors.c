/* safetensors reader: header validation and tensor reads. */
#define _POSIX_C_SOURCE 200809L
#include "ctrain/safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file_open.h"
#include "io/json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; a big-endian host needs byte swapping here"
#endif

/* The reference implementation's limit: a larger header is taken as a sign
 * of a corrupt or hostile file rather than allocated. */
#define ST_MAX_HEADER 100000000ull
/* No real tensor has a dimension near 2^48 elements; larger values are
 * corruption, and bounding them keeps numel arithmetic far from overflow. */
#define ST_MAX_DIM ((int64_t)1 << 48)

typedef struct st_entry {
  char *name;
  ct_dtype dtype;
  int ndim;
  int64_t shape[CT_MAX_DIMS];
  uint64_t begin, end; /* relative to the data buffer */
} st_entry;

struct ct_safetensors {
  char *label;               /* file path or caller's name, for messages */
  int fd;                    /* -1 for in-memory images */
  const unsigned char *mem;  /* whole file image when fd < 0 */
  uint64_t file_size;
  uint64_t data_start;       /* 8 + header length */
  uint64_t data_size;
  size_t n;
  st_entry *e;               /* sorted by data offset */
  size_t *by_name;           /* indices into e sorted by name, for find */
  size_t n_meta;
  char **meta_key, **meta_val;
};

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

void ct_safetensors_close(ct_safetensors *st) {
  if (!st) return;
  if (st->fd >= 0) close(st->fd);
  for (size_t i = 0; i < st->n; i++) free(st->e[i].name);
  for (size_t i = 0; i < st->n_meta; i++) free(st->meta_key[i]), free(st->meta_val[i]);
  free(st->e);
  free(st->by_name);
  free(st->meta_key);
  free(st->meta_val);
  free(st->label);
  free(st);
}

/* Reads exactly n bytes at offset; 0 on success, else errno (0 -> EIO for
 * a short read, which means the file shrank). */
static int read_at(const ct_safetensors *st, uint64_t off, void *dst, size_t n) {
  if (st->fd < 0) {
    if (off > st->file_size || n > st->file_size - off) return EIO;
    memcpy(dst, st->mem + off, n);
    return 0;
  }
  unsigned char *p = dst;
  while (n > 0) {
    size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
    ssize_t r = pread(st->fd, p, chunk, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;
    p += r;
    off += (uint64_t)r;
    n -= (size_t)r;
  }
  return 0;
}

/* Message helpers: keys are printed truncated so a hostile 100 MB key does
 * not flood a log line. */
#define KEYFMT "\"%.200s%s\""
#define KEYARG(k) (k), (strlen(k) > 200 ? "..." : "")

static ct_status parse_metadata(ct_safetensors *st, const ct_json *v) {
  if (v->type == CT_JSON_NULL) return CT_OK;
  if (v->type != CT_JSON_OBJECT)
    return ct_error(CT_ERR_PARSE, "%s: key \"__metadata__\": expected an object of string values, found %s", st->label,
                    ct_json_type_name(v->type));
  st->meta_key = calloc(v->count ? v->count : 1, sizeof *st->meta_key);
  st->meta_val = calloc(v->count ? v->count : 1, sizeof *st->meta_val);
  if (!st->meta_key || !st->meta_val) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: metadata: out of memory", st->label);
  for (size_t i = 0; i < v->count; i++) {
    const ct_json *val = &v->items[i];
    if (val->type != CT_JSON_STRING)
      return ct_error(CT_ERR_PARSE, "%s: key \"__metadata__\": entry " KEYFMT ": expected a string value, found %s",
                      st->label, KEYARG(v->keys[i]), ct_json_type_name(val->type));
    if (strlen(v->keys[i]) != v->key_lens[i] || strlen(val->str) != val->str_len)
      return ct_error(CT_ERR_PARSE, "%s: key \"__metadata__\": entry " KEYFMT ": contains a \\u0000 character",
                      st->label, KEYARG(v->keys[i]));
    st->meta_key[i] = dup_n(v->keys[i], v->key_lens[i]);
    st->meta_val[i] = dup_n(val->str, val->str_len);
    st->n_meta = i + 1;
    if (!st->meta_key[i] || !st->meta_val[i])
      return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: metadata: out of memory", st->label);
  }
  return CT_OK;
}

/* Names of safetensors dtypes that are valid in the format but have no
 * ctrain type: reported as unsupported rather than as corruption. */
static int is_foreign_dtype(const char *s) {
  static const char *names[] = {"BOOL", "U16", "U32", "U64", "I8", "I16", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(s, names[i]) == 0) return 1;
  return 0;
}

static ct_status parse_tensor(ct_safetensors *st, const char *key, const ct_json *v, st_entry *e) {
  if (v->type != CT_JSON_OBJECT)
    return ct_error(CT_ERR_PARSE,
                    "%s: tensor " KEYFMT ": expected an object {\"dtype\", \"shape\", \"data_offsets\"}, found %s",
                    st->label, KEYARG(key), ct_json_type_name(v->type));
  const ct_json *dtype = NULL, *shape = NULL, *offs = NULL;
  for (size_t i = 0; i < v->count; i++) {
    const char *f = v->keys[i];
    if (strcmp(f, "dtype") == 0) dtype = &v->items[i];
    else if (strcmp(f, "shape") == 0) shape = &v->items[i];
    else if (strcmp(f, "data_offsets") == 0) offs = &v->items[i];
    else
      return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": unknown field " KEYFMT " (expected dtype, shape, data_offsets)",
                      st->label, KEYARG(key), KEYARG(f));
  }
  const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
  if (missing) return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": missing field \"%s\"", st->label, KEYARG(key), missing);

  if (dtype->type != CT_JSON_STRING)
    return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": field \"dtype\": expected a string like \"F32\", found %s",
                    st->label, KEYARG(key), ct_json_type_name(dtype->type));
  if (ct_dtype_from_safetensors(dtype->str, &e->dtype) != 0) {
    if (is_foreign_dtype(dtype->str))
      return ct_error(CT_ERR_UNSUPPORTED,
                      "%s: tensor " KEYFMT ": dtype \"%s\" is not supported by ctrain (supported: F32, F16, BF16, F64, I32, I64, U8)",
                      st->label, KEYARG(key), dtype->str);
    return ct_error(CT_ERR_PARSE,
                    "%s: tensor " KEYFMT ": field \"dtype\": unknown dtype " KEYFMT " (expected F32, F16, BF16, F64, I32, I64 or U8)",
                    st->label, KEYARG(key), KEYARG(dtype->str));
  }

  if (shape->type != CT_JSON_ARRAY)
    return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": field \"shape\": expected an array of integers, found %s",
                    st->label, KEYARG(key), ct_json_type_name(shape->type));
  if (shape->count > CT_MAX_DIMS)
    return ct_error(CT_ERR_UNSUPPORTED, "%s: tensor " KEYFMT ": %zu dimensions, ctrain supports at most %d", st->label,
                    KEYARG(key), shape->count, CT_MAX_DIMS);
  e->ndim = (int)shape->count;
  uint64_t numel = 1;
  for (size_t d = 0; d < shape->count; d++) {
    const ct_json *x = &shape->items[d];
    if (x->type != CT_JSON_NUMBER || !x->is_integer || x->integer < 0)
      return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": field \"shape\": dim %zu: expected a non-negative integer",
                      st->label, KEYARG(key), d);
    if (x->integer > ST_MAX_DIM)
      return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": field \"shape\": dim %zu = %lld is absurdly large (limit 2^48)",
                      st->label, KEYARG(key), d, (long long)x->integer);
    e->shape[d] = x->integer;
  }
  /* With every dim <= 2^48 the product can still overflow; zero-size
   * tensors are legal, so a zero anywhere short-circuits. */
  int overflow = 0;
  for (int d = 0; d < e->ndim; d++)
    if (e->shape[d] == 0) numel = 0;
  if (numel)
    for (int d = 0; d < e->ndim; d++)
      if (__builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel)) overflow = 1;
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(numel, (uint64_t)ct_dtype_size(e->dtype), &nbytes))
    return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": field \"shape\": element count overflows", st->label,
                    KEYARG(key));

  if (offs->type != CT_JSON_ARRAY || offs->count != 2)
    return ct_error(CT_ERR_PARSE,
                    "%s: tensor " KEYFMT ": field \"data_offsets\": expected an array [begin, end] of 2 integers", st->label,
                    KEYARG(key));
  for (int k = 0; k < 2; k++) {
    const ct_json *x = &offs->items[k];
    if (x->type != CT_JSON_NUMBER || !x->is_integer || x->integer < 0)
      return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": field \"data_offsets\": %s: expected a non-negative integer",
                      st->label, KEYARG(key), k ? "end" : "begin");
  }
  e->begin = (uint64_t)offs->items[0].integer;
  e->end = (uint64_t)offs->items[1].integer;
  if (e->end < e->begin)
    return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": data_offsets [%llu, %llu]: end is before begin", st->label,
                    KEYARG(key), (unsigned long long)e->begin, (unsigned long long)e->end);
  if (e->end - e->begin != nbytes) {
    char sh[128];
    return ct_error(CT_ERR_PARSE,
                    "%s: tensor " KEYFMT ": shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] span %llu",
                    st->label, KEYARG(key), ct_shape_str(e->ndim, e->shape, sh, sizeof sh),
                    ct_dtype_safetensors_name(e->dtype), (unsigned long long)nbytes, (unsigned long long)e->begin,
                    (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
  }
  if (e->end > st->data_size)
    return ct_error(CT_ERR_PARSE,
                    "%s: tensor " KEYFMT ": data_offsets [%llu, %llu] extend past the data buffer (%llu bytes after the "
                    "%llu-byte header): file truncated?",
                    st->label, KEYARG(key), (unsigned long long)e->begin, (unsigned long long)e->end,
                    (unsigned long long)st->data_size, (unsigned long long)(st->data_start - 8));
  return CT_OK;
}

static int cmp_offsets(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static _Thread_local const st_entry *name_base;
static int cmp_names(const void *a, const void *b) {
  return strcmp(name_base[*(const size_t *)a].name, name_base[*(const size_t *)b].name);
}

/* Contiguity and coverage: the format has no padding between tensors, so
 * any gap or overlap means the header does not describe this buffer. */
static ct_status check_layout(ct_safetensors *st) {
  qsort(st->e, st->n, sizeof *st->e, cmp_offsets);
  uint64_t at = 0;
  for (size_t i = 0; i < st->n; i++) {
    const st_entry *e = &st->e[i];
    if (e->begin < at)
      return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": data_offsets [%llu, %llu] overlap tensor " KEYFMT
                      " which ends at %llu (tensors must not overlap)",
                      st->label, KEYARG(e->name), (unsigned long long)e->begin, (unsigned long long)e->end,
                      KEYARG(st->e[i - 1].name), (unsigned long long)at);
    if (e->begin > at)
      return ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": data_offsets [%llu, %llu] leave bytes [%llu, %llu) of the "
                      "data buffer unused (tensors must be contiguous)",
                      st->label, KEYARG(e->name), (unsigned long long)e->begin, (unsigned long long)e->end,
                      (unsigned long long)at, (unsigned long long)e->begin);
    at = e->end;
  }
  if (at != st->data_size)
    return ct_error(CT_ERR_PARSE, "%s: tensors cover %llu bytes but the data buffer has %llu (trailing bytes after the "
                    "last tensor)", st->label, (unsigned long long)at, (unsigned long long)st->data_size);
  st->by_name = malloc((st->n ? st->n : 1) * sizeof *st->by_name);
  if (!st->by_name) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", st->label);
  for (size_t i = 0; i < st->n; i++) st->by_name[i] = i;
  name_base = st->e;
  qsort(st->by_name, st->n, sizeof *st->by_name, cmp_names);
  return CT_OK;
}

static ct_status parse_header(ct_safetensors *st, const char *hdr, size_t len) {
  char what[600];
  snprintf(what, sizeof what, "%s: header", st->label);
  ct_json *root = NULL;
  CT_TRY(ct_json_parse(hdr, len, what, NULL, &root));
  ct_status s = CT_OK;
  if (root->type != CT_JSON_OBJECT) {
    s = ct_error(CT_ERR_PARSE, "%s: header must be a JSON object {name: {dtype, shape, data_offsets}}, found %s",
                 st->label, ct_json_type_name(root->type));
    goto done;
  }
  st->e = calloc(root->count ? root->count : 1, sizeof *st->e);
  if (!st->e) {
    s = ct_error(CT_ERR_OUT_OF_MEMORY, "%s: header has %zu keys: out of memory", st->label, root->count);
    goto done;
  }
  for (size_t i = 0; i < root->count && s == CT_OK; i++) {
    const char *key = root->keys[i];
    if (strcmp(key, "__metadata__") == 0) {
      s = parse_metadata(st, &root->items[i]);
      continue;
    }
    if (strlen(key) != root->key_lens[i]) {
      s = ct_error(CT_ERR_PARSE, "%s: tensor " KEYFMT ": name contains a \\u0000 character", st->label, KEYARG(key));
      break;
    }
    st_entry *e = &st->e[st->n];
    e->name = dup_n(key, root->key_lens[i]);
    if (!e->name) {
      s = ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", st->label);
      break;
    }
    st->n++;
    s = parse_tensor(st, key, &root->items[i], e);
  }
  if (s == CT_OK) s = check_layout(st);
done:
  ct_json_free(root);
  return s;
}

/* Shared tail of both open paths once the 8-byte prefix is known to be
 * readable: bounds the header length, fetches and parses it. */
static ct_status open_common(ct_safetensors *st) {
  if (st->file_size < 8)
    return ct_error(CT_ERR_PARSE, "%s: file is %llu bytes, too short for the 8-byte header length (not a safetensors file?)",
                    st->label, (unsigned long long)st->file_size);
  unsigned char prefix[8];
  int err = read_at(st, 0, prefix, 8);
  if (err) return ct_error(CT_ERR_IO, "%s: reading the header length: %s", st->label, strerror(err));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | prefix[i];
  if (n > ST_MAX_HEADER)
    return ct_error(CT_ERR_PARSE, "%s: header length %llu is over the 100 MB limit (corrupt or not a safetensors file)",
                    st->label, (unsigned long long)n);
  if (n > st->file_size - 8)
    return ct_error(CT_ERR_PARSE, "%s: header length %llu exceeds the %llu bytes after the length field (file truncated?)",
                    st->label, (unsigned long long)n, (unsigned long long)(st->file_size - 8));
  st->data_start = 8 + n;
  st->data_size = st->file_size - st->data_start;
  if (st->fd < 0) return parse_header(st, (const char *)st->mem + 8, (size_t)n);
  char *hdr = malloc(n ? (size_t)n : 1);
  if (!hdr) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %llu bytes for the header", st->label, (unsigned long long)n);
  err = read_at(st, 8, hdr, (size_t)n);
  ct_status s = err ? ct_error(CT_ERR_IO, "%s: reading the %llu-byte header: %s", st->label, (unsigned long long)n,
                               strerror(err))
                    : parse_header(st, hdr, (size_t)n);
  free(hdr);
  return s;
}

static ct_safetensors *new_handle(const char *label) {
  ct_safetensors *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  st->fd = -1;
  st->label = dup_n(label, strlen(label));
  if (!st->label) {
    free(st);
    return NULL;
  }
  return st;
}

ct_status ct_safetensors_open(const char *path, ct_safetensors **out) {
  *out = NULL;
  if (!path) return ct_error(CT_ERR_INVALID_ARG, "safetensors: NULL path");
  ct_safetensors *st = new_handle(path);
  if (!st) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  ct_status os = ct_open_regular(path, NULL, &st->fd);
  if (os != CT_OK) {
    ct_safetensors_close(st);
    return os;
  }
  struct stat sb;
  memset(&sb, 0, sizeof sb);
  if (fstat(st->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    int e = errno;
    ct_status s = S_ISREG(sb.st_mode) ? ct_error(CT_ERR_IO, "%s: stat failed: %s", path, strerror(e))
                                      : ct_error(CT_ERR_IO, "%s: not a regular file", path);
    ct_safetensors_close(st);
    return s;
  }
  st->file_size = (uint64_t)sb.st_size;
  ct_status s = open_common(st);
  if (s != CT_OK) {
    ct_safetensors_close(st);
    return s;
  }
  *out = st;
  return CT_OK;
}

ct_status ct_safetensors_open_mem(const void *data, size_t size, const char *name, ct_safetensors **out) {
  *out = NULL;
  if (!data && size) return ct_error(CT_ERR_INVALID_ARG, "safetensors: NULL buffer of %zu bytes", size);
  ct_safetensors *st = new_handle(name ? name : "<memory>");
  if (!st) return ct_error(CT_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
  st->mem = data;
  st->file_size = size;
  ct_status s = open_common(st);
  if (s != CT_OK) {
    ct_safetensors_close(st);
    return s;
  }
  *out = st;
  return CT_OK;
}

size_t ct_safetensors_count(const ct_safetensors *st) { return st ? st->n : 0; }

ct_status ct_safetensors_info(const ct_safetensors *st, size_t i, const char **name, ct_dtype *dtype, int *ndim,
                              int64_t *shape) {
  if (!st || i >= st->n)
    return ct_error(CT_ERR_INVALID_ARG, "%s: tensor index %zu out of range (%zu tensors)", st ? st->label : "safetensors",
                    i, st ? st->n : 0);
  const st_entry *e = &st->e[i];
  if (name) *name = e->name;
  if (dtype) *dtype = e->dtype;
  if (ndim) *ndim = e->ndim;
  if (shape)
    for (int d = 0; d < e->ndim; d++) shape[d] = e->shape[d];
  return CT_OK;
}

long ct_safetensors_find(const ct_safetensors *st, const char *name) {
  if (!st || !name) return -1;
  size_t lo = 0, hi = st->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(st->e[st->by_name[mid]].name, name);
    if (c == 0) return (long)st->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

size_t ct_safetensors_nbytes(const ct_safetensors *st, size_t i) {
  if (!st || i >= st->n) return 0;
  return (size_t)(st->e[i].end - st->e[i].begin);
}

ct_status ct_safetensors_read(const ct_safetensors *st, size_t i, void *dst, size_t dst_bytes) {
  if (!st || i >= st->n) return ct_safetensors_info(st, i, NULL, NULL, NULL, NULL);
  const st_entry *e = &st->e[i];
  size_t nb = (size_t)(e->end - e->begin);
  if (dst_bytes != nb)
    return ct_error(CT_ERR_INVALID_ARG, "%s: tensor " KEYFMT ": destination has %zu bytes, tensor has %zu", st->label,
                    KEYARG(e->name), dst_bytes, nb);
  if (nb == 0) return CT_OK;
  if (!dst) return ct_error(CT_ERR_INVALID_ARG, "%s: tensor " KEYFMT ": NULL destination", st->label, KEYARG(e->name));
  int err = read_at(st, st->data_start + e->begin, dst, nb);
  if (err)
    return ct_error(CT_ERR_IO, "%s: tensor " KEYFMT ": reading %zu bytes at offset %llu: %s", st->label, KEYARG(e->name),
                    nb, (unsigned long long)(st->data_start + e->begin),
                    err == EIO ? "short read (file changed since it was opened?)" : strerror(err));
  return CT_OK;
}

static int is_float(ct_dtype t) { return t == CT_F32 || t == CT_F16 || t == CT_BF16 || t == CT_F64; }

/* NaN and +-inf among n values of dtype t (float dtypes; 0 otherwise). */
static size_t count_nonfinite(const void *p, ct_dtype t, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (t == CT_F32) bad += !isfinite(((const float *)p)[i]);
    else if (t == CT_F64) bad += !isfinite(((const double *)p)[i]);
    else if (t == CT_F16) bad += (((const uint16_t *)p)[i] & 0x7c00u) == 0x7c00u;
    else if (t == CT_BF16) bad += (((const uint16_t *)p)[i] & 0x7f80u) == 0x7f80u;
  }
  return bad;
}

ct_status ct_safetensors_count_nonfinite(const ct_safetensors *st, size_t i, size_t *count) {
  *count = 0;
  if (!st || i >= st->n) return ct_safetensors_info(st, i, NULL, NULL, NULL, NULL);
  const st_entry *e = &st->e[i];
  if (!is_float(e->dtype)) return CT_OK;
  size_t es = ct_dtype_size(e->dtype), nb = (size_t)(e->end - e->begin), chunk = ((size_t)1 << 20) / es * es;
  unsigned char *buf = malloc(nb < chunk ? (nb ? nb : 1) : chunk);
  if (!buf) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", st->label);
  for (size_t at = 0; at < nb; at += chunk) {
    size_t n = nb - at < chunk ? nb - at : chunk;
    int err = read_at(st, st->data_start + e->begin + at, buf, n);
    if (err) {
      free(buf);
      return ct_error(CT_ERR_IO, "%s: tensor " KEYFMT ": reading %zu bytes: %s", st->label, KEYARG(e->name), n,
                      err == EIO ? "short read (file changed since it was opened?)" : strerror(err));
    }
    *count += count_nonfinite(buf, e->dtype, n / es);
  }
  free(buf);
  return CT_OK;
}

ct_status ct_safetensors_read_as(const ct_safetensors *st, size_t i, ct_dtype want, void *dst, size_t n) {
  if (!st || i >= st->n) return ct_safetensors_info(st, i, NULL, NULL, NULL, NULL);
  const st_entry *e = &st->e[i];
  size_t have_size = ct_dtype_size(e->dtype), want_size = ct_dtype_size(want);
  size_t numel = (size_t)((e->end - e->begin) / have_size);
  if (n != numel)
    return ct_error(CT_ERR_INVALID_ARG, "%s: tensor " KEYFMT ": destination has %zu elements, tensor has %zu", st->label,
                    KEYARG(e->name), n, numel);
  if (want == e->dtype) return ct_safetensors_read(st, i, dst, n * want_size);
  if (!is_float(want) || !is_float(e->dtype))
    return ct_error(CT_ERR_UNSUPPORTED, "%s: tensor " KEYFMT ": cannot convert %s to %s (only between F32, F16, BF16, F64)",
                    st->label, KEYARG(e->name), ct_dtype_safetensors_name(e->dtype),
                    ct_dtype_safetensors_name(want) ? ct_dtype_safetensors_name(want) : "an invalid dtype");
  if (n == 0) return CT_OK;
  enum { CHUNK = 1 << 16 };
  size_t chunk = n < CHUNK ? n : CHUNK;
  void *buf = malloc(chunk * have_size);
  if (!buf) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory converting " KEYFMT, st->label, KEYARG(e->name));
  ct_status s = CT_OK;
  for (size_t done = 0; done < n; done += chunk) {
    size_t m = n - done < chunk ? n - done : chunk;
    int err = read_at(st, st->data_start + e->begin + done * have_size, buf, m * have_size);
    if (err) {
      s = ct_error(CT_ERR_IO, "%s: tensor " KEYFMT ": read failed: %s", st->label, KEYARG(e->name),
                   err == EIO ? "short read (file changed since it was opened?)" : strerror(err));
      break;
    }
    ct_convert(buf, e->dtype, (char *)dst + done * want_size, want, m);
  }
  free(buf);
  return s;
}

const char *ct_safetensors_metadata(const ct_safetensors *st, const char *key) {
  if (!st || !key) return NULL;
  for (size_t i = 0; i < st->n_meta; i++)
    if (strcmp(st->meta_key[i], key) == 0) return st->meta_val[i];
  return NULL;
}

size_t ct_safetensors_metadata_count(const ct_safetensors *st) { return st ? st->n_meta : 0; }

ct_status ct_safetensors_metadata_at(const ct_safetensors *st, size_t i, const char **key, const char **value) {
  if (!st || i >= st->n_meta)
    return ct_error(CT_ERR_INVALID_ARG, "%s: metadata index %zu out of range", st ? st->label : "safetensors", i);
  if (key) *key = st->meta_key[i];
  if (value) *value = st->meta_val[i];
  return CT_OK;
}
