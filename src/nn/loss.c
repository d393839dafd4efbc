#include "ctrain/loss.h"

#include <string.h>

#include "backend/device_impl.h"

int ct_loss_parse(const char *s, ct_loss_kind *out) {
  if (!strcmp(s, "cross_entropy") || !strcmp(s, "ce") || !strcmp(s, "crossentropy")) *out = CT_LOSS_CROSS_ENTROPY;
  else if (!strcmp(s, "nll")) *out = CT_LOSS_NLL;
  else if (!strcmp(s, "mse")) *out = CT_LOSS_MSE;
  else return -1;
  return 0;
}

const char *ct_loss_name(ct_loss_kind k) {
  return k == CT_LOSS_CROSS_ENTROPY ? "cross_entropy" : k == CT_LOSS_NLL ? "nll" : "mse";
}

static ct_status check(ct_loss_kind k, const ct_tensor *out, const ct_tensor *target) {
  if (k == CT_LOSS_MSE) {
    if (ct_tensor_numel(out) != ct_tensor_numel(target))
      return ct_error(CT_ERR_SHAPE, "mse loss: prediction has %lld elements, target %lld",
                      (long long)ct_tensor_numel(out), (long long)ct_tensor_numel(target));
    return CT_OK;
  }
  if (out->ndim != 2 || target->ndim != 1 || target->shape[0] != out->shape[0] || target->dtype != CT_I64)
    return ct_error(CT_ERR_SHAPE, "%s loss: expected output [N, C] and int64 targets [N]", ct_loss_name(k));
  return CT_OK;
}

ct_status ct_loss_forward(ct_device *d, ct_loss_kind k, const ct_tensor *out, const ct_tensor *target,
                          float label_smoothing, double *loss) {
  CT_TRY(check(k, out, target));
  const ct_backend *be = ct_device_backend(d);
  float host = 0;
  double host64 = 0;
  /* The loss lands in a one-element tensor of the output's dtype. */
  void *buf = out->dtype == CT_F64 ? (void *)&host64 : (void *)&host;
  void *dev_buf = buf;
  if (be->alloc) dev_buf = ct_device_alloc(d, 8);
  if (!dev_buf) return ct_error(CT_ERR_OUT_OF_MEMORY, "loss: cannot allocate 8 bytes");
  int64_t one = 1;
  ct_tensor l = ct_tensor_view(dev_buf, out->dtype, 1, &one);
  l.device = d;
  ct_status s = k == CT_LOSS_CROSS_ENTROPY ? be->cross_entropy_fwd(d, out, target, label_smoothing, &l)
                : k == CT_LOSS_NLL         ? be->nll_fwd(d, out, target, &l)
                                           : be->mse_fwd(d, out, target, &l);
  if (s == CT_OK && dev_buf != buf) s = ct_device_copy(NULL, buf, d, dev_buf, ct_dtype_size(out->dtype));
  if (dev_buf != buf) ct_device_free(d, dev_buf);
  *loss = out->dtype == CT_F64 ? host64 : host;
  return s;
}

ct_status ct_loss_backward(ct_device *d, ct_loss_kind k, const ct_tensor *out, const ct_tensor *target,
                           float label_smoothing, float grad_scale, ct_tensor *dout) {
  CT_TRY(check(k, out, target));
  const ct_backend *be = ct_device_backend(d);
  if (k == CT_LOSS_CROSS_ENTROPY) return be->cross_entropy_bwd(d, out, target, label_smoothing, grad_scale, dout);
  if (k == CT_LOSS_NLL) return be->nll_bwd(d, target, grad_scale, dout);
  return be->mse_bwd(d, out, target, grad_scale, dout);
}
