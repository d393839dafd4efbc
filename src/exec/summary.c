/* torchsummary-style model table. Activation memory is the memory plan's
 * peak for a training step, next to what no reuse would cost. */
#include <stdio.h>
#include <string.h>

#include "nn/model_impl.h"
#include "plan/exec_plan.h"

static void commas(int64_t v, char *buf, size_t n) {
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%lld", (long long)v);
  size_t len = strlen(tmp), o = 0;
  for (size_t i = 0; i < len && o + 1 < n; i++) {
    buf[o++] = tmp[i];
    if ((len - i - 1) % 3 == 0 && i + 1 < len && o + 1 < n) buf[o++] = ',';
  }
  buf[o] = 0;
}

static const char *type_name(const ct_layer *l) {
  static const char *acts[CT_ACT_COUNT] = {"Identity", "ReLU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Tanh"};
  if (l->cls == &ct_layer_activation) return acts[l->act];
  if (l->cls == &ct_layer_batchnorm) return l->ip[1] == 1 ? "BatchNorm1d" : "BatchNorm2d";
  return l->cls->torch_name;
}

ct_status ct_model_summary(ct_model *m, int64_t batch, FILE *out) {
  if (!m->arena) return ct_error(CT_ERR_INVALID_ARG, "summary: prepare the model first (ct_model_prepare)");
  const char *line = "------------------------------------------------------------------------------------------";
  /* Under mixed precision a column per layer: its dtype and the autocast
   * rule that chose it (fp32 tables stay as torchsummary prints them). */
  int amp = m->opt_level != CT_OPT_O0;
  fprintf(out, "%s\n%-44s %-28s %15s", line, "Layer (type)", "Output Shape", "Param #");
  fprintf(out, amp ? "  %-16s\n" : "\n", "Dtype (rule)");
  fprintf(out, "==========================================================================================\n");
  int64_t total = 0, trainable = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    int64_t np = 0;
    for (int k = 0; k < l->n_state; k++)
      if (!l->state[k].is_buffer) np += ct_shape_numel(l->state[k].ndim, l->state[k].shape);
    char name[200], shape[96], pc[32];
    snprintf(name, sizeof name, "%s-%d%s%s%s", type_name(l), i + 1, l->name[0] ? " (" : "", l->name, l->name[0] ? ")" : "");
    int64_t full[5] = {batch};
    for (int d = 0; d < l->out_ndim; d++) full[d + 1] = l->out_shape[d];
    ct_shape_str(l->out_ndim + 1, full, shape, sizeof shape);
    commas(np, pc, sizeof pc);
    fprintf(out, "%-44s %-28s %15s", name, shape, pc);
    if (amp) {
      char dr[48];
      snprintf(dr, sizeof dr, "%s (%s)", ct_dtype_name(ct_model_layer_dtype(m, i)), ct_amp_rule_name(ct_model_layer_rule(m, i)));
      fprintf(out, "  %-16s", dr);
    }
    fputc('\n', out);
    total += np;
    trainable += np;
  }
  char t1[32], t2[32], t3[32];
  commas(total, t1, sizeof t1);
  commas(trainable, t2, sizeof t2);
  commas(total - trainable, t3, sizeof t3);
  double mb = 1024.0 * 1024.0;
  double in_mb = (double)(batch * ct_shape_numel(m->in_ndim, m->in_shape)) * 4 / mb;
  double params_mb = (double)m->n_params * 4 / mb, buf_mb = (double)(m->n_buffers * 4 + m->n_counters * 8) / mb;
  fprintf(out, "==========================================================================================\n");
  fprintf(out, "Total params: %s\nTrainable params: %s\nNon-trainable params: %s\n", t1, t2, t3);
  fprintf(out, "%s\n", line);
  fprintf(out, "Batch size: %lld\n", (long long)batch);
  fprintf(out, "Input size (MB): %.2f\n", in_mb);
  fprintf(out, "Forward/backward pass size (MB): %.2f  (memory plan peak; %.2f without buffer reuse)\n",
          (double)m->plan->peak / mb, (double)m->plan->naive / mb);
  size_t plain = 0;
  if (ct_model_recompute_layers(m) && ct_model_plan_peak_with_recompute(m, 0, &plain) == CT_OK) {
    char how[32];
    ct_recompute_mode_str(ct_model_recompute_mode(m), how, sizeof how);
    fprintf(out, "Activation recompute: %s, %d layers run forward twice (%.2f MB without recompute)\n", how,
            ct_model_recompute_layers(m), (double)plain / mb);
  }
  fprintf(out, "Params size (MB): %.2f  (+ %.2f gradients, %.2f buffers)\n", params_mb, params_mb, buf_mb);
  double low_mb = (double)ct_model_low_precision_bytes(m) / mb;
  if (amp) {
    fprintf(out, "Precision: %s %s (fp32 master weights%s; loss reads fp32)\n", ct_precision_name(m->precision),
            ct_opt_level_name(m->opt_level), m->opt_level == CT_OPT_O3 ? " rounded to the low precision each step" : "");
    fprintf(out, "Low-precision weight copies (MB): %.2f  (in the memory plan: cast for each layer's forward, and "
                 "again for its backward)\n", low_mb);
  }
  fprintf(out, "Estimated Total Size (MB): %.2f\n", in_mb + (double)m->plan->peak / mb + 2 * params_mb + buf_mb);
  fprintf(out, "%s\n", line);
  return CT_OK;
}

double ct_model_forward_macs(const ct_model *m, int recomputed_only) {
  double macs = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    if (recomputed_only && !(m->eb->tl.rerun && i < m->eb->tl.L && m->eb->tl.rerun[i])) continue;
    if (l->cls == &ct_layer_conv2d) {
      double out = (double)l->out_shape[0] * (double)l->out_shape[1] * (double)l->out_shape[2];
      macs += out * (double)(l->ip[0] / l->ip[10]) * l->ip[2] * l->ip[3];
    } else if (l->cls == &ct_layer_linear) {
      macs += (double)l->ip[0] * l->ip[1];
    }
  }
  return macs;
}

const char *ct_model_layer_kind(const ct_model *m, int i) {
  return i >= 0 && i < m->n_layers ? m->layers[i].cls->kind : NULL;
}

const char *ct_model_layer_name(const ct_model *m, int i) {
  return i >= 0 && i < m->n_layers ? m->layers[i].name : NULL;
}

int ct_model_layer_fused_act(const ct_model *m, int i) {
  return i >= 0 && i < m->n_layers && m->layers[i].act != CT_ACT_NONE;
}
