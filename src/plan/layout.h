/* Activation layouts chosen when a model is bound to a device. Internal.
 *
 * oneDNN's convolution and pooling kernels compute in channel-blocked order
 * (nChw16c); with plain NCHW activations every convolution pays a reorder of
 * its input, its output and both gradients, a sizeable part of a small
 * model's step. cuDNN's tensor-core convolutions likewise compute
 * channels-last (NHWC) and transpose NCHW operands around every call. The
 * executor therefore stores an activation in the layout `want` (the
 * model's memory format: `auto` takes the backend's act_layout, C16 on an
 * AVX-512 cpu, C8 on other x86 cpus and NHWC on cuda; `channels-last` NHWC; `contiguous` plain)
 * when every layer that touches it accepts it: it is produced by a
 * convolution, a max or average pool, an elementwise activation, a batch
 * norm or a residual add, it has 4 dims, it is not the model's output, its
 * dtype is one the backend keeps in that layout (act_layout_dtypes: f32
 * and bf16 on the cpu, also f16 on cuda), for C16 (C8) its channels are a
 * multiple of 16 (8), and every reader is a convolution or a global adaptive
 * pool (1x1 output: ResNet's avgpool; both read any input layout) or one
 * of those layers whose own output takes the same layout (and, for a
 * layer with two inputs, whose inputs all do). An average pool that counts
 * padding under ceil_mode stays plain (the cpu's exact kernel for it reads
 * NCHW). Everything else stays plain, so the loss and its callers,
 * dropout (whose masks follow the plain element order), adaptive pooling
 * to more than one pixel, flatten and linear layers see NCHW as before,
 * and a global pool's output is plain. Where the backend's
 * maxpool_to_plain has `want`, a max pool whose output stays plain may
 * still read a laid-out input (the cpu's C8 on AVX2: the convolution in
 * front of the last pool before flatten keeps C8). Gradients take their
 * activation's layout. */
#ifndef CTRAIN_NN_LAYOUT_H
#define CTRAIN_NN_LAYOUT_H

#include "nn/model_impl.h"

/* Fills lay[i] (L entries) with the ct_layout of layer i's output and its
 * gradient under the rules above for the model's memory format on its
 * device's backend. Needs the precision plan (act_dt) and the fusion pass
 * done. CT_ERR_UNSUPPORTED when the format is channels-last and the
 * backend cannot keep NHWC (the reference). */
ct_status ct_model_choose_layouts(const ct_model *m, int *lay);

/* The same choice for a backend that keeps `want` (any ct_layout; PLAIN
 * gives all plain) for the dtypes in the bit set `dtypes` (1u << ct_dtype)
 * and pools into plain from the layouts in `pool_to_plain` (its
 * maxpool_to_plain), whatever the model's device and memory format are,
 * so the rules of one backend can be checked on a machine without it.
 * Never fails. */
void ct_model_choose_layouts_for(const ct_model *m, ct_layout want, unsigned dtypes, unsigned pool_to_plain, int *lay);

#endif
