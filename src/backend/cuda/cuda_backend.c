/* The CUDA backend table. Every op is filled here: the reference kernels
 * that ct_backend_fill_defaults() would copy in read host memory, and
 * tensors of a CUDA device live in device memory, so a gap in this table
 * must be a CUDA op, never a host fallback. */
#include <pthread.h>

#include "backend/cuda/cuda_impl.h"

static ct_backend cuda_table = {
    .name = "cuda",
    .act_layout = CT_LAYOUT_NHWC,
    .act_layouts = 1u << CT_LAYOUT_NHWC,
    .act_layout_dtypes = 1u << CT_F32 | 1u << CT_BF16 | 1u << CT_F16,
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .sync = cuda_sync,

    .matmul = cuda_matmul,
    .linear_fwd = cuda_linear_fwd,
    .linear_bwd_data = cuda_linear_bwd_data,
    .linear_bwd_weights = cuda_linear_bwd_weights,

    .conv2d_fwd = cuda_conv2d_fwd,
    .conv2d_bwd_data = cuda_conv2d_bwd_data,
    .conv2d_bwd_data_acc = cuda_conv2d_bwd_data_acc,
    .conv2d_bwd_weights = cuda_conv2d_bwd_weights,
    .conv2d_workspace_bytes = cuda_conv2d_workspace_bytes,
    .set_workspace = cuda_set_workspace,

    .maxpool2d_workspace_bytes = cuda_maxpool2d_workspace_bytes,
    .maxpool2d_fwd = cuda_maxpool2d_fwd,
    .maxpool2d_bwd = cuda_maxpool2d_bwd,
    .avgpool2d_fwd = cuda_avgpool2d_fwd,
    .avgpool2d_bwd = cuda_avgpool2d_bwd,
    .adaptive_avgpool2d_fwd = cuda_adaptive_avgpool2d_fwd,
    .adaptive_avgpool2d_bwd = cuda_adaptive_avgpool2d_bwd,
    .adaptive_maxpool2d_fwd = cuda_adaptive_maxpool2d_fwd,
    .adaptive_maxpool2d_bwd = cuda_adaptive_maxpool2d_bwd,

    .batchnorm_fwd = cuda_batchnorm_fwd,
    .batchnorm_bwd = cuda_batchnorm_bwd,
    .batchnorm_apply = cuda_batchnorm_apply,
    .batchnorm_sync_stats = cuda_batchnorm_sync_stats,
    .batchnorm_sync_grads = cuda_batchnorm_sync_grads,
    .batchnorm_act_reserve = cuda_batchnorm_act_reserve,
    .batchnorm_act_fwd = cuda_batchnorm_act_fwd,
    .batchnorm_act_bwd = cuda_batchnorm_act_bwd,

    .act_fwd = cuda_act_fwd,
    .act_bwd = cuda_act_bwd,
    .dropout_fwd = cuda_dropout_fwd,
    .dropout_bwd = cuda_dropout_bwd,
    .add = cuda_add,
    .axpby = cuda_axpby,
    .fill = cuda_fill,
    .cast = cuda_cast,

    .softmax_fwd = cuda_softmax_fwd,
    .softmax_bwd = cuda_softmax_bwd,
    .cross_entropy_fwd = cuda_cross_entropy_fwd,
    .cross_entropy_bwd = cuda_cross_entropy_bwd,
    .nll_fwd = cuda_nll_fwd,
    .nll_bwd = cuda_nll_bwd,
    .mse_fwd = cuda_mse_fwd,
    .mse_bwd = cuda_mse_bwd,

    .sumsq = cuda_sumsq,
    .nonfinite = cuda_nonfinite,

    .grad_stats = cuda_grad_stats,
    .fused_optim_step = cuda_fused_optim_step,
    .scaler_update = cuda_scaler_update,
    .count_correct = cuda_count_correct,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_h2d_async = cuda_copy_h2d_async,
    .set_option = cuda_set_option,
    .mem_info = cuda_mem_info,
    .describe = cuda_conv_describe,
    .copy_async = cuda_copy_async,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .cross_entropy_bwd_dev = cuda_cross_entropy_bwd_dev,
    .nll_bwd_dev = cuda_nll_bwd_dev,
    .fused_optim_step_dev = cuda_fused_optim_step_dev,
    .dropout_step_from = cuda_dropout_step_from,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .linreg_fit = cuda_linreg_fit,
    .transform_u8 = cuda_transform_u8,
#ifdef CTRAIN_HAVE_NCCL
    .coll_new_id = cuda_coll_new_id,
    .coll_open = cuda_coll_open,
    .coll_allreduce = cuda_coll_allreduce,
    .coll_bcast = cuda_coll_bcast,
    .coll_reduce_scatter = cuda_coll_reduce_scatter,
    .coll_allgather = cuda_coll_allgather,
    .coll_record = cuda_coll_record,
    .coll_await = cuda_coll_await,
    .coll_fence = cuda_coll_fence,
    .coll_mark = cuda_coll_mark,
    .coll_wait = cuda_coll_wait,
    .coll_close = cuda_coll_close,
#endif
};

/* Here because the device struct is visible to C files only. */
void cuda_set_workspace(ct_device *d, void *p, size_t bytes) {
  cuda_dev *cd = cuda_dev_of(d);
  cd->pass_ws = p;
  cd->pass_ws_bytes = p ? bytes : 0;
}

ct_status cuda_dropout_step_from(ct_device *d, const uint32_t *step) {
  cuda_dev_of(d)->dropout_step = step;
  return CT_OK;
}
const uint32_t *cuda_dropout_step(ct_device *d) { return cuda_dev_of(d)->dropout_step; }

const ct_backend *ct_cuda_backend(void) { return &cuda_table; }

int ct_cuda_list_devices(char *buf, size_t n) { return cuda_list_devices(buf, n); }
