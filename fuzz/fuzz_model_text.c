/* libFuzzer target for the model text format (docs/MODEL_FORMAT.md,
 * src/nn/model_text.c; see fuzz/README.md).
 *
 * The bytes are written to a scratch file and parsed with
 * ct_model_parse_file. A rejection must leave no model and a message that
 * starts with the file's path and, unless it is about the whole file or an
 * allocation, the number of a line the input has ("<path>:<line>: ...").
 * An accepted model must be usable: its state entries, parameter count,
 * state bytes and flat buffers agree (each f32 entry at a multiple of 256
 * bytes), parameters are finite and gradients zero, and (when its activations are small) it prepares on the reference
 * device, prints a summary whose totals match, and (when cheap) runs a
 * training forward and backward. A model with more than 256 MiB of
 * parameters is reported too: a small file should not be able to ask for
 * that much without it being looked at.
 *
 * The body is shared with tests/unit/test_model_text_mutate.c, which
 * includes this file with CT_FUZZ_BODY_ONLY defined and drives it with the
 * deterministic mutation loop of tests/mutate_util.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "fuzz_scratch.h"
#include "nn/model_impl.h"

#define FUZZ_MT_MAX_PARAM_BYTES ((size_t)256 << 20)
/* Prepare (which allocates the step's arena) only below this many bytes of
 * per-sample activations, and run a step only below this many
 * multiply-adds per sample: the reference kernels are slow by design. */
#define FUZZ_MT_MAX_ACT_BYTES ((double)(16 << 20))
#define FUZZ_MT_MAX_STEP_COST ((double)(1 << 20))
#define FUZZ_MT_BATCH 2

static ct_device *fuzz_mt_dev;
static long fuzz_mt_accepted, fuzz_mt_rejected, fuzz_mt_stepped;

/* Records why an input was handled inconsistently (the twin prints
 * ct_last_error(); the libFuzzer entry prints it before aborting). */
static int fuzz_mt_fail(const char *what, const char *detail) {
  char d[600]; /* detail is often ct_last_error() itself, which ct_error overwrites */
  snprintf(d, sizeof d, "%s", detail ? detail : "");
  ct_error(CT_ERR_INTERNAL, "fuzz_model_text: %s%s%s", what, d[0] ? ": " : "", d);
  return -1;
}

/* Lines in the input as the parser counts them: a last line without '\n'
 * counts too. */
static long fuzz_mt_lines(const uint8_t *data, size_t size) {
  long n = 0;
  for (size_t i = 0; i < size; i++) n += data[i] == '\n';
  return n + (size && data[size - 1] != '\n');
}

/* A rejection's message: "<path>:<line>: ..." with a line the input has,
 * or "<path>: ..." for what concerns the whole file or an allocation. */
static int fuzz_mt_check_error(ct_status s, const char *path, long lines) {
  const char *msg = ct_last_error();
  if (!msg[0]) return fuzz_mt_fail("rejected without a message", ct_status_name(s));
  size_t pl = strlen(path);
  if (strncmp(msg, path, pl) != 0 || msg[pl] != ':') return fuzz_mt_fail("message does not start with the path", msg);
  const char *rest = msg + pl + 1;
  if (rest[0] >= '0' && rest[0] <= '9') {
    char *end;
    long line = strtol(rest, &end, 10);
    if (*end != ':' || line < 1 || line > lines) return fuzz_mt_fail("message names a line the file lacks", msg);
    return 0;
  }
  if (s == CT_ERR_OUT_OF_MEMORY || s == CT_ERR_IO) return 0;
  if (s == CT_ERR_PARSE && (!strncmp(rest, " no layers", 10) || !strncmp(rest, " no input shape", 15))) return 0;
  return fuzz_mt_fail("message names no line", msg);
}

/* Per-sample multiply-adds of a forward pass, roughly, from the layers'
 * shapes: out x (reduction per output) + in, the reduction being the
 * conv's cin/groups x kernel, the linear's in_features or the pooling
 * window. */
static double fuzz_mt_step_cost(const ct_model *m, double *act_bytes) {
  double cost = 0, act = (double)ct_shape_numel(m->in_ndim, m->in_shape);
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    double out = (double)ct_shape_numel(l->out_ndim, l->out_shape);
    double in = (double)ct_shape_numel(l->in_ndim[0], l->in_shape[0]), per = 1;
    if (l->cls == &ct_layer_conv2d) per = (double)l->ip[0] / l->ip[10] * l->ip[2] * l->ip[3];
    else if (l->cls == &ct_layer_linear) per = l->ip[0];
    else if (l->cls == &ct_layer_maxpool2d || l->cls == &ct_layer_avgpool2d) per = (double)l->ip[0] * l->ip[1];
    else if (l->cls == &ct_layer_adaptive_avgpool2d || l->cls == &ct_layer_adaptive_maxpool2d)
      per = ((double)l->in_shape[0][1] / l->ip[0] + 2) * ((double)l->in_shape[0][2] / l->ip[1] + 2);
    cost += out * per + in;
    act += out;
  }
  *act_bytes = act * 4;
  return cost;
}

/* "Total params: 1,234" in the summary, or -1. */
static long long fuzz_mt_summary_count(const char *text, const char *key) {
  const char *at = strstr(text, key);
  if (!at) return -1;
  long long v = 0;
  int digits = 0;
  for (const char *c = at + strlen(key); *c && *c != '\n'; c++)
    if (*c >= '0' && *c <= '9') v = v * 10 + (*c - '0'), digits++;
    else if (*c != ',') return -1;
  return digits ? v : -1;
}

/* Prepares m on the reference device, prints its summary and, when cheap,
 * runs one training step on a small batch. */
static int fuzz_mt_use(ct_model *m, int64_t n_params) {
  if (!fuzz_mt_dev && ct_device_open("ref", &fuzz_mt_dev) != CT_OK) return fuzz_mt_fail("cannot open ref", ct_last_error());
  double act_bytes;
  double cost = fuzz_mt_step_cost(m, &act_bytes);
  if (act_bytes * FUZZ_MT_BATCH > FUZZ_MT_MAX_ACT_BYTES) return 0;
  ct_status ps = ct_model_prepare(m, fuzz_mt_dev, FUZZ_MT_BATCH, 1);
  if (ps == CT_ERR_OUT_OF_MEMORY) return 0; /* the host's limit, not the model's fault (see fuzz/README.md) */
  if (ps != CT_OK) return fuzz_mt_fail("accepted model does not prepare", ct_last_error());
  if (ct_model_plan_bytes(m) == 0) return fuzz_mt_fail("empty memory plan", NULL);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return 0;
  ct_status s = ct_model_summary(m, FUZZ_MT_BATCH, f);
  fclose(f);
  long long total = text ? fuzz_mt_summary_count(text, "Total params: ") : -1;
  long long trainable = text ? fuzz_mt_summary_count(text, "Trainable params: ") : -1;
  free(text);
  if (s != CT_OK) return fuzz_mt_fail("summary failed", ct_last_error());
  if (total != n_params || trainable != n_params) return fuzz_mt_fail("summary totals differ from the model's", NULL);
  if (cost > FUZZ_MT_MAX_STEP_COST) return 0;

  int c, h, w;
  ct_model_input_shape(m, &c, &h, &w);
  int64_t per = (int64_t)c * h * w;
  float *x = malloc((size_t)(per * FUZZ_MT_BATCH) * sizeof *x);
  if (!x) return 0;
  for (int64_t i = 0; i < per * FUZZ_MT_BATCH; i++) x[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
  ct_tensor xt = ct_model_input_ndim(m) == 3 ? ct_tensor_4d(x, CT_F32, FUZZ_MT_BATCH, c, h, w)
                                             : ct_tensor_2d(x, CT_F32, FUZZ_MT_BATCH, c);
  xt.device = fuzz_mt_dev;
  const ct_tensor *out = NULL;
  ct_tensor dout;
  int rc = 0;
  if (ct_model_forward(m, &xt, 1, 0, &out) != CT_OK) rc = fuzz_mt_fail("forward failed", ct_last_error());
  else if (out->ndim < 2 || out->shape[0] != FUZZ_MT_BATCH ||
           ct_tensor_numel(out) != FUZZ_MT_BATCH * ct_model_output_size(m))
    rc = fuzz_mt_fail("output is not [batch, output size...]", NULL);
  else if (ct_model_output_grad(m, &dout) != CT_OK) rc = fuzz_mt_fail("no output gradient", ct_last_error());
  else {
    float *g = dout.data;
    for (int64_t i = 0; i < ct_tensor_numel(&dout); i++) g[i] = (float)(i % 3) - 1.0f;
    if (ct_model_backward(m, &dout) != CT_OK) rc = fuzz_mt_fail("backward failed", ct_last_error());
  }
  free(x);
  fuzz_mt_stepped += rc == 0;
  return rc;
}

/* The checks on an accepted model (see the header). */
static int fuzz_mt_check_model(ct_model *m) {
  int c, h, w;
  ct_model_input_shape(m, &c, &h, &w);
  int nd = ct_model_input_ndim(m);
  if ((nd != 1 && nd != 3) || c < 1 || h < 1 || w < 1 || (nd == 1 && (h != 1 || w != 1)))
    return fuzz_mt_fail("bad input shape", NULL);
  if (ct_model_output_size(m) < 1) return fuzz_mt_fail("empty output", NULL);
  int64_t params = 0, buf4 = 0, buf8 = 0;
  for (int i = 0; i < ct_model_state_count(m); i++) {
    const ct_state_entry *e = ct_model_state(m, i);
    if (!e || !e->name || !e->name[0]) return fuzz_mt_fail("state entry without a name", NULL);
    if (ct_model_state_find(m, e->name) != i) return fuzz_mt_fail("state name not unique", e->name);
    const ct_tensor *v = &e->value;
    if (!v->data || v->ndim < 0 || v->ndim > 4) return fuzz_mt_fail("bad state tensor", e->name);
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) {
      if (v->shape[d] < 1) return fuzz_mt_fail("state dimension below 1", e->name);
      n *= v->shape[d];
    }
    if (v->dtype == CT_F32 && ((uintptr_t)v->data % 256 || (e->grad.data && (uintptr_t)e->grad.data % 256)))
      return fuzz_mt_fail("f32 state not at a multiple of 256 bytes", e->name);
    if (e->is_buffer) {
      if (e->grad.data) return fuzz_mt_fail("buffer with a gradient", e->name);
      if (v->dtype == CT_I64) buf8 += n;
      else if (v->dtype == CT_F32) buf4 += n;
      else return fuzz_mt_fail("buffer dtype", e->name);
    } else {
      if (v->dtype != CT_F32 || !e->grad.data || e->grad.ndim != v->ndim ||
          memcmp(e->grad.shape, v->shape, (size_t)v->ndim * sizeof v->shape[0]))
        return fuzz_mt_fail("parameter and gradient differ", e->name);
      params += n;
    }
  }
  /* The flat buffers hold the entries and the gaps that start each f32
   * entry at a multiple of 256 bytes (ct_model_params): at most 63 floats
   * before each. */
  size_t np = 0, ng = 0;
  float *p = ct_model_params(m, &np), *g = ct_model_grads(m, &ng);
  const size_t gaps = (size_t)ct_model_state_count(m) * 63;
  if (ct_model_param_count(m) != params || np != ng || (int64_t)np < params || np - (size_t)params > gaps)
    return fuzz_mt_fail("parameter count differs from the state entries'", NULL);
  const size_t least = (size_t)(params * 8 + buf4 * 4 + buf8 * 8), sb = ct_model_state_bytes(m);
  if (sb < least || sb > least + gaps * 12)
    return fuzz_mt_fail("state bytes differ from the state entries'", NULL);
  if ((size_t)params * 4 > FUZZ_MT_MAX_PARAM_BYTES) {
    char d[64];
    snprintf(d, sizeof d, "%lld parameters", (long long)params);
    return fuzz_mt_fail("accepted a model of more than 256 MiB of parameters", d);
  }
  for (size_t i = 0; i < np; i++) {
    /* x - x is 0 for every finite x, NaN for inf and NaN. */
    if (p[i] - p[i] != 0.0f) return fuzz_mt_fail("parameter not finite after initialisation", NULL);
    if (g[i] != 0.0f) return fuzz_mt_fail("gradient not zero after creation", NULL);
  }
  return fuzz_mt_use(m, params);
}

/* One input (see the header): 0 if it was rejected with a good message or
 * accepted and usable, -1 otherwise. */
static int ct_fuzz_model_text_one(const uint8_t *data, size_t size) {
  char path[700];
  if (!fuzz_scratch_file("model.txt", data, size, path, sizeof path)) return fuzz_mt_fail("cannot write", "model.txt");
  ct_model_options opt = {0};
  ct_model *m = NULL;
  ct_error_clear();
  ct_status s = ct_model_parse_file(path, &opt, &m);
  if (s != CT_OK) {
    fuzz_mt_rejected++;
    if (m) return fuzz_mt_fail("rejected but returned a model", NULL);
    return fuzz_mt_check_error(s, path, fuzz_mt_lines(data, size));
  }
  fuzz_mt_accepted++;
  if (!m) return fuzz_mt_fail("accepted without a model", NULL);
  int rc = fuzz_mt_check_model(m);
  ct_model_destroy(m);
  return rc;
}

#ifdef CT_FUZZ_BODY_ONLY
/* Closes the device the body opened (the twin calls it at the end). */
static void ct_fuzz_model_text_done(void) {
  ct_device_close(fuzz_mt_dev);
  fuzz_mt_dev = NULL;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (ct_fuzz_model_text_one(data, size) != 0) {
    fprintf(stderr, "%s\n", ct_last_error());
    abort();
  }
  return 0;
}
#endif
