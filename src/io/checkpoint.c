#include "ctrain/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/optim.h"

/* Named views of the model state (prefix + name), optionally followed by
 * the optimizer's state buffers. Names are owned by the returned array. */
static ct_status collect(ct_model *m, ct_optimizer *o, const char *prefix, ct_named_tensor **out, size_t *n_out) {
  size_t n = (size_t)ct_model_state_count(m) + (o ? ct_optimizer_state_count(o) : 0);
  ct_named_tensor *t = calloc(n ? n : 1, sizeof *t);
  if (!t) return ct_error(CT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
  size_t k = 0;
  for (int i = 0; i < ct_model_state_count(m); i++, k++) {
    const ct_state_entry *e = ct_model_state(m, i);
    size_t len = strlen(prefix) + strlen(e->name) + 1;
    char *name = malloc(len);
    if (!name) goto oom;
    snprintf(name, len, "%s%s", prefix, e->name);
    t[k].name = name;
    t[k].t = e->value;
    /* Host views are read in place; device-resident state (CUDA) is staged
     * through the host by the safetensors reader and writer. */
    if (!t[k].t.device || ct_device_get_type(t[k].t.device) != CT_DEVICE_CUDA) t[k].t.device = NULL;
  }
  for (size_t i = 0; o && i < ct_optimizer_state_count(o); i++, k++) {
    const char *sn;
    float *data;
    size_t cnt;
    CT_TRY(ct_optimizer_state(o, i, &sn, &data, &cnt));
    size_t len = strlen(sn) + 8;
    char *name = malloc(len);
    if (!name) goto oom;
    snprintf(name, len, "optim.%s", sn);
    t[k].name = name;
    t[k].t = ct_tensor_1d(data, CT_F32, (int64_t)cnt);
    t[k].t.device = ct_optimizer_device(o);
  }
  *out = t;
  *n_out = k;
  return CT_OK;
oom:
  for (size_t i = 0; i < k; i++) free((char *)t[i].name);
  free(t);
  return ct_error(CT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
}

static void release(ct_named_tensor *t, size_t n) {
  for (size_t i = 0; i < n; i++) free((char *)t[i].name);
  free(t);
}

ct_status ct_weights_save(ct_model *m, const char *path) {
  ct_named_tensor *t;
  size_t n;
  CT_TRY(collect(m, NULL, "", &t, &n));
  const char *meta[] = {"format", "pt", "producer", "ctrain", "model", ct_model_name(m), NULL};
  ct_status s = ct_safetensors_write(path, t, n, meta);
  release(t, n);
  return s;
}

ct_status ct_weights_load(ct_model *m, const char *path, int strict, ct_load_report *report) {
  ct_named_tensor *t;
  size_t n;
  CT_TRY(collect(m, NULL, "", &t, &n));
  ct_load_report local = {0};
  ct_status s = ct_safetensors_load_named(path, t, n, strict, report ? report : &local);
  ct_load_report_free(&local);
  release(t, n);
  return s;
}

ct_status ct_checkpoint_save(const char *path, ct_model *m, ct_optimizer *o, const char *const *meta_kv) {
  ct_named_tensor *t;
  size_t n;
  CT_TRY(collect(m, o, "model.", &t, &n));
  ct_status s = ct_safetensors_write(path, t, n, meta_kv);
  release(t, n);
  return s;
}

ct_status ct_checkpoint_load(const char *path, ct_model *m, ct_optimizer *o, ct_safetensors **meta) {
  *meta = NULL;
  ct_safetensors *st;
  CT_TRY(ct_safetensors_open(path, &st));
  const char *fmt = ct_safetensors_metadata(st, "format");
  /* The metadata strings live in st: format the message before closing. */
  if (!fmt || strcmp(fmt, "ctrain-checkpoint-1")) {
    ct_status e = ct_error(CT_ERR_PARSE, "%s: not a ctrain checkpoint (metadata 'format' is %s%s%s, expected 'ctrain-checkpoint-1')",
                           path, fmt ? "'" : "", fmt ? fmt : "missing", fmt ? "'" : "");
    ct_safetensors_close(st);
    return e;
  }
  const char *mn = ct_safetensors_metadata(st, "model");
  if (!mn || strcmp(mn, ct_model_name(m))) {
    ct_status e = ct_error(CT_ERR_INVALID_ARG, "%s: checkpoint is of model '%s', not '%s'; resume with the same --model",
                           path, mn ? mn : "?", ct_model_name(m));
    ct_safetensors_close(st);
    return e;
  }
  ct_named_tensor *t;
  size_t n;
  ct_status s = collect(m, o, "model.", &t, &n);
  if (s == CT_OK) {
    ct_load_report rep = {0};
    s = ct_safetensors_load_named(path, t, n, 1, &rep);
    ct_load_report_free(&rep);
    release(t, n);
  }
  if (s != CT_OK) {
    ct_safetensors_close(st);
    return s;
  }
  *meta = st;
  return CT_OK;
}
