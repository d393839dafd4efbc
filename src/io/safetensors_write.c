/* safetensors writer: the reference implementation's layout, written
 * atomically. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/atomic_file.h"
#include "ctrain/device.h"
#include "ctrain/safetensors.h"

/* A growable byte buffer for the header JSON. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + n + 1) nc *= 2;
    char *q = realloc(b->p, nc);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = nc;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* JSON string with the escapes serde_json emits: \" \\ and control
 * characters (\b \f \n \r \t, else \u00XX); UTF-8 passes through. */
static void put_json_string(sbuf *b, const char *s) {
  put(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char esc[8];
    switch (*c) {
      case '"': put(b, "\\\"", 2); break;
      case '\\': put(b, "\\\\", 2); break;
      case '\b': put(b, "\\b", 2); break;
      case '\f': put(b, "\\f", 2); break;
      case '\n': put(b, "\\n", 2); break;
      case '\r': put(b, "\\r", 2); break;
      case '\t': put(b, "\\t", 2); break;
      default:
        if (*c < 0x20) {
          snprintf(esc, sizeof esc, "\\u%04x", *c);
          put(b, esc, 6);
        } else {
          put(b, (const char *)c, 1);
        }
    }
  }
  put(b, "\"", 1);
}

static int valid_utf8(const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  while (*s) {
    unsigned c = *s, cp, min;
    size_t len;
    if (c < 0x80) {
      s++;
      continue;
    }
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    for (size_t i = 1; i < len; i++) {
      if ((s[i] & 0xc0) != 0x80) return 0;
      cp = (cp << 6) | (s[i] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    s += len;
  }
  return 1;
}

/* The reference orders dtypes by alignment (BOOL < U8 < ... < F16 < BF16 <
 * I32 < F32 < F64 < I64) and stores the largest first; ranks follow its
 * enum so files are byte-identical to what Python's save_file writes. */
static int dtype_rank(ct_dtype t) {
  switch (t) {
    case CT_U8: return 1;
    case CT_F16: return 7;
    case CT_BF16: return 8;
    case CT_I32: return 9;
    case CT_F32: return 11;
    case CT_F64: return 12;
    case CT_I64: return 13;
    default: return 0;
  }
}

static _Thread_local const ct_named_tensor *order_base;
static int cmp_order(const void *a, const void *b) {
  const ct_named_tensor *x = &order_base[*(const size_t *)a], *y = &order_base[*(const size_t *)b];
  int rx = dtype_rank(x->t.dtype), ry = dtype_rank(y->t.dtype);
  if (rx != ry) return ry - rx;
  return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(order_base[*(const size_t *)a].name, order_base[*(const size_t *)b].name);
}

/* Two tensors with one name would make the file ambiguous to every reader. */
static ct_status check_unique(const char *path, const ct_named_tensor *t, size_t n) {
  if (n < 2) return CT_OK;
  size_t *idx = malloc(n * sizeof *idx);
  if (!idx) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  for (size_t i = 0; i < n; i++) idx[i] = i;
  order_base = t;
  qsort(idx, n, sizeof *idx, cmp_name);
  ct_status s = CT_OK;
  for (size_t i = 1; i < n; i++)
    if (strcmp(t[idx[i - 1]].name, t[idx[i]].name) == 0) {
      s = ct_error(CT_ERR_INVALID_ARG, "%s: tensor name \"%.200s\" given twice", path, t[idx[i]].name);
      break;
    }
  free(idx);
  return s;
}

static ct_status check_tensor(const char *path, const ct_named_tensor *nt) {
  const char *name = nt->name;
  if (!name || !*name) return ct_error(CT_ERR_INVALID_ARG, "%s: tensor with an empty or NULL name", path);
  if (strcmp(name, "__metadata__") == 0)
    return ct_error(CT_ERR_INVALID_ARG, "%s: \"__metadata__\" is reserved and cannot name a tensor", path);
  if (!valid_utf8(name)) return ct_error(CT_ERR_INVALID_ARG, "%s: tensor name \"%.200s\" is not valid UTF-8", path, name);
  if (dtype_rank(nt->t.dtype) == 0)
    return ct_error(CT_ERR_INVALID_ARG, "%s: tensor \"%.200s\": invalid dtype %d", path, name, (int)nt->t.dtype);
  if (nt->t.ndim < 0 || nt->t.ndim > CT_MAX_DIMS)
    return ct_error(CT_ERR_INVALID_ARG, "%s: tensor \"%.200s\": %d dims (0..%d allowed)", path, name, nt->t.ndim,
                    CT_MAX_DIMS);
  for (int d = 0; d < nt->t.ndim; d++)
    if (nt->t.shape[d] < 0)
      return ct_error(CT_ERR_INVALID_ARG, "%s: tensor \"%.200s\": negative dim %d = %lld", path, name, d,
                      (long long)nt->t.shape[d]);
  if (!nt->t.data && ct_tensor_nbytes(&nt->t) > 0)
    return ct_error(CT_ERR_INVALID_ARG, "%s: tensor \"%.200s\": NULL data", path, name);
  return CT_OK;
}

static ct_status build_header(const ct_named_tensor *t, const size_t *order, size_t n, const char *const *meta_kv,
                              sbuf *h, const char *path) {
  puts_(h, "{");
  int first = 1;
  if (meta_kv) {
    puts_(h, "\"__metadata__\":{");
    for (size_t i = 0; meta_kv[i]; i += 2) {
      if (!meta_kv[i + 1])
        return ct_error(CT_ERR_INVALID_ARG, "%s: metadata key \"%.200s\" has no value (meta_kv must be key, value pairs)",
                        path, meta_kv[i]);
      if (!valid_utf8(meta_kv[i]) || !valid_utf8(meta_kv[i + 1]))
        return ct_error(CT_ERR_INVALID_ARG, "%s: metadata entry \"%.200s\" is not valid UTF-8", path, meta_kv[i]);
      for (size_t j = 0; j < i; j += 2)
        if (strcmp(meta_kv[j], meta_kv[i]) == 0)
          return ct_error(CT_ERR_INVALID_ARG, "%s: metadata key \"%.200s\" given twice", path, meta_kv[i]);
      if (i) puts_(h, ",");
      put_json_string(h, meta_kv[i]);
      puts_(h, ":");
      put_json_string(h, meta_kv[i + 1]);
    }
    puts_(h, "}");
    first = 0;
  }
  uint64_t off = 0;
  for (size_t k = 0; k < n; k++) {
    const ct_named_tensor *nt = &t[order[k]];
    if (!first) puts_(h, ",");
    first = 0;
    put_json_string(h, nt->name);
    puts_(h, ":{\"dtype\":\"");
    puts_(h, ct_dtype_safetensors_name(nt->t.dtype));
    puts_(h, "\",\"shape\":[");
    char num[64];
    for (int d = 0; d < nt->t.ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)nt->t.shape[d]);
      puts_(h, num);
    }
    uint64_t nb = ct_tensor_nbytes(&nt->t);
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + nb));
    puts_(h, num);
    off += nb;
  }
  puts_(h, "}");
  /* Padding to 8 keeps every tensor 8-aligned in an mmap of the file. */
  while (h->len % 8) puts_(h, " ");
  if (h->oom) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory building the header", path);
  return CT_OK;
}

/* Device tensors are staged through a bounded host buffer. */
static ct_status write_data(FILE *fp, const ct_named_tensor *nt, const char *path) {
  size_t nb = ct_tensor_nbytes(&nt->t);
  if (nb == 0) return CT_OK;
  if (!nt->t.device) {
    if (fwrite(nt->t.data, 1, nb, fp) != nb)
      return ct_error(CT_ERR_IO, "%s: writing tensor \"%.200s\" (%zu bytes) failed: %s", path, nt->name, nb,
                      strerror(errno));
    return CT_OK;
  }
  size_t chunk = nb < ((size_t)1 << 24) ? nb : ((size_t)1 << 24);
  char *buf = malloc(chunk);
  if (!buf) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory staging \"%.200s\"", path, nt->name);
  ct_status s = CT_OK;
  for (size_t done = 0; done < nb && s == CT_OK; done += chunk) {
    size_t m = nb - done < chunk ? nb - done : chunk;
    s = ct_device_copy(NULL, buf, nt->t.device, (const char *)nt->t.data + done, m);
    if (s != CT_OK) s = ct_error_wrap(s, "%s: copying tensor \"%.200s\" to the host", path, nt->name);
    else if (fwrite(buf, 1, m, fp) != m)
      s = ct_error(CT_ERR_IO, "%s: writing tensor \"%.200s\" failed: %s", path, nt->name, strerror(errno));
  }
  free(buf);
  return s;
}

ct_status ct_safetensors_write(const char *path, const ct_named_tensor *tensors, size_t n,
                               const char *const *meta_kv) {
  if (!path) return ct_error(CT_ERR_INVALID_ARG, "safetensors write: NULL path");
  if (n && !tensors) return ct_error(CT_ERR_INVALID_ARG, "%s: NULL tensor array", path);
  for (size_t i = 0; i < n; i++) CT_TRY(check_tensor(path, &tensors[i]));
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  if (!order) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  for (size_t i = 0; i < n; i++) order[i] = i;
  order_base = tensors;
  qsort(order, n, sizeof *order, cmp_order);
  ct_status s = check_unique(path, tensors, n);
  sbuf h = {0};
  if (s == CT_OK) s = build_header(tensors, order, n, meta_kv, &h, path);
  ct_atomic_file *af = NULL;
  if (s == CT_OK) s = ct_atomic_file_open(path, &af);
  if (s == CT_OK) {
    FILE *fp = ct_atomic_file_stream(af);
    unsigned char len8[8];
    uint64_t hl = h.len;
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hl >> (8 * i));
    if (fwrite(len8, 1, 8, fp) != 8 || fwrite(h.p, 1, h.len, fp) != h.len)
      s = ct_error(CT_ERR_IO, "%s: writing the header failed: %s", path, strerror(errno));
    for (size_t k = 0; k < n && s == CT_OK; k++) s = write_data(fp, &tensors[order[k]], path);
    if (s == CT_OK) s = ct_atomic_file_commit(af);
    else ct_atomic_file_abort(af);
  }
  free(h.p);
  free(order);
  return s;
}
