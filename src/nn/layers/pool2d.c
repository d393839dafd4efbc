/* MaxPool2d and AvgPool2d: ip = kh, kw, sh, sw, ph, pw, ceil_mode,
 * count_include_pad (avg only). Output size follows PyTorch, including the
 * ceil_mode rule that the last window must start inside the input or the
 * left padding. */
#include "nn/layer.h"

static ct_pool2d_params params(const ct_layer *l) {
  ct_pool2d_params p = {l->ip[0], l->ip[1], l->ip[2], l->ip[3], l->ip[4], l->ip[5], l->ip[6], l->ip[7]};
  return p;
}

static int64_t out_size(int64_t in, int k, int s, int p, int ceil_mode) {
  int64_t num = in + 2 * p - k;
  int64_t o = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
  if (ceil_mode && (o - 1) * s >= in + p) o--;
  return o;
}

static ct_status setup(ct_layer *l) {
  const int *p = l->ip;
  if (p[0] <= 0 || p[1] <= 0 || p[2] <= 0 || p[3] <= 0 || p[4] < 0 || p[5] < 0)
    return ct_error(CT_ERR_INVALID_ARG, "kernel and stride must be positive, padding >= 0");
  if (p[4] * 2 > p[0] || p[5] * 2 > p[1])
    return ct_error(CT_ERR_INVALID_ARG, "padding %dx%d should be at most half of kernel %dx%d (PyTorch rule)", p[4],
                    p[5], p[0], p[1]);
  char got[96];
  if (l->in_ndim[0] != 3)
    return ct_error(CT_ERR_SHAPE, "expected input [N, C, H, W], got %s", ct_layer_input_str(l, 0, got, sizeof got));
  int64_t H = l->in_shape[0][1], W = l->in_shape[0][2];
  if (H + 2 * p[4] < p[0] || W + 2 * p[5] < p[1])
    return ct_error(CT_ERR_SHAPE, "input %lldx%lld (padded) is smaller than kernel %dx%d", (long long)H,
                    (long long)W, p[0], p[1]);
  l->out_ndim = 3;
  l->out_shape[0] = l->in_shape[0][0];
  l->out_shape[1] = out_size(H, p[0], p[2], p[4], p[6]);
  l->out_shape[2] = out_size(W, p[1], p[3], p[5], p[6]);
  return CT_OK;
}

static size_t max_ws(ct_layer *l, ct_exec *e) {
  ct_pool2d_params p = params(l);
  return e->be->maxpool2d_workspace_bytes(e->dev, &p, &l->x[0], &l->y);
}

static ct_status max_fwd(ct_layer *l, ct_exec *e) {
  ct_pool2d_params p = params(l);
  return e->be->maxpool2d_fwd(e->dev, &p, &l->x[0], &l->y, e->training ? l->ws : NULL);
}

/* With its producer's ReLU moved here (CT_RELU_MOVED_FROM_INPUT), the
 * ReLU's gradient is applied to dy first, from this pool's own output:
 * each window's gradient goes to its argmax alone, whose ReLU output is
 * the window's max, so masking dy by (y > 0) and scattering gives the
 * producer's masked gradient to the last bit, without keeping the
 * producer's output (plan/fuse.h). */
static ct_status max_bwd(ct_layer *l, ct_exec *e) {
  ct_pool2d_params p = params(l);
  if (!l->dx[0].data) return CT_OK;
  if (l->relu_moved == CT_RELU_MOVED_FROM_INPUT)
    CT_TRY(e->be->act_bwd(e->dev, CT_ACT_RELU, 0.0f, NULL, &l->y, &l->dy, &l->dy));
  return e->be->maxpool2d_bwd(e->dev, &p, &l->dy, l->ws, &l->dx[0]);
}

static ct_status avg_fwd(ct_layer *l, ct_exec *e) {
  ct_pool2d_params p = params(l);
  return e->be->avgpool2d_fwd(e->dev, &p, &l->x[0], &l->y);
}

static ct_status avg_bwd(ct_layer *l, ct_exec *e) {
  ct_pool2d_params p = params(l);
  return l->dx[0].data ? e->be->avgpool2d_bwd(e->dev, &p, &l->dy, &l->dx[0]) : CT_OK;
}

const ct_layer_class ct_layer_maxpool2d = {"maxpool2d", "MaxPool2d", 0, setup, NULL, max_ws, max_fwd, max_bwd, NULL};
const ct_layer_class ct_layer_avgpool2d = {"avgpool2d", "AvgPool2d", 0, setup, NULL, NULL, avg_fwd, avg_bwd, NULL};
