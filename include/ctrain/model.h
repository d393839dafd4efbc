/* Models: a graph of layers with PyTorch state_dict names.
 *
 * A model comes from the zoo (ct_model_zoo_names()) or from a model text
 * file (docs/MODEL_FORMAT.md). Creating it infers every layer's shape from
 * the input shape, lays its parameters out in one flat f32 buffer (and its
 * gradients in another), and initialises them as PyTorch does for each layer
 * type. ct_model_prepare() binds it to a device and a batch size: it builds
 * the static memory plan of a training (or inference) step and allocates
 * one arena of exactly the planned peak; forward/backward then allocate
 * nothing.
 */
#ifndef CTRAIN_MODEL_H
#define CTRAIN_MODEL_H

#include <stdint.h>
#include <stdio.h>

#include "ctrain/device.h"
#include "ctrain/status.h"
#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_model ct_model;

typedef struct ct_model_options {
  int in_channels, height, width; /* input shape C,H,W (0 = the model's default) */
  int num_classes;                /* 0 = the model's default */
  uint64_t seed;                  /* initialisation seed */
} ct_model_options;

/* One entry of the state dict: a parameter or a buffer. */
typedef struct ct_state_entry {
  const char *name;   /* "features.0.weight" */
  int is_buffer;
  ct_tensor value;    /* view into the model's storage (host or device) */
  ct_tensor grad;     /* parameters only; data NULL for buffers */
} ct_state_entry;

/* NULL-terminated list of zoo model names. */
const char *const *ct_model_zoo_names(void);

/* Creates a model from a zoo name or a model file path (a path is anything
 * containing '/' or ending in ".txt" / ".model"). Errors name the file, the
 * line and what was expected. */
ct_status ct_model_create(const char *name_or_path, const ct_model_options *opt, ct_model **out);
void ct_model_destroy(ct_model *m);

const char *ct_model_name(const ct_model *m);
/* Input shape C,H,W (or features in c for vector models: h = w = 1 and
 * ct_model_input_ndim() = 1). */
void ct_model_input_shape(const ct_model *m, int *c, int *h, int *w);
int ct_model_input_ndim(const ct_model *m);
/* Per-sample output size (classes, or regression outputs). */
int64_t ct_model_output_size(const ct_model *m);

/* State dict in PyTorch order: parameters and buffers, per module. */
int ct_model_state_count(const ct_model *m);
const ct_state_entry *ct_model_state(const ct_model *m, int i);
/* Index of a state entry by name, or -1. */
int ct_model_state_find(const ct_model *m, const char *name);
/* Trainable parameters as one flat f32 buffer and its gradient buffer, of
 * *n elements: each parameter starts at a multiple of 256 bytes (as
 * PyTorch's allocator places tensors), and the gaps between them hold
 * zeros that no step changes. An optimizer for the model is created with
 * this *n; ct_model_param_count is the number of parameters. */
float *ct_model_params(ct_model *m, size_t *n);
float *ct_model_grads(ct_model *m, size_t *n);
int64_t ct_model_param_count(const ct_model *m);

/* Memory order of the activations between layers, PyTorch's memory_format.
 * AUTO lets the device's backend choose (nChw16c on an AVX-512 CPU, NHWC on
 * CUDA); CONTIGUOUS keeps every activation NCHW; CHANNELS_LAST keeps them
 * NHWC wherever the layers allow (docs/ARCHITECTURE.md, "Activation
 * layouts"). Inputs, outputs and everything a caller sees stay NCHW and
 * results agree across formats to rounding. */
typedef enum ct_memory_format {
  CT_MEMORY_FORMAT_AUTO = 0,
  CT_MEMORY_FORMAT_CONTIGUOUS,
  CT_MEMORY_FORMAT_CHANNELS_LAST
} ct_memory_format;

/* Sets the memory format the next ct_model_prepare() lays activations out
 * in (default AUTO). CT_ERR_INVALID_ARG for a value outside the enum;
 * prepare fails with CT_ERR_UNSUPPORTED when the device's backend cannot
 * keep the requested format (the reference backend computes NCHW only). */
ct_status ct_model_set_memory_format(ct_model *m, ct_memory_format f);
/* Parses "auto", "contiguous" (alias "nchw") or "channels-last" (aliases
 * "channels_last", "nhwc"); CT_ERR_INVALID_ARG naming the text otherwise. */
ct_status ct_memory_format_parse(const char *s, ct_memory_format *out);
const char *ct_memory_format_name(ct_memory_format f);

/* Activation recompute (gradient checkpointing, PyTorch's
 * torch.utils.checkpoint.checkpoint_sequential for any graph): a training
 * plan keeps only the activations at the ends of `segments` segments of
 * the layer sequence, cut where one activation alone crosses, and runs
 * each segment's forward again before its backward. Fewer bytes in the
 * step arena for up to one extra forward pass; the gradients, running
 * statistics and dropout masks are those of the plain step (bit for bit
 * on the CPU). segments: 0 = off (default), CT_RECOMPUTE_AUTO = the mode
 * whose plan has the smallest peak among CT_RECOMPUTE_NORM,
 * CT_RECOMPUTE_CHEAP, CT_RECOMPUTE_SELECTIVE and every segment count
 * (ties: norm, cheap, selective, then fewer segments), or off when that
 * saves less than 1/16 of the plain plan, N >= 2 = N segments, or as
 * many as there are clean
 * cuts. CT_RECOMPUTE_CHEAP (memory-efficient batch norm) instead drops
 * only the outputs of batch norms, activations, residual adds and
 * dropout, recomputing each from the convolution/linear outputs the
 * backward keeps anyway just before its first backward reader: less
 * saved, little extra time. CT_RECOMPUTE_NORM drops the outputs of batch
 * norms alone (with their fused activation), each rebuilt by one
 * elementwise pass from its input and the statistics its forward saved:
 * what a convolution with batch norm and ReLU fused into its input would
 * keep. CT_RECOMPUTE_SELECTIVE drops what norm drops and the outputs of
 * convolutions that cost at most CT_RECOMPUTE_SELECTIVE_MACS
 * multiply-adds per output element (in_channels / groups x kernel area:
 * ResNet-50's 1x1 convolutions over 64 or 128 channels, whose outputs
 * only a batch norm's backward reads), each run again just before that
 * backward: ResNet-50's plan about 29% smaller than norm's for 3.5% more
 * FLOPs.
 * Applied by the next ct_model_prepare() of a training plan; inference
 * plans ignore it; the norm, cheap and selective modes fall back to off
 * where they would not make the plan smaller. CT_ERR_INVALID_ARG for
 * other negative values or counts above CT_RECOMPUTE_MAX. */
#define CT_RECOMPUTE_AUTO (-1)
#define CT_RECOMPUTE_CHEAP (-2)
#define CT_RECOMPUTE_NORM (-3)
#define CT_RECOMPUTE_SELECTIVE (-4)
#define CT_RECOMPUTE_SELECTIVE_MACS 128
#define CT_RECOMPUTE_MAX 4096
ct_status ct_model_set_recompute(ct_model *m, int segments);
/* Segments the prepared plan runs (1 = no recompute), and the layers whose
 * forward it runs twice. */
int ct_model_recompute_segments(const ct_model *m);
int ct_model_recompute_layers(const ct_model *m);
/* The mode of the prepared plan: 0 (nothing recomputed), CT_RECOMPUTE_NORM,
 * CT_RECOMPUTE_CHEAP, CT_RECOMPUTE_SELECTIVE, or its segment count. */
int ct_model_recompute_mode(const ct_model *m);
/* "off", "norm", "cheap", "selective", "auto" or "N segments" for a mode,
 * in buf. */
const char *ct_recompute_mode_str(int mode, char *buf, size_t n);
/* Parses "auto", "cheap", "norm", "selective", "off" or a segment count 0..
 * CT_RECOMPUTE_MAX (0 and 1: off) into a ct_model_set_recompute value;
 * CT_ERR_INVALID_ARG naming the text otherwise. */
ct_status ct_recompute_parse(const char *s, int *out);

/* Binds the model to a device with a maximum batch and builds the memory
 * plan; training = 1 plans forward + backward. Re-preparing replaces the
 * previous plan. Moves parameters to the device. */
ct_status ct_model_prepare(ct_model *m, ct_device *dev, int64_t max_batch, int training);
/* On a device that keeps the model resident (CUDA), one device block
 * holds its state, arena and batch staging; the optimizer's state is the
 * optimizer's own allocation (it belongs to whoever owns the optimizer: a
 * sharded optimizer holds only its part). Per-parameter f32 optimizer
 * buffers the memory check of ct_model_prepare counts beside the block
 * (ct_optim_state_buffers: SGD with momentum 1, Adam/AdamW 2, amsgrad 3),
 * so a run that cannot fit fails before its first step with every part
 * named. Call before ct_model_prepare. */
void ct_model_reserve_optimizer_state(ct_model *m, int buffers);
/* The same for an optimizer sharded over ranks (ZeRO): buffers of `shard`
 * values each, this rank's part of the flat parameter buffer. */
void ct_model_reserve_optimizer_shard(ct_model *m, int buffers, size_t shard);
/* Gradients a strategy keeps (ZeRO-2 on a GPU, src/parallel): the next
 * ct_model_prepare on a resident device leaves the gradient buffer out of
 * the model's block and counts `bytes`, what the strategy allocates for
 * the gradients instead, in its memory check. ct_model_grads is NULL from
 * then until a prepare without it, and each parameter's gradient is where
 * ct_model_place_grads puts it. Ignored on a host device. */
void ct_model_reserve_grads_elsewhere(ct_model *m, size_t bytes);
/* The same for a model prepared already: prepares it again (same device,
 * batch and mode). */
ct_status ct_model_prepare_grads_elsewhere(ct_model *m, size_t bytes);
/* Points each parameter's gradient view at place(ctx, its offset in the
 * flat layout, its count); NULL: back at the flat buffer (NULL views when
 * the model has none). Releasing the device state (a prepare, destroy)
 * unplaces them. */
void ct_model_place_grads(ct_model *m, float *(*place)(void *ctx, size_t offset, size_t count), void *ctx);

/* on: the block's two batch staging slots (the copy of batch k+1 lands
 * in one while step k reads the other) share one x buffer (their y stay
 * apart). For the GPU data
 * path, whose transform writes x on the compute stream after everything
 * queued before it, so a second x buffer (a whole f32 batch; docs/GPU.md,
 * "Batches") would only hold memory; a host batch staged
 * into a shared x is copied on the compute stream too, giving up its
 * overlap with compute. Call before ct_model_prepare, which lays out the
 * block. */
void ct_model_share_stage_x(ct_model *m, int on);

/* on: the model may take its input narrowed, for a batch producer that
 * writes it in any dtype and layout (the GPU data path's transform). When
 * every layer reading the input would cast it into one 16-bit dtype and
 * read it in one layout (the first convolution under autocast: bf16/f16,
 * channels-last on cuda), prepare makes that the input's own format, so
 * the plan holds no cast copy of the batch (kept to the first layer's
 * backward) and the staging buffer is half as large: 151 MiB less for
 * AlexNet-227 at batch 256. Bit for bit the same numbers: the transform
 * rounds the same f32 value once, as the cast did. Otherwise the input
 * stays f32. Call before ct_model_prepare. */
void ct_model_narrow_input(ct_model *m, int on);
/* The input's dtype and layout ct_model_forward takes: f32 plain, or what
 * prepare chose under ct_model_narrow_input (*layout, may be NULL:
 * CT_LAYOUT_PLAIN or CT_LAYOUT_NHWC). */
ct_dtype ct_model_input_dtype(const ct_model *m, ct_layout *layout);

/* Bytes of the step arena (the plan's peak) and of parameters+gradients. */
size_t ct_model_plan_bytes(const ct_model *m);
size_t ct_model_state_bytes(const ct_model *m);

/* Runs the forward pass on x [N, C, H, W] (or [N, F]) f32 (N <= max_batch,
 * memory on the model's device) and points *out at the output [N, K] inside
 * the arena (valid until the next forward). training selects batch-norm and
 * dropout behaviour; step keys dropout masks. */
ct_status ct_model_forward(ct_model *m, const ct_tensor *x, int training, uint32_t step, const ct_tensor **out);
/* Back-propagates dout (same shape as the last output) through the last
 * forward pass, adding parameter gradients into the gradient buffer. */
ct_status ct_model_backward(ct_model *m, const ct_tensor *dout);
/* The buffer a loss's backward should write dL/dout into: passing it to
 * ct_model_backward() avoids a copy. Valid after a training forward. */
ct_status ct_model_output_grad(ct_model *m, ct_tensor *dout);
/* Sets every parameter gradient to zero. */
ct_status ct_model_zero_grad(ct_model *m);

/* Replicas and stages (data, model and pipeline parallel). A model's
 * definition (the graph as built, with names, shapes and initialisation)
 * is an immutable object of its own, shared by the model and every
 * replica and stage made from it; each ct_model is one state of it on a
 * device. ct_model_replicate makes a new state of the whole definition,
 * ct_model_stage one of its layers [first, last] (0-based, in the order
 * they were added; ct_model_layer_count counts them); each starts from a
 * copy of m's current parameters, buffers and settings (precision, memory
 * format, recompute), keeps m's state_dict names and dropout streams, and
 * is prepared and used on its own device like any model: its own
 * parameters, gradients, buffers, memory plan and arena. A stage must be
 * cut where one activation alone crosses: its layers read only each other
 * and layer first - 1 (the model input when first is 0), and no later
 * layer reads inside it but its last layer; CT_ERR_INVALID_ARG naming the
 * offending layer otherwise. A stage's input is layer first - 1's output
 * (its shape per sample, at most 3 dimensions). */
int ct_model_layer_count(const ct_model *m);
ct_status ct_model_replicate(const ct_model *m, ct_model **out);
ct_status ct_model_stage(const ct_model *m, int first, int last, ct_model **out);
/* A stage after the first must send its input's gradient upstream: with
 * on = 1 before a training ct_model_prepare, the plan keeps a buffer for
 * it (f32 [N, ...], the input's shape) and ct_model_backward fills it;
 * ct_model_input_grad then points *dx at it (valid until the next
 * forward). CT_ERR_INVALID_ARG from ct_model_input_grad when the prepared
 * plan has none. */
ct_status ct_model_set_input_grad(ct_model *m, int on);
ct_status ct_model_input_grad(ct_model *m, ct_tensor *dx);

/* Multiply-adds of one sample's forward pass through the convolution
 * and linear layers (a training step is about 3 x 2 x this x batch
 * FLOPs); recomputed_only: of the layers the prepared plan runs forward a
 * second time (activation recompute). */
double ct_model_forward_macs(const ct_model *m, int recomputed_only);
/* Layer i of the prepared graph (0 .. ct_model_layer_count - 1): its
 * kind ("conv2d", the model file's keyword), its state_dict prefix, and
 * whether an activation was folded into it when it was prepared. */
const char *ct_model_layer_kind(const ct_model *m, int i);
const char *ct_model_layer_name(const ct_model *m, int i);
int ct_model_layer_fused_act(const ct_model *m, int i);
/* Runs layer i's forward (backward = 0) or backward pass once more on the
 * tensors the last training step bound, for timing one layer (bench_train
 * --profile): the backward adds into the gradients, so the step's
 * gradients are spoiled until the next step. */
ct_status ct_model_rerun_layer(ct_model *m, int i, int backward);

/* torchsummary-style table (layer, output shape, parameters, totals, sizes
 * in MB with activation memory from the plan). The model must be prepared;
 * batch is the batch shown in the shapes. */
ct_status ct_model_summary(ct_model *m, int64_t batch, FILE *out);

/* What fills the prepared step's memory plan when it is fullest: the time
 * of the peak (a layer's forward, backward or recompute), the bytes of the
 * buffers alive then by kind (layer outputs kept for a backward, output
 * gradients, workspaces, autocast copies, ...; their sum can be below the
 * arena, whose placement leaves gaps), and the `top` largest of them with
 * their layer and the time they live to. Sizes in MB of 2^20 bytes, as the
 * summary. Writes to out only; CT_ERR_INVALID_ARG before prepare. */
ct_status ct_model_memory_report(ct_model *m, int top, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
