/* Runs one backend op (forward and backward, in f32) on inputs read from
 * raw little-endian float32 files and writes the outputs the same way, for
 * tests/parity/test_ops_torch.py and test_nan_torch.py to compare with
 * PyTorch. The device is CTRAIN_OP_DEVICE (default ref: the portable
 * reference; cpu, or cuda, where the buffers live in device memory).
 *
 *   ref_op_dump DIR OP INT_ARGS... [-- FLOAT_ARGS...]
 *
 * Inputs are DIR/<name>.f32, outputs DIR/<name>.f32 (indices .i32); the
 * names per op are listed in run_op(). Pooling output sizes are computed
 * here with PyTorch's rule, so a wrong size shows up as a size mismatch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/ref_ops.h"
#include "ctrain/ctrain.h"

static const char *g_dir;
static ct_device *g_dev;
static const ct_backend *B;

static void die(const char *what) {
  fprintf(stderr, "ref_op_dump: %s: %s\n", what, ct_last_error());
  exit(1);
}
#define TRY(expr) \
  do {            \
    if ((expr) != CT_OK) die(#expr); \
  } while (0)

static void *read_file(const char *name, const char *ext, size_t bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.%s", g_dir, name, ext);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "ref_op_dump: cannot open %s\n", path);
    exit(1);
  }
  void *p = malloc(bytes ? bytes : 1);
  if (fread(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "ref_op_dump: %s is shorter than %zu bytes\n", path, bytes);
    exit(1);
  }
  fclose(f);
  return p;
}

static void write_file(const char *name, const char *ext, const void *p, size_t bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.%s", g_dir, name, ext);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "ref_op_dump: cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

/* Device memory for bytes (host memory on a host backend), holding a copy
 * of host when not NULL. */
static void *dev_buf(const void *host, size_t bytes) {
  void *p = B->alloc ? ct_device_alloc(g_dev, bytes ? bytes : 4) : calloc(bytes + 4, 1);
  if (!p) die("allocation");
  if (B->alloc) {
    if (host) TRY(ct_device_copy(g_dev, p, NULL, host, bytes));
    else if (bytes) TRY(B->fill(g_dev, &(ct_tensor){.data = p, .dtype = CT_F32, .ndim = 1, .shape = {(int64_t)(bytes / 4)}, .device = g_dev}, 0.0f));
  } else if (host) {
    memcpy(p, host, bytes);
  }
  return p;
}
static void *host_copy(const void *dev, size_t bytes) {
  void *h = malloc(bytes + 4);
  TRY(ct_device_copy(NULL, h, B->alloc ? g_dev : NULL, dev, bytes));
  return h;
}
static void dev_free(void *p) {
  if (B->alloc) ct_device_free(g_dev, p);
  else free(p);
}

/* f32 tensor read from DIR/name.f32 (shape given), or a fresh one. */
static ct_tensor in_t(const char *name, int ndim, const int64_t *shape) {
  ct_tensor t = ct_tensor_view(NULL, CT_F32, ndim, shape);
  void *h = read_file(name, "f32", ct_tensor_nbytes(&t));
  t.data = dev_buf(h, ct_tensor_nbytes(&t));
  t.device = B->alloc ? g_dev : NULL;
  free(h);
  return t;
}
static ct_tensor new_t(int ndim, const int64_t *shape) {
  ct_tensor t = ct_tensor_view(NULL, CT_F32, ndim, shape);
  t.data = dev_buf(NULL, ct_tensor_nbytes(&t));
  t.device = B->alloc ? g_dev : NULL;
  return t;
}
static void out_t(const char *name, ct_tensor *t) {
  void *h = host_copy(t->data, ct_tensor_nbytes(t));
  write_file(name, "f32", h, ct_tensor_nbytes(t));
  free(h);
  dev_free(t->data);
  t->data = NULL;
}
/* Writes an int32 device buffer of bytes as DIR/name.i32 and frees it. */
static void out_i32(const char *name, void *d, size_t bytes) {
  void *h = host_copy(d, bytes);
  write_file(name, "i32", h, bytes);
  free(h);
  dev_free(d);
}

static int run_op(const char *op, const long *a, int na, const double *f) {
  if (!strcmp(op, "conv")) { /* N C H W O KH KW sh sw ph pw dh dw groups [act] */
    if (na < 14) return 2;
    ct_conv2d_params p = {(int)a[7], (int)a[8], (int)a[9], (int)a[10], (int)a[11], (int)a[12], (int)a[13]};
    int64_t OH = (a[2] + 2 * p.pad_h - p.dil_h * (a[5] - 1) - 1) / p.stride_h + 1;
    int64_t OW = (a[3] + 2 * p.pad_w - p.dil_w * (a[6] - 1) - 1) / p.stride_w + 1;
    int64_t xs[4] = {a[0], a[1], a[2], a[3]}, ws[4] = {a[4], a[1] / p.groups, a[5], a[6]}, ys[4] = {a[0], a[4], OH, OW};
    ct_tensor x = in_t("x", 4, xs), w = in_t("w", 4, ws), b = in_t("b", 1, &a[4]), dy = in_t("dy", 4, ys);
    ct_tensor y = new_t(4, ys), dx = new_t(4, xs), dw = new_t(4, ws), db = new_t(1, &a[4]);
    TRY(B->conv2d_fwd(g_dev, &p, &x, &w, &b, na > 14 ? (ct_act)a[14] : CT_ACT_NONE, &y));
    TRY(B->conv2d_bwd_data(g_dev, &p, &dy, &w, &dx));
    TRY(B->conv2d_bwd_weights(g_dev, &p, &x, &dy, &dw, &db, 0.0f));
    out_t("y", &y);
    out_t("dx", &dx);
    out_t("dw", &dw);
    out_t("db", &db);
    return 0;
  }
  if (!strcmp(op, "maxpool") || !strcmp(op, "avgpool")) { /* N C H W kh kw sh sw ph pw ceil cip */
    if (na < 12) return 2;
    ct_pool2d_params p = {(int)a[4], (int)a[5], (int)a[6], (int)a[7], (int)a[8], (int)a[9], (int)a[10], (int)a[11]};
    int64_t OH = ct_ref_pool_out_size(a[2], p.kernel_h, p.stride_h, p.pad_h, 1, p.ceil_mode);
    int64_t OW = ct_ref_pool_out_size(a[3], p.kernel_w, p.stride_w, p.pad_w, 1, p.ceil_mode);
    int64_t xs[4] = {a[0], a[1], a[2], a[3]}, ys[4] = {a[0], a[1], OH, OW};
    ct_tensor x = in_t("x", 4, xs), dy = in_t("dy", 4, ys), y = new_t(4, ys), dx = new_t(4, xs);
    if (op[0] == 'm') {
      size_t wsb = B->maxpool2d_workspace_bytes(g_dev, &p, &x, &y);
      int32_t *ws = dev_buf(NULL, wsb);
      TRY(B->maxpool2d_fwd(g_dev, &p, &x, &y, ws));
      TRY(B->maxpool2d_bwd(g_dev, &p, &dy, ws, &dx));
      out_i32("idx", ws, wsb);
    } else {
      TRY(B->avgpool2d_fwd(g_dev, &p, &x, &y));
      TRY(B->avgpool2d_bwd(g_dev, &p, &dy, &dx));
    }
    out_t("y", &y);
    out_t("dx", &dx);
    return 0;
  }
  if (!strcmp(op, "adaptive_avg") || !strcmp(op, "adaptive_max")) { /* N C H W OH OW */
    if (na < 6) return 2;
    int64_t xs[4] = {a[0], a[1], a[2], a[3]}, ys[4] = {a[0], a[1], a[4], a[5]};
    ct_tensor x = in_t("x", 4, xs), dy = in_t("dy", 4, ys), y = new_t(4, ys), dx = new_t(4, xs);
    if (op[9] == 'm') {
      int32_t *idx = dev_buf(NULL, (size_t)ct_tensor_numel(&y) * 4);
      TRY(B->adaptive_maxpool2d_fwd(g_dev, &x, &y, idx));
      TRY(B->adaptive_maxpool2d_bwd(g_dev, &dy, idx, &dx));
      out_i32("idx", idx, (size_t)ct_tensor_numel(&y) * 4);
    } else {
      TRY(B->adaptive_avgpool2d_fwd(g_dev, &x, &y));
      TRY(B->adaptive_avgpool2d_bwd(g_dev, &dy, &dx));
    }
    out_t("y", &y);
    out_t("dx", &dx);
    return 0;
  }
  if (!strcmp(op, "batchnorm")) { /* N C S training -- momentum eps */
    if (na < 4) return 2;
    int64_t xs[3] = {a[0], a[1], a[2]}, cs[1] = {a[1]};
    int training = (int)a[3];
    ct_tensor x = in_t("x", 3, xs), g = in_t("gamma", 1, cs), be = in_t("beta", 1, cs), rm = in_t("rm", 1, cs);
    ct_tensor rv = in_t("rv", 1, cs), dy = in_t("dy", 3, xs), y = new_t(3, xs), sm = new_t(1, cs),
              si = new_t(1, cs);
    TRY(B->batchnorm_fwd(g_dev, training, &x, &g, &be, &rm, &rv, (float)f[0], (float)f[1], &y, &sm, &si));
    if (training) {
      ct_tensor dx = new_t(3, xs), dg = new_t(1, cs), db = new_t(1, cs);
      TRY(B->batchnorm_bwd(g_dev, &x, &dy, &g, &sm, &si, &dx, &dg, &db, 0.0f));
      out_t("dx", &dx);
      out_t("dgamma", &dg);
      out_t("dbeta", &db);
    }
    out_t("y", &y);
    out_t("rm", &rm);
    out_t("rv", &rv);
    return 0;
  }
  if (!strcmp(op, "cross_entropy") || !strcmp(op, "nll")) { /* N C -- label_smoothing grad_scale */
    if (na < 2) return 2;
    int64_t xs[2] = {a[0], a[1]}, one = 1;
    ct_tensor x = in_t("x", 2, xs), tf = in_t("target", 1, &a[0]), loss = new_t(1, &one), dx = new_t(2, xs);
    int64_t *tg = malloc((size_t)a[0] * sizeof *tg);
    float *tfh = host_copy(tf.data, (size_t)a[0] * 4);
    for (long i = 0; i < a[0]; i++) tg[i] = (int64_t)tfh[i];
    free(tfh);
    ct_tensor t = ct_tensor_1d(dev_buf(tg, (size_t)a[0] * sizeof *tg), CT_I64, a[0]);
    t.device = x.device;
    if (op[0] == 'c') {
      TRY(B->cross_entropy_fwd(g_dev, &x, &t, (float)f[0], &loss));
      TRY(B->cross_entropy_bwd(g_dev, &x, &t, (float)f[0], (float)f[1], &dx));
    } else {
      TRY(B->nll_fwd(g_dev, &x, &t, &loss));
      TRY(B->nll_bwd(g_dev, &t, (float)f[1], &dx));
    }
    out_t("loss", &loss);
    out_t("dx", &dx);
    dev_free(t.data);
    free(tg);
    return 0;
  }
  if (!strcmp(op, "act") || !strcmp(op, "softmax") || !strcmp(op, "dropout")) {
    /* act: N kind -- alpha; softmax: N C log; dropout: N group seed layer step -- p */
    int64_t xs[2] = {a[0], !strcmp(op, "softmax") ? a[1] : 1};
    ct_tensor x = in_t("x", 2, xs), dy = in_t("dy", 2, xs), y = new_t(2, xs), dx = new_t(2, xs);
    if (op[0] == 'a') {
      ct_act k = (ct_act)a[1];
      TRY(B->act_fwd(g_dev, k, (float)f[0], &x, &y));
      TRY(B->act_bwd(g_dev, k, (float)f[0], &x, &y, &dy, &dx));
    } else if (op[0] == 's') {
      TRY(B->softmax_fwd(g_dev, (int)a[2], &x, &y));
      TRY(B->softmax_bwd(g_dev, (int)a[2], &y, &dy, &dx));
    } else {
      ct_dropout_key key = {(uint64_t)a[2], (uint32_t)a[3], (uint32_t)a[4], 0, 0, 0};
      TRY(B->dropout_fwd(g_dev, (float)f[0], a[1], key, &x, &y));
      TRY(B->dropout_bwd(g_dev, (float)f[0], a[1], key, &dy, &dx));
    }
    out_t("y", &y);
    out_t("dx", &dx);
    return 0;
  }
  return 3;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: ref_op_dump DIR OP INT_ARGS... [-- FLOAT_ARGS...]\n");
    return 2;
  }
  g_dir = argv[1];
  long ints[32];
  double flts[8] = {0};
  int ni = 0, nf = 0, floats = 0;
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "--")) {
      floats = 1;
      continue;
    }
    if (floats && nf < 8) flts[nf++] = strtod(argv[i], NULL);
    if (!floats && ni < 32) ints[ni++] = strtol(argv[i], NULL, 10);
  }
  const char *spec = getenv("CTRAIN_OP_DEVICE") ? getenv("CTRAIN_OP_DEVICE") : "ref";
  if (ct_device_open(spec, &g_dev) != CT_OK) {
    fprintf(stderr, "ref_op_dump: no device %s: %s\n", spec, ct_last_error());
    return 77;
  }
  B = ct_device_backend(g_dev);
  int rc = run_op(argv[2], ints, ni, flts);
  if (rc == 2) fprintf(stderr, "ref_op_dump: too few integer arguments for %s\n", argv[2]);
  if (rc == 3) fprintf(stderr, "ref_op_dump: unknown op %s\n", argv[2]);
  ct_device_close(g_dev);
  return rc;
}
