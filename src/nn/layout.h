/* Activation layouts chosen when a model is bound to a device. Internal.
 *
 * oneDNN's convolution and pooling kernels compute in channel-blocked order
 * (nChw16c); with plain NCHW activations every convolution pays a reorder of
 * its input, its output and both gradients (about 1.5 ms of an 11 ms cnn
 * bf16 step on 2 cores). The executor therefore stores an activation as
 * CT_LAYOUT_C16 when the device's backend accepts it (ct_backend's
 * c16_layouts) and every layer that touches it does too: it is produced by
 * a convolution, a max pool or an elementwise activation, it has 4 dims
 * with channels a multiple of 16 and an f32/bf16 dtype, every reader is a
 * convolution (any input layout) or a max pool/activation whose own output
 * is C16, and it is not the model's output. Everything else stays plain,
 * so the loss, losses' callers, batch norm, dropout (whose masks follow
 * the plain element order), adaptive pooling and flatten see NCHW as
 * before. Gradients take their activation's layout. */
#ifndef CTRAIN_NN_LAYOUT_H
#define CTRAIN_NN_LAYOUT_H

#include "nn/model_impl.h"

/* Fills c16[i] (L entries) with 1 where layer i's output and its gradient
 * are stored as CT_LAYOUT_C16 under the rules above; all 0 when the
 * backend has no C16 support or the pass is off. Needs the precision plan
 * (act_dt) and the fusion pass done. Never fails. */
void ct_model_choose_layouts(const ct_model *m, int *c16);

/* Turns the choice on (default) or off for models prepared afterwards, so
 * tests and benchmarks can compare blocked and plain steps. Process-wide. */
void ct_layout_set_enabled(int on);

#endif
