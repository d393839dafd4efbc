/* A model's definition: the graph as ct_model_finish built it (each
 * layer's class, hyper-parameters, name, inferred shapes and state
 * declarations, before any prepare rewrites the graph), the input shape
 * and the initialisation seed. Immutable once made, and shared by
 * reference count between the model that built it and every replica and
 * stage made from it: each of those ct_model objects is one state of the
 * definition on a device (its parameters, gradients, buffers, memory plan,
 * arena, device block and staging). Retain and release are atomic, so
 * replicas may be destroyed on their own device threads. Internal. */
#ifndef CTRAIN_NN_MODEL_DEF_H
#define CTRAIN_NN_MODEL_DEF_H

#include <stdint.h>

#include "nn/layer.h"

typedef struct ct_model_def {
  _Atomic int refs;
  int in_ndim;
  int64_t in_shape[3];
  int n_layers;
  ct_layer *layers; /* [n_layers]; inputs index this array, -1 the input */
  uint64_t seed;    /* the initialisation seed ct_model_finish was given */
} ct_model_def;

/* A definition of n layers (copied) with one reference, or
 * CT_ERR_OUT_OF_MEMORY. */
ct_status ct_model_def_new(int in_ndim, const int64_t *in_shape, const ct_layer *layers, int n, uint64_t seed,
                           ct_model_def **out);
ct_model_def *ct_model_def_retain(ct_model_def *d);
/* Drops one reference; the last frees d. NULL is a no-op. */
void ct_model_def_release(ct_model_def *d);

#endif
