/* State-dict loading: matching model parameter names to file keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/device.h"
#include "ctrain/safetensors.h"

#define PREFIX "module."
#define PREFIX_LEN 7

void ct_load_report_free(ct_load_report *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_missing; i++) free(r->missing[i]);
  for (size_t i = 0; i < r->n_unexpected; i++) free(r->unexpected[i]);
  free(r->missing);
  free(r->unexpected);
  memset(r, 0, sizeof *r);
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* The file index for a model name: exact key first, then the same key
 * with "module." removed or added (DataParallel/DDP state dicts). */
static long match_key(const ct_safetensors *st, const char *name, int *prefixed) {
  *prefixed = 0;
  long i = ct_safetensors_find(st, name);
  if (i >= 0) return i;
  if (strncmp(name, PREFIX, PREFIX_LEN) == 0) {
    i = ct_safetensors_find(st, name + PREFIX_LEN);
  } else {
    size_t n = strlen(name);
    char *with = malloc(n + PREFIX_LEN + 1);
    if (!with) return -1;
    memcpy(with, PREFIX, PREFIX_LEN);
    memcpy(with + PREFIX_LEN, name, n + 1);
    i = ct_safetensors_find(st, with);
    free(with);
  }
  if (i >= 0) *prefixed = 1;
  return i;
}

/* Appends `"a", "b"` lists to a message buffer, truncating politely. */
static void append_list(char *buf, size_t cap, const char *title, char **items, size_t n) {
  size_t len = strlen(buf);
  len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s%s: ", len ? " " : "", title);
  for (size_t i = 0; i < n && len < cap; i++) {
    if (len + strlen(items[i]) + 16 > cap - 32) {
      len += (size_t)snprintf(buf + len, cap - len, "... (%zu more)", n - i);
      break;
    }
    len += (size_t)snprintf(buf + len, cap - len, "%s\"%s\"", i ? ", " : "", items[i]);
  }
  if (len < cap) snprintf(buf + len, cap - len, ".");
}

static int is_float(ct_dtype t) { return t == CT_F32 || t == CT_F16 || t == CT_BF16 || t == CT_F64; }

static ct_status read_into(const ct_safetensors *st, size_t idx, ct_named_tensor *d, ct_dtype file_dtype) {
  size_t numel = (size_t)ct_tensor_numel(&d->t);
  if (!d->t.device) {
    if (file_dtype == d->t.dtype) return ct_safetensors_read(st, idx, d->t.data, ct_tensor_nbytes(&d->t));
    return ct_safetensors_read_as(st, idx, d->t.dtype, d->t.data, numel);
  }
  /* Device destination: read on the host, then one copy. */
  size_t nb = ct_tensor_nbytes(&d->t);
  void *tmp = malloc(nb ? nb : 1);
  if (!tmp) return ct_error(CT_ERR_OUT_OF_MEMORY, "loading \"%s\": cannot stage %zu bytes", d->name, nb);
  ct_status s = ct_safetensors_read_as(st, idx, d->t.dtype, tmp, numel);
  if (s == CT_OK) s = ct_device_copy(d->t.device, d->t.data, NULL, tmp, nb);
  free(tmp);
  return s;
}

ct_status ct_safetensors_load_named(const char *path, ct_named_tensor *dst, size_t n, int strict,
                                    ct_load_report *report) {
  ct_load_report local;
  ct_load_report *r = report ? report : &local;
  memset(r, 0, sizeof *r);
  if (n && !dst) return ct_error(CT_ERR_INVALID_ARG, "%s: NULL destination array", path ? path : "safetensors");
  ct_safetensors *st = NULL;
  CT_TRY(ct_safetensors_open(path, &st));
  size_t nf = ct_safetensors_count(st);
  long *match = malloc((n ? n : 1) * sizeof *match);
  char *used = calloc(nf ? nf : 1, 1);
  r->missing = malloc((n ? n : 1) * sizeof *r->missing);
  r->unexpected = malloc((nf ? nf : 1) * sizeof *r->unexpected);
  ct_status s = CT_OK;
  if (!match || !used || !r->missing || !r->unexpected) s = ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", path);

  /* Pass 1: names, shapes and dtypes, before anything is written. */
  for (size_t i = 0; s == CT_OK && i < n; i++) {
    ct_named_tensor *d = &dst[i];
    if (!d->name) {
      s = ct_error(CT_ERR_INVALID_ARG, "%s: destination %zu has no name", path, i);
      break;
    }
    int prefixed = 0;
    match[i] = match_key(st, d->name, &prefixed);
    if (match[i] < 0) {
      if (!(r->missing[r->n_missing] = dup_str(d->name))) s = ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
      else r->n_missing++;
      continue;
    }
    used[match[i]] = 1;
    r->n_prefixed += (size_t)prefixed;
    const char *key;
    ct_dtype fdt;
    int fnd;
    int64_t fshape[CT_MAX_DIMS];
    ct_safetensors_info(st, (size_t)match[i], &key, &fdt, &fnd, fshape);
    ct_tensor ft = ct_tensor_view(NULL, fdt, fnd, fshape);
    if (!ct_tensor_same_shape(&ft, &d->t)) {
      char a[160], b[160];
      s = ct_error(CT_ERR_SHAPE, "%s: key \"%s\": shape mismatch: file has %s, model expects %s", path, key,
                   ct_shape_str(fnd, fshape, a, sizeof a), ct_shape_str(d->t.ndim, d->t.shape, b, sizeof b));
      break;
    }
    if (fdt != d->t.dtype && !(is_float(fdt) && is_float(d->t.dtype))) {
      s = ct_error(CT_ERR_UNSUPPORTED, "%s: key \"%s\": file dtype %s cannot be converted to %s", path, key,
                   ct_dtype_safetensors_name(fdt), ct_dtype_safetensors_name(d->t.dtype) ? ct_dtype_safetensors_name(d->t.dtype) : "?");
      break;
    }
    if (!d->t.data && ct_tensor_nbytes(&d->t) > 0) {
      s = ct_error(CT_ERR_INVALID_ARG, "%s: destination \"%s\" has no data pointer", path, d->name);
      break;
    }
  }
  for (size_t j = 0; s == CT_OK && j < nf; j++) {
    if (used[j]) continue;
    const char *key;
    ct_safetensors_info(st, j, &key, NULL, NULL, NULL);
    if (!(r->unexpected[r->n_unexpected] = dup_str(key))) s = ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    else r->n_unexpected++;
  }
  if (s == CT_OK && strict && (r->n_missing || r->n_unexpected)) {
    char msg[1800];
    msg[0] = 0;
    if (r->n_missing) append_list(msg, sizeof msg, "Missing key(s)", r->missing, r->n_missing);
    if (r->n_unexpected) append_list(msg, sizeof msg, "Unexpected key(s)", r->unexpected, r->n_unexpected);
    s = ct_error(CT_ERR_NOT_FOUND, "%s: error(s) loading state dict: %s", path, msg);
  }
  /* Weights with NaN or inf were trained on and saved again, never
   * noticed: refused before anything is written (one more read of the
   * file, from the page cache by then). */
  for (size_t i = 0; s == CT_OK && i < n; i++) {
    size_t bad = 0;
    if (match[i] >= 0) s = ct_safetensors_count_nonfinite(st, (size_t)match[i], &bad);
    if (s == CT_OK && bad)
      s = ct_error(CT_ERR_PARSE, "%s: tensor \"%s\" holds %zu non-finite values (NaN or inf) of %lld; refusing to load it",
                   path, dst[i].name, bad, (long long)ct_tensor_numel(&dst[i].t));
  }

  /* Pass 2: the data. */
  for (size_t i = 0; s == CT_OK && i < n; i++) {
    if (match[i] < 0) continue;
    ct_dtype fdt;
    ct_safetensors_info(st, (size_t)match[i], NULL, &fdt, NULL, NULL);
    s = read_into(st, (size_t)match[i], &dst[i], fdt);
    if (s == CT_OK) {
      r->n_loaded++;
      r->n_converted += fdt != dst[i].t.dtype;
    }
  }
  free(match);
  free(used);
  ct_safetensors_close(st);
  if (r == &local) ct_load_report_free(&local);
  return s;
}
