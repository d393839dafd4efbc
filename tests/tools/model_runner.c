/* model_runner: one training step of a ctrain model, every tensor written
 * to a safetensors file, for the PyTorch parity test
 * (tests/parity/test_models_torch.py).
 *
 *   model_runner --model NAME|FILE [--input CxHxW|F] [--classes N]
 *                [--batch N] [--device ref|cpu] [--seed S]
 *                [--init W.safetensors] --out OUT.safetensors
 *                [--train 1|0] [--loss ce|mse|nll] [--label-smoothing F]
 *                [--dropout-off] [--print-params] [--dump-relu] [--dump-pool]
 *                [--buffers-only] [--precision fp32|bf16|fp16 [--opt-level O1|O2|O3]]
 *                [--grad-keys K1,K2,...]
 *
 * Writes "input" [N, ...], "target" ([N] int64, or [N, K] f32 for mse),
 * "output" [N, K], "loss" [1] f64, "state.<key>" for every state_dict entry
 * after the step (batch-norm running stats updated by the training
 * forward), "grad.<key>" for every parameter (training only) and, unless
 * --init was given, "init.<key>": the model's own initial state.
 *
 * --dropout-off sets every dropout layer's p to 0 after creation. ctrain's
 * dropout masks come from its counter-based RNG, not PyTorch's generator,
 * so masks cannot match; the parity test instead sets p = 0 on both sides
 * and compares the rest of the training-mode step exactly. (Dropout itself
 * is tested against the reference kernels elsewhere.)
 *
 * --dump-relu also writes "relu.NNNN": the mask (1 where y > 0, else 0) of
 * the NNNN-th ReLU of the forward pass, in execution order. At a ReLU whose
 * input is within rounding of 0, ctrain and PyTorch may legitimately take
 * different branches (different summation orders), and in a deep network
 * one such element moves whole gradients by far more than 1e-4; the parity
 * test makes PyTorch's ReLU backward use ctrain's forward decision so the
 * comparison stays exact, and counts the flips.
 *
 * --dump-pool (cuda device only) also writes "pool.NNNN": for the NNNN-th
 * max pooling layer (MaxPool2d or AdaptiveMaxPool2d) of the forward pass,
 * the input position each output took its value from, as int64 h * W + w
 * in [N, C, OH, OW] (PyTorch's return_indices convention). Where two inputs
 * of a window are equal in bf16 (frequent after rounding), the choice
 * follows tiny differences in how the producer rounded, and one different
 * choice moves a weight gradient by several percent; the parity test makes
 * PyTorch's pooling take ctrain's choices and counts the differences. Read
 * from the layer's workspace, which on cuda holds per output, in y's
 * memory order, the argmax's offset in the max pool's window (one byte for
 * windows under 255 elements, else int32; src/backend/cuda/cuda_pool.cu),
 * turned back into h * W + w here, or the adaptive max pool's int32
 * index itself.
 *
 * --buffers-only writes "state.<key>" for buffers only: a step without an
 * optimizer leaves parameters at their initial values, and for models of
 * 100M+ parameters the extra copy is most of the test's time.
 *
 * --precision runs the step under mixed precision (ct_model_set_precision;
 * a low precision alone means O1 autocast, as `ctrain train`); "output" is
 * then the fp32 copy of the model output that the loss reads, gradients
 * are the fp32 parameter gradients (tests/parity/test_amp_models_torch.py).
 *
 * --grad-keys writes "grad.<key>" only for the listed parameters: for the
 * 50M+ parameter classifiers of alexnet/vgg the gradient copy is most of
 * the test's time and adds no coverage beyond the smaller layers.
 *
 * --print-params prints "params <count>" (trainable parameters) to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "plan/fuse.h"
#include "nn/model_impl.h"

static int fail(const char *what) {
  fprintf(stderr, "model_runner: %s\n", what);
  return 2;
}

static int fail_st(const char *what) {
  fprintf(stderr, "model_runner: %s: %s\n", what, ct_last_error());
  return 1;
}

/* Parses "CxHxW" or "F" into the options. */
static int parse_input(const char *s, ct_model_options *o) {
  int v[3], n = 0;
  const char *c = s;
  while (*c && n < 3) {
    char *end;
    long x = strtol(c, &end, 10);
    if (end == c || x <= 0) return -1;
    v[n++] = (int)x;
    c = *end == 'x' ? end + 1 : end;
    if (*end && *end != 'x') return -1;
  }
  if (*c || (n != 1 && n != 3)) return -1;
  o->in_channels = v[0];
  o->height = n == 3 ? v[1] : 0;
  o->width = n == 3 ? v[2] : 0;
  return 0;
}

/* Tensors to write, with names and host copies owned here. */
typedef struct out_list {
  ct_named_tensor *t;
  char **names;
  void **bufs;
  size_t n, cap;
} out_list;

static int out_add(out_list *o, const char *prefix, const char *name, const ct_tensor *src) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? 2 * o->cap : 256;
    ct_named_tensor *t = realloc(o->t, cap * sizeof *t);
    if (!t) return -1;
    o->t = t;
    char **nm = realloc(o->names, cap * sizeof *nm);
    if (!nm) return -1;
    o->names = nm;
    void **b = realloc(o->bufs, cap * sizeof *b);
    if (!b) return -1;
    o->bufs = b;
    o->cap = cap;
  }
  size_t len = strlen(prefix) + strlen(name) + 1;
  char *n = malloc(len);
  size_t bytes = ct_tensor_nbytes(src);
  void *buf = malloc(bytes ? bytes : 1);
  if (!n || !buf) return -1;
  snprintf(n, len, "%s%s", prefix, name);
  if (bytes && ct_device_copy(NULL, buf, src->device, src->data, bytes) != CT_OK) return -1;
  o->names[o->n] = n;
  o->bufs[o->n] = buf;
  o->t[o->n].name = n;
  o->t[o->n].t = *src;
  o->t[o->n].t.data = buf;
  o->t[o->n].t.device = NULL;
  o->n++;
  return 0;
}

static void out_free(out_list *o) {
  for (size_t i = 0; i < o->n; i++) free(o->names[i]), free(o->bufs[i]);
  free(o->t), free(o->names), free(o->bufs);
}

/* 1 if name is one of the comma-separated names in list. */
static int in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *c = list; *c;) {
    const char *end = strchr(c, ',');
    size_t len = end ? (size_t)(end - c) : strlen(c);
    if (len == n && !strncmp(c, name, n)) return 1;
    if (!end) break;
    c = end + 1;
  }
  return 0;
}

/* Adds every state entry: values (grads 0; buffers only when grads < 0),
 * or parameter gradients (grads 1). */
static int add_state(out_list *o, ct_model *m, const char *prefix, int grads, const char *keys) {
  for (int i = 0; i < ct_model_state_count(m); i++) {
    const ct_state_entry *e = ct_model_state(m, i);
    if ((grads > 0 && e->is_buffer) || (grads < 0 && !e->is_buffer)) continue;
    if (keys && !in_list(keys, e->name)) continue;
    if (out_add(o, prefix, e->name, grads > 0 ? &e->grad : &e->value)) return -1;
  }
  return 0;
}

/* Where plain NCHW element j of t lies in memory: the executor may keep an
 * activation channel-blocked ([N][C/16][H][W][16] or, without AVX-512,
 * [N][C/8][H][W][8] on the cpu device) or channels-last ([N][H][W][C] on
 * CUDA); see src/plan/layout.h. */
static int64_t blocked_index(const ct_tensor *t, int64_t j) {
  if (t->layout == CT_LAYOUT_PLAIN) return j;
  int64_t C = t->shape[1], HW = t->shape[2] * t->shape[3];
  int64_t n = j / (C * HW), c = j / HW % C, p = j % HW;
  if (t->layout == CT_LAYOUT_NHWC) return (n * HW + p) * C + c;
  const int64_t b = t->layout == CT_LAYOUT_C8 ? 8 : 16;
  return ((n * (C / b) + c / b) * HW + p) * b + c % b;
}

/* Adds "<prefix>.NNNN": host data h of dtype dt, shaped like y, in plain
 * NCHW order (what the per-layer dumps below write). */
static int out_add_host(out_list *o, const ct_tensor *y, ct_dtype dt, void *h, const char *prefix, int k) {
  ct_tensor t = *y;
  t.dtype = dt;
  t.layout = CT_LAYOUT_PLAIN;
  t.data = h;
  t.device = NULL;
  char name[32];
  snprintf(name, sizeof name, "%s.%04d", prefix, k);
  return out_add(o, "", name, &t);
}

/* Masks of every ReLU output (a ReLU layer, or a ReLU fused into a layer)
 * of the last forward pass, in execution order. */
static int add_relu_masks(out_list *o, ct_model *m) {
  int k = 0;
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    if (l->act != CT_ACT_RELU || ct_layer_is_fused(l)) continue; /* folded: its producer carries it */
    int64_t n = ct_tensor_numel(&l->y);
    /* Under mixed precision the ReLU output may be bf16/fp16. */
    size_t es = ct_dtype_size(l->y.dtype);
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    void *raw = malloc((size_t)(n ? n : 1) * es);
    if (!h || !raw || ct_device_copy(NULL, raw, l->y.device, l->y.data, (size_t)n * es) != CT_OK) return -1;
    for (int64_t j = 0; j < n; j++) {
      int64_t at = blocked_index(&l->y, j);
      float v = l->y.dtype == CT_BF16 ? ct_bf16_to_f32(((uint16_t *)raw)[at])
                : l->y.dtype == CT_F16 ? ct_f16_to_f32(((uint16_t *)raw)[at])
                                       : ((float *)raw)[at];
      h[j] = v > 0.0f ? 1.0f : 0.0f;
    }
    free(raw);
    int r = out_add_host(o, &l->y, CT_F32, h, "relu", k++);
    free(h);
    if (r) return -1;
  }
  return 0;
}

/* Argmax choices of every max pooling layer (see --dump-pool). */
static int add_pool_choices(out_list *o, ct_model *m) {
  int k = 0;
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    if (l->cls != &ct_layer_maxpool2d && l->cls != &ct_layer_adaptive_maxpool2d) continue;
    int64_t n = ct_tensor_numel(&l->y);
    /* MaxPool2d: ip[0..5] kernel, stride, padding (h, w); offsets in bytes
     * when the window has under 255 elements */
    const int pool = l->cls == &ct_layer_maxpool2d, kh = l->ip[0], kw = l->ip[1];
    const size_t es = pool && kh * kw < 255 ? 1 : sizeof(int32_t);
    unsigned char *ws = malloc((size_t)(n ? n : 1) * es);
    int64_t *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    if (!ws || !h || !l->ws || ct_device_copy(NULL, ws, l->y.device, l->ws, (size_t)n * es) != CT_OK) return -1;
    const int64_t OH = l->y.shape[2], OW = l->y.shape[3], W = l->x[0].shape[3];
    for (int64_t j = 0; j < n; j++) {
      int64_t at = blocked_index(&l->y, j);
      int32_t v;
      if (es == 1) v = ws[at] == 255 ? -1 : ws[at];
      else memcpy(&v, ws + at * es, sizeof v);
      if (!pool || v < 0) {
        h[j] = v;
        continue;
      }
      /* j walks [N, C, OH, OW] in order */
      int64_t ow = j % OW, oh = j / OW % OH;
      h[j] = (oh * l->ip[2] - l->ip[4] + v / kw) * W + (ow * l->ip[3] - l->ip[5] + v % kw);
    }
    free(ws);
    int r = out_add_host(o, &l->y, CT_I64, h, "pool", k++);
    free(h);
    if (r) return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *model = NULL, *init = NULL, *out = NULL, *device = "cpu", *loss_name = "ce";
  const char *precision = NULL, *opt_level = NULL, *grad_keys = NULL;
  ct_model_options opt = {0};
  int batch = 2, train = 1, dropout_off = 0, print_params = 0, dump_relu = 0, dump_pool = 0, buffers_only = 0;
  float smoothing = 0.0f;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--dropout-off")) { dropout_off = 1; continue; }
    if (!strcmp(a, "--print-params")) { print_params = 1; continue; }
    if (!strcmp(a, "--dump-relu")) {
      /* The masks are read after the forward: keep every ReLU output to
       * its producer's backward (a max pool would otherwise take the
       * ReLU's gradient over and the output die after the pool read it;
       * test_relu_to_pool checks that this changes no bit). */
      dump_relu = 1;
      ct_fuse_set_relu_to_pool(0);
      continue;
    }
    if (!strcmp(a, "--dump-pool")) { dump_pool = 1; continue; }
    if (!strcmp(a, "--buffers-only")) { buffers_only = 1; continue; }
    if (i + 1 >= argc) return fail("every option but the flags --dropout-off, --print-params, --dump-relu, --dump-pool and --buffers-only takes a value");
    const char *v = argv[++i];
    if (!strcmp(a, "--model")) model = v;
    else if (!strcmp(a, "--input")) { if (parse_input(v, &opt)) return fail("--input: expected CxHxW or F"); }
    else if (!strcmp(a, "--classes")) opt.num_classes = atoi(v);
    else if (!strcmp(a, "--batch")) batch = atoi(v);
    else if (!strcmp(a, "--device")) device = v;
    else if (!strcmp(a, "--seed")) opt.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--init")) init = v;
    else if (!strcmp(a, "--out")) out = v;
    else if (!strcmp(a, "--train")) train = atoi(v);
    else if (!strcmp(a, "--loss")) loss_name = v;
    else if (!strcmp(a, "--label-smoothing")) smoothing = (float)atof(v);
    else if (!strcmp(a, "--precision")) precision = v;
    else if (!strcmp(a, "--opt-level")) opt_level = v;
    else if (!strcmp(a, "--grad-keys")) grad_keys = v;
    else return fail("unknown option (see the header of tests/tools/model_runner.c)");
  }
  if (!model || (!out && !print_params)) return fail("--model and --out are required");
  if (dump_pool && strncmp(device, "cuda", 4))
    return fail("--dump-pool needs --device cuda (the other devices' pooling workspace is not an index)");
  if (batch <= 0) return fail("--batch must be positive");
  ct_loss_kind lk;
  if (ct_loss_parse(loss_name, &lk)) return fail("--loss must be ce, nll or mse");

  ct_precision prec = CT_PRECISION_FP32;
  ct_opt_level lvl = CT_OPT_O0;
  if (precision && ct_precision_parse(precision, &prec)) return fail("--precision must be fp32, bf16 or fp16");
  if (opt_level && ct_opt_level_parse(opt_level, &lvl)) return fail("--opt-level must be O0..O3");
  if (!opt_level && prec != CT_PRECISION_FP32) lvl = CT_OPT_O1;

  ct_model *m = NULL;
  if (ct_model_create(model, &opt, &m) != CT_OK) return fail_st("creating the model");
  if (ct_model_set_precision(m, prec, lvl) != CT_OK) return fail_st("--precision/--opt-level");
  if (print_params) {
    printf("params %lld\n", (long long)ct_model_param_count(m));
    if (!out) {
      ct_model_destroy(m);
      return 0;
    }
  }
  if (dropout_off)
    for (int i = 0; i < m->n_layers; i++)
      if (m->layers[i].cls == &ct_layer_dropout || m->layers[i].cls == &ct_layer_dropout2d) m->layers[i].fp[0] = 0.0f;

  out_list ol = {0};
  int n_state = ct_model_state_count(m);
  if (init) {
    ct_named_tensor *dst = calloc((size_t)n_state, sizeof *dst);
    if (!dst) return fail("out of memory");
    for (int i = 0; i < n_state; i++) {
      dst[i].name = ct_model_state(m, i)->name;
      dst[i].t = ct_model_state(m, i)->value;
    }
    ct_status s = ct_safetensors_load_named(init, dst, (size_t)n_state, 1, NULL);
    free(dst);
    if (s != CT_OK) return fail_st("loading --init");
  } else if (add_state(&ol, m, "init.", 0, NULL)) {
    return fail("out of memory");
  }

  ct_device *dev = NULL;
  if (ct_device_open(device, &dev) != CT_OK) return fail_st("opening the device");
  if (ct_model_prepare(m, dev, batch, 1) != CT_OK) return fail_st("ct_model_prepare");

  /* Input and targets: seeded normal input, uniform class targets. */
  int nd = ct_model_input_ndim(m), c, h, w;
  ct_model_input_shape(m, &c, &h, &w);
  int64_t K = ct_model_output_size(m);
  int64_t xs[4] = {batch, c, h, w};
  if (nd == 1) xs[1] = c;
  ct_tensor xh;
  if (ct_tensor_alloc(&xh, CT_F32, nd + 1, xs) != CT_OK) return fail_st("input");
  ct_rng r;
  ct_rng_init(&r, opt.seed + 1000, CT_RNG_TEST, 1, 0);
  float *xp = xh.data;
  for (int64_t i = 0; i < ct_tensor_numel(&xh); i++) xp[i] = (float)ct_rng_normal(&r);
  ct_tensor th;
  if (lk == CT_LOSS_MSE) {
    int64_t ts[2] = {batch, K};
    if (ct_tensor_alloc(&th, CT_F32, 2, ts) != CT_OK) return fail_st("target");
    for (int64_t i = 0; i < batch * K; i++) ((float *)th.data)[i] = (float)ct_rng_normal(&r);
  } else {
    int64_t ts[1] = {batch};
    if (ct_tensor_alloc(&th, CT_I64, 1, ts) != CT_OK) return fail_st("target");
    for (int64_t i = 0; i < batch; i++) ((int64_t *)th.data)[i] = ct_rng_below(&r, (uint32_t)K);
  }
  /* Device copies (the same memory kind on cpu/ref, but keep it honest). */
  ct_tensor x = xh, t = th;
  x.data = ct_device_alloc(dev, ct_tensor_nbytes(&xh));
  t.data = ct_device_alloc(dev, ct_tensor_nbytes(&th));
  if (!x.data || !t.data) return fail_st("device memory");
  x.device = t.device = dev;
  if (ct_device_copy(dev, x.data, NULL, xh.data, ct_tensor_nbytes(&xh)) != CT_OK ||
      ct_device_copy(dev, t.data, NULL, th.data, ct_tensor_nbytes(&th)) != CT_OK)
    return fail_st("copying input");

  const ct_tensor *y;
  if (ct_model_forward(m, &x, train, 0, &y) != CT_OK) return fail_st("forward");
  double loss = 0;
  if (ct_loss_forward(dev, lk, y, &t, smoothing, &loss) != CT_OK) return fail_st("loss forward");
  if (out_add(&ol, "", "output", y)) return fail("out of memory");
  if (dump_relu && add_relu_masks(&ol, m)) return fail("out of memory");
  if (dump_pool && add_pool_choices(&ol, m)) return fail("reading the max pooling choices (cuda device, training only)");
  if (train) {
    ct_tensor dout;
    if (ct_model_output_grad(m, &dout) != CT_OK) return fail_st("output grad");
    if (ct_loss_backward(dev, lk, y, &t, smoothing, 1.0f, &dout) != CT_OK) return fail_st("loss backward");
    if (ct_model_backward(m, &dout) != CT_OK) return fail_st("backward");
    if (add_state(&ol, m, "grad.", 1, grad_keys)) return fail("out of memory");
  }
  if (add_state(&ol, m, "state.", buffers_only ? -1 : 0, NULL)) return fail("out of memory");
  int64_t one = 1;
  ct_tensor lt = ct_tensor_view(&loss, CT_F64, 1, &one);
  if (out_add(&ol, "", "input", &xh) || out_add(&ol, "", "target", &th) || out_add(&ol, "", "loss", &lt))
    return fail("out of memory");
  if (ct_safetensors_write(out, ol.t, ol.n, NULL) != CT_OK) return fail_st("writing --out");

  out_free(&ol);
  ct_device_free(dev, x.data);
  ct_device_free(dev, t.data);
  ct_tensor_free(&xh);
  ct_tensor_free(&th);
  ct_model_destroy(m);
  ct_device_close(dev);
  return 0;
}
