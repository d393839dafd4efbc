/* Activation layouts chosen when a model is bound to a device. Internal.
 *
 * oneDNN's convolution and pooling kernels compute in channel-blocked order
 * (nChw16c); with plain NCHW activations every convolution pays a reorder of
 * its input, its output and both gradients (about 1.5 ms of an 11 ms cnn
 * bf16 step on 2 cores). cuDNN's tensor-core convolutions likewise compute
 * channels-last (NHWC) and transpose NCHW operands around every call. The
 * executor therefore stores an activation in the layout the device's
 * backend asks for (ct_backend's act_layout: CT_LAYOUT_C16 on the cpu,
 * CT_LAYOUT_NHWC on cuda) when every layer that touches it accepts it: it
 * is produced by a convolution, a max pool or an elementwise activation
 * (NHWC also: an average pool; C16 also: an f32 batch norm and a residual
 * add), it has 4 dims, it is not the model's output, every reader is a
 * convolution (any input layout) or one of those layers whose own output
 * takes the same layout (and, for a layer with two inputs, whose inputs
 * all do), and
 *   C16:  channels are a multiple of 16, dtype f32/bf16;
 *   NHWC: any channel count, dtype f32/bf16/f16.
 * Everything else stays plain, so the loss, losses' callers, dropout (whose
 * masks follow the plain element order), adaptive pooling, flatten and
 * batch norm on CUDA or in bf16 see NCHW as before. Gradients take their
 * activation's layout. */
#ifndef CTRAIN_NN_LAYOUT_H
#define CTRAIN_NN_LAYOUT_H

#include "nn/model_impl.h"

/* Fills lay[i] (L entries) with the ct_layout of layer i's output and its
 * gradient under the rules above for the device's backend (its
 * act_layout); all CT_LAYOUT_PLAIN when the backend wants none or the
 * pass is off. Needs the precision plan (act_dt) and the fusion pass
 * done. Never fails. */
void ct_model_choose_layouts(const ct_model *m, int *lay);

/* The same choice for a backend that asks for `want` (any ct_layout;
 * PLAIN gives all plain), whatever the model's device is, so the rules of
 * one backend can be checked on a machine without it. Ignores
 * ct_layout_set_enabled. Never fails. */
void ct_model_choose_layouts_for(const ct_model *m, ct_layout want, int *lay);

/* Turns the choice on (default) or off for models prepared afterwards, so
 * tests and benchmarks can compare blocked and plain steps. Process-wide. */
void ct_layout_set_enabled(int on);

#endif
