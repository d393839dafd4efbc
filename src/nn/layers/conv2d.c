/* Conv2d (nn.Conv2d): ip = cin, cout, kh, kw, sh, sw, ph, pw, dh, dw,
 * groups, bias; act is an optional fused activation. */
#include "nn/layer.h"

static ct_conv2d_params params(const ct_layer *l) {
  ct_conv2d_params p = {l->ip[4], l->ip[5], l->ip[6], l->ip[7], l->ip[8], l->ip[9], l->ip[10]};
  return p;
}

static ct_status setup(ct_layer *l) {
  const int *p = l->ip;
  int cin = p[0], cout = p[1], g = p[10];
  if (cin <= 0 || cout <= 0 || p[2] <= 0 || p[3] <= 0 || p[4] <= 0 || p[5] <= 0 || p[6] < 0 || p[7] < 0 ||
      p[8] <= 0 || p[9] <= 0 || g <= 0)
    return ct_error(CT_ERR_INVALID_ARG, "channels, kernel, stride, dilation and groups must be positive, padding >= 0");
  if (cin % g || cout % g)
    return ct_error(CT_ERR_INVALID_ARG, "in_channels %d and out_channels %d must be divisible by groups %d", cin, cout, g);
  char got[96];
  if (l->in_ndim[0] != 3 || l->in_shape[0][0] != cin)
    return ct_error(CT_ERR_SHAPE, "expected input [N, %d, H, W] (in_channels %d), got %s", cin, cin,
                    ct_layer_input_str(l, 0, got, sizeof got));
  int64_t H = l->in_shape[0][1], W = l->in_shape[0][2];
  int64_t oh = (H + 2 * p[6] - p[8] * (p[2] - 1) - 1) / p[4] + 1;
  int64_t ow = (W + 2 * p[7] - p[9] * (p[3] - 1) - 1) / p[5] + 1;
  if (H + 2 * p[6] < p[8] * (p[2] - 1) + 1 || W + 2 * p[7] < p[9] * (p[3] - 1) + 1)
    return ct_error(CT_ERR_SHAPE, "input %lldx%lld is smaller than the (dilated) kernel %dx%d", (long long)H,
                    (long long)W, p[8] * (p[2] - 1) + 1, p[9] * (p[3] - 1) + 1);
  l->out_ndim = 3;
  l->out_shape[0] = cout, l->out_shape[1] = oh, l->out_shape[2] = ow;
  int64_t ws[4] = {cout, cin / g, p[2], p[3]};
  if (ct_shape_numel(4, ws) > CT_LAYER_MAX_PARAMS)
    return ct_error(CT_ERR_INVALID_ARG, "%d x %d x %d x %d weights is more than %lld parameters in one layer", cout,
                    cin / g, p[2], p[3], (long long)CT_LAYER_MAX_PARAMS);
  int64_t bs = cout;
  ct_layer_declare(l, "weight", 0, CT_F32, 4, ws);
  if (p[11]) ct_layer_declare(l, "bias", 0, CT_F32, 1, &bs);
  return CT_OK;
}

static void init(ct_layer *l, uint64_t seed, float **state, int64_t **counters) {
  (void)counters;
  const int *p = l->ip;
  int64_t rf = (int64_t)p[2] * p[3];
  ct_init_weight_bias(l, seed, state, (int64_t)p[0] / p[10] * rf, (int64_t)p[1] / p[10] * rf);
}

static ct_status forward(ct_layer *l, ct_exec *e) {
  ct_conv2d_params p = params(l);
  return e->be->conv2d_fwd(e->dev, &p, &l->x[0], &l->w[0], l->ip[11] ? &l->w[1] : NULL, l->act, &l->y);
}

static ct_status backward(ct_layer *l, ct_exec *e) {
  ct_conv2d_params p = params(l);
  /* The fused activation's gradient, in place; a max pool reading this
   * output alone applies the ReLU's instead (CT_RELU_MOVED_TO_POOL). */
  if (ct_layer_bwd_act(l) != CT_ACT_NONE) CT_TRY(e->be->act_bwd(e->dev, l->act, 0.0f, NULL, &l->y, &l->dy, &l->dy));
  CT_TRY(e->be->conv2d_bwd_weights(e->dev, &p, &l->x[0], &l->dy, &l->g[0], l->ip[11] ? &l->g[1] : NULL,
                                   l->grad_beta));
  if (l->dx[0].data)
    CT_TRY((l->dx_acc[0] ? e->be->conv2d_bwd_data_acc : e->be->conv2d_bwd_data)(e->dev, &p, &l->dy, &l->w[0],
                                                                                   &l->dx[0]));
  return CT_OK;
}

/* cuDNN's workspace and staged operands (backend conv2d_workspace_bytes):
 * the forward's, or the larger of the weight gradient's and (when the
 * input takes a gradient) the data gradient's, which run one after the
 * other. */
static size_t pass_workspace_bytes(ct_layer *l, ct_exec *e, int backward) {
  if (!e->be->conv2d_workspace_bytes) return 0;
  ct_conv2d_params p = params(l);
  if (!backward) return e->be->conv2d_workspace_bytes(e->dev, 0, &p, &l->x[0], &l->w[0], &l->y);
  size_t dw = e->be->conv2d_workspace_bytes(e->dev, 2, &p, &l->x[0], &l->dy, &l->g[0]);
  size_t dx = l->inputs[0] >= 0 ? e->be->conv2d_workspace_bytes(e->dev, 1, &p, &l->dy, &l->w[0], &l->dx[0]) : 0;
  return dw > dx ? dw : dx;
}

const ct_layer_class ct_layer_conv2d = {"conv2d", "Conv2d", CT_LAYER_SAVES_INPUT, setup, init, NULL, forward, backward,
                                        pass_workspace_bytes};
