/* Layers: the nodes of a model graph.
 *
 * A layer class is a small table (setup, init, forward, backward) in its own
 * file under src/nn/layers/. A layer instance records its configuration,
 * the layers it reads (inputs), its per-sample input/output shapes, and the
 * state entries (parameters and buffers) it owns as offsets into the model's
 * flat storage. The executor fills the runtime tensors (x, y, dx, dy, ws,
 * parameter and gradient views) before calling forward/backward, so layer
 * code never allocates and never knows where its memory lives.
 */
#ifndef CTRAIN_NN_LAYER_H
#define CTRAIN_NN_LAYER_H

#include <stdint.h>

#include "backend/backend.h"
#include "ctrain/device.h"

#define CT_LAYER_MAX_IN 2
#define CT_LAYER_MAX_STATE 5
#define CT_NAME_MAX 128
/* One layer's parameters beyond this are refused as absurd (8 GiB of
 * fp32 weights) before anything is allocated. */
#define CT_LAYER_MAX_PARAMS (INT64_C(1) << 31)
/* A whole model's parameters beyond this are refused as well: a few layers
 * each under the limit above would otherwise let a two-line model file
 * allocate (and touch) tens of GiB. */
#define CT_MODEL_MAX_PARAMS CT_LAYER_MAX_PARAMS
/* One sample's activation (the model's input or a layer's output) beyond
 * this many elements is refused as absurd (8 GiB of fp32 for one sample).
 * It also keeps the planner's batch x elements x bytes far from overflow:
 * `input 1048576x1x1` then `adaptiveavgpool2d 1048576` was 2^60 elements,
 * and at batch 4 the planned bytes wrapped to a small arena that the
 * forward pass overran. */
#define CT_LAYER_MAX_NUMEL (INT64_C(1) << 31)

/* What a layer's backward reads, so the planner keeps it alive. */
enum {
  CT_LAYER_SAVES_INPUT = 1,   /* backward reads x */
  CT_LAYER_SAVES_OUTPUT = 2,  /* backward reads y */
  CT_LAYER_ALIAS = 4,         /* y is x with another shape (flatten): no buffer */
  CT_LAYER_NO_BACKWARD = 8,   /* nothing flows back (none yet) */
  /* a recompute forward reads the workspace its first forward kept (batch
   * norm's saved statistics) instead of writing one of its own */
  CT_LAYER_RERUN_READS_WS = 16
};

/* Where a folded ReLU's gradient is applied (plan/fuse.h): by the producer
 * itself (0), or, when a max pool alone reads the producer's output, by
 * that pool to its output gradient (the producer is marked _TO_POOL, the
 * pool _FROM_INPUT), so the producer's output need not be kept. */
enum { CT_RELU_MOVED_TO_POOL = 1, CT_RELU_MOVED_FROM_INPUT = 2 };

typedef enum ct_init_kind {
  CT_INIT_DEFAULT = 0,          /* PyTorch's layer default */
  CT_INIT_KAIMING_NORMAL_FAN_OUT, /* torchvision ResNet/VGG convs */
  CT_INIT_NORMAL_001,           /* torchvision VGG linear: N(0, 0.01), bias 0 */
  CT_INIT_ZERO_BIAS             /* default weight, bias 0 */
} ct_init_kind;

typedef struct ct_layer ct_layer;

/* Runtime context of one forward/backward pass. */
/* SyncBatchNorm's collective, a strategy's: sums n doubles over every
 * replica of the step, in place. vals is in the memory of the replica's
 * device: on a GPU the sum is queued behind the work queued so far and
 * the work queued after it waits for it, without the host waiting. */
typedef struct ct_norm_sync {
  ct_status (*sum)(void *ctx, double *vals, int n);
  /* Non-zero while this replica's batch is no part of the step (a
   * DataParallel replica left without samples, whose loss share is 0):
   * it adds nothing and passes no gradient down. NULL: never. */
  int (*excluded)(void *ctx);
  void *ctx;
  /* The layers' scratch for the sums (ct_norm_sync_scratch), on one
   * device; the strategy releases it (ct_norm_sync_release). */
  ct_device *dev;
  void *scratch;
  size_t scratch_bytes;
} ct_norm_sync;

/* At least bytes of scratch in dev's memory, grown (and so synchronised,
 * on a GPU) only when a layer asks for more than any before. The
 * contents do not survive a growth. */
ct_status ct_norm_sync_scratch(ct_norm_sync *s, ct_device *dev, size_t bytes, void **out);
void ct_norm_sync_release(ct_norm_sync *s);

typedef struct ct_exec {
  ct_device *dev;
  const ct_backend *be;
  int training;
  int64_t batch;   /* N of this pass (may be below the planned batch) */
  uint64_t seed;
  uint32_t step;   /* dropout key: optimizer step of this pass */
  int recompute;   /* a training forward run again before the backward
                      (plan/recompute.h): update no running statistics */
  /* This pass's planned workspace (the class's pass_workspace_bytes; the
   * backend has it too, set_workspace), NULL when it has none. */
  void *pass_ws;
  size_t pass_ws_bytes;
  /* Where this pass's samples stand in the step's whole batch
   * (ct_step_pos): sample i is number sample_offset + i x sample_stride. */
  int64_t sample_offset, sample_stride;
  /* Set: batch norm normalises a training batch with the statistics of
   * the step's global batch (SyncBatchNorm), summed through it. */
  ct_norm_sync *norm_sync;
} ct_exec;

typedef struct ct_state_decl {
  char suffix[24];   /* "weight", "bias", "running_mean", ... */
  int is_buffer;     /* 0 = trainable parameter, 1 = buffer (no gradient) */
  ct_dtype dtype;    /* f32, or i64 for num_batches_tracked */
  int ndim;
  int64_t shape[4];
  size_t offset;     /* element offset in the model's flat storage of its kind */
  int entry;         /* index in the model's state list */
} ct_state_decl;

typedef struct ct_layer_class {
  const char *kind;        /* model-file keyword: "conv2d" */
  const char *torch_name;  /* PyTorch class: "Conv2d" */
  unsigned flags;
  /* Computes out_shape from in_shape(s) and declares state entries;
   * returns CT_ERR_SHAPE with the layer's name on a mismatch. */
  ct_status (*setup)(ct_layer *l);
  /* Fills this layer's parameters and buffers (host f32/i64 memory). */
  void (*init)(ct_layer *l, uint64_t seed, float **state, int64_t **counters);
  /* Bytes of workspace kept from forward to backward (may be NULL). */
  size_t (*workspace_bytes)(ct_layer *l, ct_exec *e);
  ct_status (*forward)(ct_layer *l, ct_exec *e);
  ct_status (*backward)(ct_layer *l, ct_exec *e);
  /* Bytes of device workspace the forward (backward 0) or the backward
   * (1) needs only while it runs, for the tensors as bound at the planned
   * batch (may be NULL: none). The planner gives each pass a buffer of
   * this size at that pass's time, and the executor hands it to the
   * backend (set_workspace) around the call. */
  size_t (*pass_workspace_bytes)(ct_layer *l, ct_exec *e, int backward);
} ct_layer_class;

struct ct_layer {
  const ct_layer_class *cls;
  char name[CT_NAME_MAX]; /* state_dict prefix, e.g. "features.0" */
  int index;             /* position in its model */
  /* Index in the model it was defined in: keys its random streams
   * (dropout masks), so a stage's layers draw their whole model's. */
  int rng_index;
  int n_inputs;
  int inputs[CT_LAYER_MAX_IN]; /* producing layer index, -1 = model input */

  /* Configuration; meaning per class (documented in each layer file). */
  int ip[12];
  float fp[4];
  int line;              /* line in the model file (0 for zoo models) */
  ct_act act;            /* fused activation after the op (conv/linear/bn) */
  int relu_moved;        /* CT_RELU_MOVED_*: set by the fusion pass (plan/fuse.h) */
  ct_init_kind init_kind;

  /* Per-sample shapes (no batch dimension). */
  int in_ndim[CT_LAYER_MAX_IN];
  int64_t in_shape[CT_LAYER_MAX_IN][4];
  int out_ndim;
  int64_t out_shape[4];

  int n_state;
  ct_state_decl state[CT_LAYER_MAX_STATE];

  /* Runtime, filled by the executor for each pass: everything from x on
   * (a definition keeps none of it, nn/model_def.c). */
  ct_tensor x[CT_LAYER_MAX_IN];  /* inputs [N, ...] */
  ct_tensor y;                   /* output [N, ...] */
  ct_tensor dy;                  /* gradient of the output */
  ct_tensor dx[CT_LAYER_MAX_IN]; /* gradient of the inputs; data NULL = not needed */
  ct_tensor w[CT_LAYER_MAX_STATE]; /* state views (params and buffers) */
  ct_tensor g[CT_LAYER_MAX_STATE]; /* gradient views (params only) */
  int64_t *counter;              /* num_batches_tracked for batch norm */
  void *ws;                      /* workspace from forward to backward */
  size_t ws_reserve;             /* bytes of ws the backend keeps for itself
                                    (batch norm's fused activation), set by
                                    workspace_bytes */
  float grad_beta;               /* 0 overwrite / 1 accumulate parameter grads */
  /* 1: dx[j] already holds another reader's gradient, add into it (the
   * backend's accumulating op; only where exec_plan.c's dx_accumulates
   * allows it). */
  int dx_acc[CT_LAYER_MAX_IN];
};

/* The fused activation whose gradient l's own backward applies: l->act,
 * or none when a max pool took its ReLU's gradient over (plan/fuse.h). */
static inline ct_act ct_layer_bwd_act(const ct_layer *l) {
  return l->relu_moved == CT_RELU_MOVED_TO_POOL ? CT_ACT_NONE : l->act;
}

/* Declares a state entry; returns its slot. */
int ct_layer_declare(ct_layer *l, const char *suffix, int is_buffer, ct_dtype dt, int ndim, const int64_t *shape);
/* numel of a per-sample shape. */
int64_t ct_shape_numel(int ndim, const int64_t *shape);
/* "[N, 3, 32, 32]": input j's shape with the batch as N, for messages. */
const char *ct_layer_input_str(const ct_layer *l, int j, char *buf, size_t n);
/* Fills [N, shape...] into a tensor descriptor (data unchanged). */
void ct_layer_batch_shape(ct_tensor *t, int64_t n, int ndim, const int64_t *shape);

/* Uniform(-b, b) / normal(0, std) fills from the layer's init stream. */
void ct_init_uniform(float *p, int64_t n, float bound, uint64_t seed, uint32_t stream);
void ct_init_normal(float *p, int64_t n, float std, uint64_t seed, uint32_t stream);
/* PyTorch's default for Linear/Conv: kaiming_uniform(a=sqrt(5)) weights and
 * U(+-1/sqrt(fan_in)) bias; handles ct_init_kind overrides. */
void ct_init_weight_bias(ct_layer *l, uint64_t seed, float **state, int64_t fan_in, int64_t fan_out);

/* Layer classes (one file each under src/nn/layers/). */
extern const ct_layer_class ct_layer_linear, ct_layer_conv2d, ct_layer_maxpool2d, ct_layer_avgpool2d,
    ct_layer_adaptive_avgpool2d, ct_layer_adaptive_maxpool2d, ct_layer_activation, ct_layer_dropout,
    ct_layer_dropout2d, ct_layer_batchnorm, ct_layer_flatten, ct_layer_add, ct_layer_softmax,
    ct_layer_log_softmax, ct_layer_identity;

#endif
