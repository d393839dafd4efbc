/* The shared, immutable model definition (model_def.h). */
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_def.h"

ct_status ct_model_def_new(int in_ndim, const int64_t *in_shape, const ct_layer *layers, int n, uint64_t seed,
                           ct_model_def **out) {
  *out = NULL;
  ct_model_def *d = calloc(1, sizeof *d);
  ct_layer *l = malloc((size_t)n * sizeof *l);
  if (!d || !l) {
    free(d), free(l);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "model definition: out of host memory");
  }
  memcpy(l, layers, (size_t)n * sizeof *l);
  /* No views into the state that built it: the runtime part is that
   * state's (nn/layer.h). */
  for (int i = 0; i < n; i++) memset((char *)&l[i] + offsetof(ct_layer, x), 0, sizeof *l - offsetof(ct_layer, x));
  atomic_init(&d->refs, 1);
  d->in_ndim = in_ndim;
  memcpy(d->in_shape, in_shape, (size_t)in_ndim * sizeof *in_shape);
  d->n_layers = n;
  d->layers = l;
  d->seed = seed;
  *out = d;
  return CT_OK;
}

ct_model_def *ct_model_def_retain(ct_model_def *d) {
  atomic_fetch_add(&d->refs, 1);
  return d;
}

void ct_model_def_release(ct_model_def *d) {
  if (!d || atomic_fetch_sub(&d->refs, 1) != 1) return;
  free(d->layers);
  free(d);
}
