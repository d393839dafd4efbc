/* Mixed precision: precisions, apex-style opt levels, the autocast policy
 * (which layer computes in which dtype), a model's precision, and the loss
 * scaler with PyTorch GradScaler's semantics.
 *
 * Opt levels (apex's meanings):
 *   O0  fp32 everywhere (the default; bit-identical to a model without AMP);
 *   O1  autocast: convolutions and linear layers in the low precision with
 *       low-precision copies of their fp32 weights, softmax/log-softmax and
 *       losses in fp32, everything else in the dtype of its input (the
 *       widest input for mixed-input ops);
 *   O2  the whole model in the low precision, fp32 master weights and
 *       optimizer state, batch norm kept fp32 (parameters and statistics;
 *       its math runs in fp32), the loss reads an fp32 copy of the output;
 *   O3  pure low precision: as O2, and the parameters themselves (batch
 *       norm included) are rounded to the low precision after every step.
 * docs/MIXED_PRECISION.md has the table side by side with torch.autocast.
 */
#ifndef CTRAIN_AMP_H
#define CTRAIN_AMP_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/device.h"
#include "ctrain/dtype.h"
#include "ctrain/model.h"
#include "ctrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_precision { CT_PRECISION_FP32 = 0, CT_PRECISION_BF16, CT_PRECISION_FP16 } ct_precision;
typedef enum ct_opt_level { CT_OPT_O0 = 0, CT_OPT_O1, CT_OPT_O2, CT_OPT_O3 } ct_opt_level;

/* How a layer chooses the dtype it computes in (and stores its output in). */
typedef enum ct_amp_rule {
  CT_AMP_FP32 = 0,  /* cast inputs to fp32 */
  CT_AMP_LOWER,     /* cast inputs (and weights) to the low precision */
  CT_AMP_FOLLOW,    /* run in the dtype of the input */
  CT_AMP_PROMOTE    /* several inputs: run in the widest of their dtypes */
} ct_amp_rule;

/* "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16";
 * returns 0 on success, -1 for anything else. */
int ct_precision_parse(const char *s, ct_precision *out);
const char *ct_precision_name(ct_precision p);
/* The storage dtype of the low precision (CT_F32 for fp32). */
ct_dtype ct_precision_dtype(ct_precision p);
/* "O0".."O3" (also lower-case o); 0 on success, -1 otherwise. */
int ct_opt_level_parse(const char *s, ct_opt_level *out);
const char *ct_opt_level_name(ct_opt_level o);
const char *ct_amp_rule_name(ct_amp_rule r);

/* The policy: the rule for a layer kind (the model-file keyword of its
 * class: "conv2d", "linear", "batchnorm", "softmax", "logsoftmax",
 * "activation", "maxpool2d", "add", ...) under an opt level. Unknown kinds
 * FOLLOW their input; O0 is CT_AMP_FP32 for every kind. */
ct_amp_rule ct_amp_policy_rule(ct_opt_level o, const char *layer_kind);
/* The dtype a layer of that rule runs in, given the dtypes of its inputs
 * (n_in of them) and the low dtype. */
ct_dtype ct_amp_rule_dtype(ct_amp_rule r, const ct_dtype *in, int n_in, ct_dtype low);

/* Sets the precision a model runs in; call before ct_model_prepare(),
 * which plans every activation in the dtype the policy gives its layer and
 * allocates the low-precision weight copies (refreshed from the fp32
 * parameters at each training forward, and at the first forward after
 * prepare or after a training step). fp32 requires O0 and the low
 * precisions require O1..O3, else CT_ERR_INVALID_ARG. */
ct_status ct_model_set_precision(ct_model *m, ct_precision p, ct_opt_level o);
ct_precision ct_model_precision(const ct_model *m);
ct_opt_level ct_model_opt_level(const ct_model *m);
/* The dtype layer i computes in and stores its output in (valid after
 * prepare; CT_F32 before), and the rule that chose it. */
ct_dtype ct_model_layer_dtype(const ct_model *m, int i);
ct_amp_rule ct_model_layer_rule(const ct_model *m, int i);
/* Bytes of the low-precision weight copies of all layers (0 under O0).
 * They are buffers of the memory plan (ct_model_plan_bytes counts those
 * alive at its peak): in training each layer's is cast for its forward
 * and again for its backward-data pass, each alive for that pass. */
size_t ct_model_low_precision_bytes(const ct_model *m);
/* O3: rounds every fp32 parameter to the nearest value of the low
 * precision (round to nearest even), so the fp32 buffer holds a pure
 * low-precision model. No-op for other opt levels. */
ct_status ct_model_round_params(ct_model *m);
/* Marks the low-precision weight copies stale after the caller wrote the
 * fp32 parameters directly (loading weights between eval forwards). */
void ct_model_weights_changed(ct_model *m);

/* ---- loss scaler (torch.cuda.amp.GradScaler semantics) ---- */

typedef struct ct_grad_scaler {
  int enabled;            /* 0: scale 1, nothing checked, nothing skipped */
  int dynamic;            /* 1: GradScaler's growth/backoff; 0: static scale */
  float scale;            /* fp32, as GradScaler keeps it */
  float growth_factor;    /* 2.0 */
  float backoff_factor;   /* 0.5 */
  int64_t growth_interval; /* 2000 */
  int64_t growth_tracker; /* clean steps since the last change */
  int64_t skipped_steps;  /* optimizer steps skipped for inf/NaN gradients */
} ct_grad_scaler;

/* GradScaler's defaults: init_scale 2^16, growth 2.0 every 2000 clean
 * steps, backoff 0.5. dynamic = 0 keeps init_scale fixed (apex's static
 * loss scale) but still skips steps whose gradients overflow. */
void ct_grad_scaler_init(ct_grad_scaler *s, int enabled, int dynamic, double init_scale);
/* Checks the scaled gradients grads[n] (fp32, on dev) for inf/NaN and, when
 * all are finite, multiplies them by 1/scale (computed in double and
 * rounded to fp32, as GradScaler does). *found_inf is 1 on overflow (the
 * gradients are then left as they are). Disabled: *found_inf = 0. */
ct_status ct_grad_scaler_unscale(const ct_grad_scaler *s, ct_device *dev, float *grads, size_t n, int *found_inf);
/* GradScaler.update(): on overflow scale *= backoff and the tracker
 * resets, and the step counts as skipped; otherwise the tracker grows and
 * after growth_interval clean steps scale *= growth (kept only if finite)
 * and the tracker resets. Static scalers only count skips. */
void ct_grad_scaler_update(ct_grad_scaler *s, int found_inf);

#ifdef __cplusplus
}
#endif
#endif
