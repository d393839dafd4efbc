/* The CPU backend: oneDNN for convolution, matmul, pooling and batch norm,
 * OpenMP loops for elementwise ops, reductions and global pooling of
 * laid-out tensors, and the reference for anything else (adaptive pooling
 * of plain tensors; dtypes or cases oneDNN cannot express exactly fall
 * back inside each op). Built without oneDNN, convolution, matmul, linear
 * and pooling are the reference's too, and activations stay NCHW because
 * the reference reads nothing else. */
#include <pthread.h>

#include "backend/cpu/cpu_impl.h"

static ct_backend cpu_table = {
    .name = "cpu",
#if CTRAIN_HAVE_DNNL
    .act_layout = CT_LAYOUT_C16,
    .act_layouts = 1u << CT_LAYOUT_C16 | 1u << CT_LAYOUT_NHWC,
    .act_layout_dtypes = 1u << CT_F32 | 1u << CT_BF16,
#else
    .act_layout = CT_LAYOUT_PLAIN,
    .act_layouts = 0,
    .act_layout_dtypes = 0,
#endif
    .open = cpu_dev_open,
    .close = cpu_dev_close,

#if CTRAIN_HAVE_DNNL
    .matmul = cpu_matmul,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd_data = cpu_linear_bwd_data,
    .linear_bwd_weights = cpu_linear_bwd_weights,

    .conv2d_fwd = cpu_conv2d_fwd,
    .conv2d_bwd_data = cpu_conv2d_bwd_data,
    .conv2d_bwd_weights = cpu_conv2d_bwd_weights,

    .maxpool2d_workspace_bytes = cpu_maxpool2d_workspace_bytes,
    .maxpool2d_fwd = cpu_maxpool2d_fwd,
    .maxpool2d_bwd = cpu_maxpool2d_bwd,
    .avgpool2d_fwd = cpu_avgpool2d_fwd,
    .avgpool2d_bwd = cpu_avgpool2d_bwd,
#endif
    .adaptive_avgpool2d_fwd = cpu_adaptive_avgpool2d_fwd,
    .adaptive_avgpool2d_bwd = cpu_adaptive_avgpool2d_bwd,
    .adaptive_maxpool2d_fwd = cpu_adaptive_maxpool2d_fwd,
    .adaptive_maxpool2d_bwd = cpu_adaptive_maxpool2d_bwd,

    .batchnorm_fwd = cpu_batchnorm_fwd,
    .batchnorm_bwd = cpu_batchnorm_bwd,
    .batchnorm_apply = cpu_batchnorm_apply,

    .act_fwd = cpu_act_fwd,
    .act_bwd = cpu_act_bwd,
    .dropout_fwd = cpu_dropout_fwd,
    .dropout_bwd = cpu_dropout_bwd,
    .add = cpu_add,
    .axpby = cpu_axpby,
    .fill = cpu_fill,
    .cast = cpu_cast,

    .softmax_fwd = cpu_softmax_fwd,
    .softmax_bwd = cpu_softmax_bwd,
    .cross_entropy_fwd = cpu_cross_entropy_fwd,
    .cross_entropy_bwd = cpu_cross_entropy_bwd,
    .nll_fwd = cpu_nll_fwd,
    .nll_bwd = cpu_nll_bwd,
    .mse_fwd = cpu_mse_fwd,
    .mse_bwd = cpu_mse_bwd,

    .sumsq = cpu_sumsq,
    .nonfinite = cpu_nonfinite,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_table(void) {
  ct_backend_fill_defaults(&cpu_table);
#if CTRAIN_HAVE_DNNL
  /* oneDNN blocks channels by 16 with AVX-512 and by 8 below it, so the
   * activations follow: C16 there, C8 here. (oneDNN's effective ISA never
   * exceeds what the CPU has; ONEDNN_MAX_CPU_ISA=AVX2 caps it.) */
  if (!cpu_dnnl_avx512()) {
    cpu_table.act_layout = CT_LAYOUT_C8;
    cpu_table.act_layouts = 1u << CT_LAYOUT_C8 | 1u << CT_LAYOUT_NHWC;
    cpu_table.maxpool_to_plain = cpu_maxpool_windows_to_plain();
  }
  /* Without oneDNN's bf16 the bf16 ops widen to plain f32 temporaries;
   * laying bf16 activations out would buy nothing. */
  if (!cpu_dnnl_bf16()) cpu_table.act_layout_dtypes = 1u << CT_F32;
#endif
}

const ct_backend *ct_cpu_backend(void) {
  pthread_once(&once, init_table);
  return &cpu_table;
}

const char *ct_cpu_backend_kernels(void) {
#if CTRAIN_HAVE_DNNL
  return "oneDNN + OpenMP kernels";
#else
  return "OpenMP loops; convolution, matmul and pooling by the portable reference kernels (built without oneDNN: "
         "slow)";
#endif
}
