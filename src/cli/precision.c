/* --precision / --opt-level / --loss-scale / --loss-scale-init: the model's
 * precision and the trainer's loss scaler (docs/MIXED_PRECISION.md). */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

ct_status cli_apply_precision(const cli_opts *o, ct_model *m, ct_grad_scaler *scaler) {
  ct_precision p = CT_PRECISION_FP32;
  ct_opt_level lvl = CT_OPT_O0;
  if (o->precision && ct_precision_parse(o->precision, &p))
    return ct_error(CT_ERR_INVALID_ARG, "--precision expects fp32, bf16 or fp16, got '%s'", o->precision);
  if (o->opt_level && ct_opt_level_parse(o->opt_level, &lvl))
    return ct_error(CT_ERR_INVALID_ARG, "--opt-level expects O0, O1, O2 or O3, got '%s'", o->opt_level);
  /* A low precision alone means autocast (O1), as torch.autocast. */
  if (!o->opt_level && p != CT_PRECISION_FP32) lvl = CT_OPT_O1;
  if (o->opt_level && !o->precision && lvl != CT_OPT_O0)
    return ct_error(CT_ERR_INVALID_ARG, "--opt-level %s needs --precision bf16 or fp16", o->opt_level);
  if (p == CT_PRECISION_FP32 && lvl != CT_OPT_O0)
    return ct_error(CT_ERR_INVALID_ARG, "--opt-level %s needs --precision bf16 or fp16 (fp32 is O0)", o->opt_level);
  if (p != CT_PRECISION_FP32 && lvl == CT_OPT_O0)
    return ct_error(CT_ERR_INVALID_ARG, "--opt-level O0 is fp32; --precision %s needs O1, O2 or O3", o->precision);
  CT_TRY(ct_model_set_precision(m, p, lvl));
  if (!scaler) {
    if (o->loss_scale || o->have_loss_scale_init)
      return ct_error(CT_ERR_INVALID_ARG, "--loss-scale and --loss-scale-init only apply to training");
    return CT_OK;
  }
  /* Default as apex: dynamic for fp16 at O1/O2, off for bf16 (its range is
   * fp32's), fp32 and O3. */
  int enabled = p == CT_PRECISION_FP16 && (lvl == CT_OPT_O1 || lvl == CT_OPT_O2), dynamic = 1;
  double init = 65536.0;
  if (o->loss_scale) {
    if (!strcmp(o->loss_scale, "dynamic")) enabled = 1, dynamic = 1;
    else if (!strcmp(o->loss_scale, "none")) enabled = 0;
    else {
      char *end;
      double v = strtod(o->loss_scale, &end);
      /* The bounds of --loss-scale-init: below ~3e-39 the fp32 1/scale
       * that unscales the gradients is inf (and every step NaN). */
      if (end == o->loss_scale || *end || !(v >= 1e-30 && v <= 3.4e38))
        return ct_error(CT_ERR_INVALID_ARG,
                        "--loss-scale expects dynamic, none or a number in [1e-30, 3.4e38], got '%s'", o->loss_scale);
      enabled = 1, dynamic = 0, init = v;
    }
  }
  if (o->have_loss_scale_init) {
    if (!enabled || !dynamic)
      return ct_error(CT_ERR_INVALID_ARG, "--loss-scale-init sets the start of a dynamic loss scale; add --loss-scale dynamic");
    init = o->loss_scale_init;
  }
  ct_grad_scaler_init(scaler, enabled, dynamic, init);
  return CT_OK;
}
