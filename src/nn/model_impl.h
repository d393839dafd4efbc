/* The model object and the graph-building calls used by the zoo and the
 * model-file parser. Internal. */
#ifndef CTRAIN_NN_MODEL_IMPL_H
#define CTRAIN_NN_MODEL_IMPL_H

#include "ctrain/amp.h"
#include "ctrain/model.h"
#include "nn/layer.h"
#include "nn/model_def.h"

/* What prepare binds (src/plan, src/exec): the step's memory plan and its
 * buffers per layer, NULL until the first ct_model_prepare. */
struct ct_plan;
struct ct_exec_bufs;

/* Where each parameter and buffer starts in the model's flat f32 state
 * (and so its gradient and optimizer state): the plan's alignment, so a
 * weight is placed as well as an activation. */
#define CT_STATE_ALIGN 256 /* == CT_PLAN_ALIGN (plan/plan.h checks) */


/* Where a strategy keeps the gradient of the count values at offset of
 * the flat layout (ct_model_place_grads). */
typedef float *(*ct_grad_place_fn)(void *ctx, size_t offset, size_t count);

/* "Layer `layer`'s parameter gradients, grads[first, first + count) of the
 * flat buffer, are final for this backward." */
typedef ct_status (*ct_model_grad_hook)(void *ctx, int layer, size_t first, size_t count);

/* One state of a definition (nn/model_def.h) on a device: the working
 * graph (the definition's layers, which prepare may fuse, with views into
 * this state), the flat parameters, gradients and buffers, and what
 * prepare binds. */
struct ct_model {
  char name[64];
  int in_ndim;           /* 3 for images, 1 for vectors */
  int64_t in_shape[3];
  int n_layers, cap_layers;
  ct_layer *layers;
  ct_model_def *def;     /* shared; NULL until ct_model_finish */
  int def_first;         /* layer i here is def->layers[def_first + i] (a stage's offset) */
  int output;            /* index of the layer whose output is the model's */

  /* State dict entries (names owned here) and flat storage. */
  int n_entries, cap_entries;
  ct_state_entry *entries;
  char **entry_names;
  size_t n_params;       /* f32 elements of the parameter buffer: each parameter
                            starts at a multiple of CT_STATE_ALIGN bytes, the gaps zero */
  size_t param_count;    /* trainable parameters (n_params less the gaps) */
  size_t n_buffers;      /* f32 elements of buffers (running stats), laid out alike */
  size_t n_counters;     /* i64 buffers (num_batches_tracked) */
  float *params, *grads, *buffers;
  int64_t *counters;

  /* Bound by ct_model_prepare. */
  ct_device *dev;
  int64_t max_batch;
  int training_plan;
  struct ct_plan *plan;
  struct ct_exec_bufs *eb;
  void *arena;
  ct_tensor input;         /* x of the last forward (the recompute reads it) */
  int64_t last_batch;
  int has_forward;         /* a training forward is pending backward */
  uint32_t last_step;      /* dropout key of the last forward */
  int64_t sample_offset, sample_stride; /* ct_model_set_sample_span */
  struct ct_norm_sync *norm_sync; /* ct_model_set_norm_sync */
  uint64_t seed;           /* dropout seed (ct_model_set_seed) */
  int grads_clean;         /* backward overwrites the gradients (beta 0):
                              they are zero, or stale and about to be
                              overwritten (ct_model_overwrite_grads) */

  ct_memory_format memory_format; /* ct_model_set_memory_format; applied by prepare */
  int recompute;                  /* ct_model_set_recompute; applied by prepare */

  /* Mixed precision (src/amp): set by ct_model_set_precision, applied by
   * ct_model_prepare. */
  ct_precision precision;
  ct_opt_level opt_level;
  ct_dtype *act_dt;        /* [L] dtype layer i computes in and stores y/dy in */
  ct_amp_rule *act_rule;   /* [L] the policy rule that chose it */
  int lp_dirty;            /* the weights changed since an inference plan's copies were cast */
  ct_tensor out32, dout32; /* fp32 output and its gradient when the output layer is not fp32 */

  /* Device-resident state (src/exec/device_state.c): non-NULL while the
   * flat storage, arena and staging live in one block on a CUDA device;
   * it keeps the host buffers. opt_buffers: optimizer buffers to plan for,
   * of opt_values values each (0: n_params; a ZeRO shard's). */
  struct ct_model_dstate *dstate;
  void *round_scratch;   /* O3 on a device: where the params are rounded (in dstate's block) */
  int opt_buffers;
  size_t opt_values;
  /* ZeRO-2 on a device (ct_model_prepare_grads_elsewhere): during that
   * prepare, the bytes a strategy allocates for the gradients instead of
   * the block's gradient buffer (0: the block holds them); and where the
   * strategy put each parameter's gradient (ct_model_place_grads; NULL:
   * in the flat buffer). */
  size_t grads_elsewhere;
  ct_grad_place_fn grad_place;
  void *grad_place_ctx;
  /* 1: one x staging buffer serves every slot (ct_model_share_stage_x). */
  int stage_x_shared;
  /* The model input's dtype and layout: f32 plain, or what prepare chose
   * when ct_model_narrow_input asked for it (narrow_input). */
  int narrow_input;
  ct_dtype in_dt;
  ct_layout in_layout;

  /* A stage's input gradient (ct_model_set_input_grad): asked for, and its
   * view after a backward. */
  int want_input_grad;
  ct_tensor in_grad;
  /* Called by the backward before and after each layer with parameters
   * (ct_model_set_grad_hooks); NULL: nothing is called. */
  ct_model_grad_hook grad_need, grad_hook;
  void *grad_hook_ctx;
};


/* Points every state entry's value/grad views (and the layers' w/g views)
 * at the flat storage, wherever it lives now (model.c). */
void ct_model_bind_state(ct_model *m);

/* How many input edges read layer i's output (the loss, reading the model
 * output, is not one). */
static inline int ct_model_readers(const ct_model *m, int i) {
  int n = 0;
  for (int k = 0; k < m->n_layers; k++)
    for (int j = 0; j < m->layers[k].n_inputs; j++) n += m->layers[k].inputs[j] == i;
  return n;
}

/* Lets the next backward overwrite the parameter gradients (beta 0, as
 * after ct_model_zero_grad) without zeroing them first. For a caller whose
 * backward follows at once: every layer runs its backward and each writes
 * all of its parameters' gradients, so the zero fill would be one more
 * write of the whole gradient buffer per step. Until that backward the
 * gradients hold stale values. */
void ct_model_overwrite_grads(ct_model *m);

/* Frees what the model's definition owns (graph, names, flat storage,
 * the precision policy's per-layer tables): a model never prepared, or
 * what ct_model_destroy (src/exec) leaves after releasing the bound state. */
void ct_model_free(ct_model *m);

/* Graph building. Each call appends a layer reading the given inputs
 * (layer indices, -1 = the model input) and returns its index, or -1 after
 * recording an error (the model then refuses to finish). Names are the
 * state_dict prefixes. */
ct_status ct_model_new(const char *name, ct_model **out);
int ct_g_add_layer(ct_model *m, const ct_layer_class *cls, const char *name, int in0, int in1);
int ct_g_linear(ct_model *m, const char *name, int in, int in_f, int out_f, int bias);
int ct_g_conv2d(ct_model *m, const char *name, int in, int cin, int cout, int k, int stride, int pad, int dil,
                int groups, int bias);
int ct_g_conv2d_rect(ct_model *m, const char *name, int in, int cin, int cout, int kh, int kw, int sh, int sw,
                     int ph, int pw, int dh, int dw, int groups, int bias);
int ct_g_maxpool2d(ct_model *m, const char *name, int in, int k, int stride, int pad, int ceil_mode);
int ct_g_avgpool2d(ct_model *m, const char *name, int in, int k, int stride, int pad, int ceil_mode,
                   int count_include_pad);
int ct_g_adaptive_avgpool2d(ct_model *m, const char *name, int in, int oh, int ow);
int ct_g_adaptive_maxpool2d(ct_model *m, const char *name, int in, int oh, int ow);
int ct_g_act(ct_model *m, const char *name, int in, ct_act act, float alpha);
int ct_g_dropout(ct_model *m, const char *name, int in, float p, int two_d);
int ct_g_batchnorm(ct_model *m, const char *name, int in, int features, int dims, float eps, float momentum,
                   int affine);
int ct_g_flatten(ct_model *m, const char *name, int in);
int ct_g_add(ct_model *m, const char *name, int a, int b);
int ct_g_softmax(ct_model *m, const char *name, int in, int log);

/* Sets the input shape, infers every layer's shapes, lays out and
 * initialises the state, and makes the definition (a new one, replacing
 * any the model had). The last layer added is the output. */
ct_status ct_model_finish(ct_model *m, int ndim, const int64_t *in_shape, uint64_t seed);
/* ct_model_finish without making a definition: for a replica or stage,
 * which shares its source's (model_derive.c). */
ct_status ct_model_finish_state(ct_model *m, int ndim, const int64_t *in_shape, uint64_t seed);


/* Zoo constructors: build the graph for the options (see zoo.c). */
ct_status ct_zoo_build(const char *name, const ct_model_options *opt, ct_model **out);
/* Model text file parser (model_text.c). */
ct_status ct_model_parse_file(const char *path, const ct_model_options *opt, ct_model **out);

#endif
