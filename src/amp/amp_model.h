/* amp's entry points for the model: what the executor and the step
 * planner call to give a model mixed precision (src/amp/amp_model.c).
 * Internal.
 *
 * Mixed precision hooks of the executor: chooses
 * every layer's dtype; the span of the flat params layer i's
 * low-precision weight copy holds (elements from *first; 0: the layer
 * has none); points every layer's weights at the fp32 params, those a
 * copy serves at none yet (data NULL, the low dtype); points layer i's
 * at its copy (the planned buffer; NULL: none yet) and, when cast, casts
 * its span of the fp32 params into it. */
#ifndef CTRAIN_AMP_AMP_MODEL_H
#define CTRAIN_AMP_AMP_MODEL_H

#include <stddef.h>

#include "ctrain/model.h"
#include "ctrain/status.h"

ct_status ct_amp_model_plan(ct_model *m);
size_t ct_amp_layer_weights(const ct_model *m, int i, size_t *first);
void ct_amp_model_bind_weights(ct_model *m);
ct_status ct_amp_layer_copy(ct_model *m, int i, void *copy, int cast);
void ct_amp_model_free(ct_model *m);

#endif
