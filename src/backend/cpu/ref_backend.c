/* The portable C reference backend: every op, in f32 and f64, written for
 * clarity. Every other backend is tested against it. The kernels live in
 * ref_<area>.c (one ref_<area>.inc template instantiated per dtype); this
 * file only assembles the table. */
#include "backend/cpu/ref_ops.h"
#include "backend/device_impl.h"

/* The table's float ops go through ref_half.c, which widens bf16/f16
 * tensors to f32 (the correctness path of mixed precision) and passes
 * f32/f64 calls straight to the kernels. */
/* Lifetime and memory entries stay NULL: the reference works on host
 * memory and has no state. */
static ct_backend ref_table = {
    .name = "ref",
    .matmul = ct_ref_half_matmul,
    .linear_fwd = ct_ref_half_linear_fwd,
    .linear_bwd_data = ct_ref_half_linear_bwd_data,
    .linear_bwd_weights = ct_ref_half_linear_bwd_weights,
    .conv2d_fwd = ct_ref_half_conv2d_fwd,
    .conv2d_bwd_data = ct_ref_half_conv2d_bwd_data,
    .conv2d_bwd_data_acc = ct_ref_half_conv2d_bwd_data_acc,
    .conv2d_bwd_weights = ct_ref_half_conv2d_bwd_weights,
    .maxpool2d_workspace_bytes = ct_ref_half_maxpool2d_workspace_bytes,
    .maxpool2d_fwd = ct_ref_half_maxpool2d_fwd,
    .maxpool2d_bwd = ct_ref_half_maxpool2d_bwd,
    .avgpool2d_fwd = ct_ref_half_avgpool2d_fwd,
    .avgpool2d_bwd = ct_ref_half_avgpool2d_bwd,
    .adaptive_avgpool2d_fwd = ct_ref_half_adaptive_avgpool2d_fwd,
    .adaptive_avgpool2d_bwd = ct_ref_half_adaptive_avgpool2d_bwd,
    .adaptive_maxpool2d_fwd = ct_ref_half_adaptive_maxpool2d_fwd,
    .adaptive_maxpool2d_bwd = ct_ref_half_adaptive_maxpool2d_bwd,
    .batchnorm_fwd = ct_ref_half_batchnorm_fwd,
    .batchnorm_bwd = ct_ref_half_batchnorm_bwd,
    .batchnorm_apply = ct_ref_half_batchnorm_apply,
    .batchnorm_sync_stats = ct_ref_batchnorm_sync_stats,
    .batchnorm_sync_grads = ct_ref_batchnorm_sync_grads,
    .act_fwd = ct_ref_half_act_fwd,
    .act_bwd = ct_ref_half_act_bwd,
    .dropout_fwd = ct_ref_half_dropout_fwd,
    .dropout_bwd = ct_ref_half_dropout_bwd,
    .add = ct_ref_half_add,
    .axpby = ct_ref_half_axpby,
    .fill = ct_ref_fill,
    .cast = ct_ref_cast,
    .softmax_fwd = ct_ref_half_softmax_fwd,
    .softmax_bwd = ct_ref_half_softmax_bwd,
    .cross_entropy_fwd = ct_ref_cross_entropy_fwd,
    .cross_entropy_bwd = ct_ref_cross_entropy_bwd,
    .nll_fwd = ct_ref_nll_fwd,
    .nll_bwd = ct_ref_nll_bwd,
    .mse_fwd = ct_ref_mse_fwd,
    .mse_bwd = ct_ref_mse_bwd,
    .sumsq = ct_ref_sumsq,
    .nonfinite = ct_ref_nonfinite,
};

const ct_backend *ct_ref_backend(void) { return &ref_table; }
