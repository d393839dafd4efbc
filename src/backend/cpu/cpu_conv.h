/* The cpu device's convolution path (internal): its tuning switches, for
 * benchmarks and tests that compare variants, and what dnnl_conv.c (the
 * oneDNN primitives) shares with dnnl_conv_gemm.c (small output maps as
 * one batched GEMM) and dnnl_conv_thin.c (first layers' weight
 * gradients). */
#ifndef CTRAIN_CPU_CONV_H
#define CTRAIN_CPU_CONV_H

#include "backend/cpu/cpu_impl.h"

/* 1 (default): primitives are created with format `any` so oneDNN uses its
 * blocked layouts and direct kernels, with cached reorders from/to the
 * caller's NCHW. 0: plain NCHW/OIHW throughout (gemm-based kernels).
 * Affects primitives created afterwards; both kinds stay cached apart. */
void cpu_conv_set_blocked(int on);
int cpu_conv_blocked(void);

/* 1 (default): convolutions that cpu_conv_gemm_ok accepts run as batched
 * GEMMs; 0: every convolution goes to oneDNN's primitives. */
void cpu_conv_set_gemm(int on);
/* 1: what cpu_conv_thin_ok and cpu_conv_thin_fwd_ok accept runs in
 * dnnl_conv_thin.c; 0: in oneDNN; -1 (default): 1 where oneDNN has no
 * AVX-512 kernels (cpu_dnnl_avx512), 0 where it has. */
void cpu_conv_set_thin(int on);

#if CTRAIN_HAVE_DNNL
/* The taps [*t0, *t1] of one kernel dimension (extent k, stride s, left
 * padding p, dilation d; input extent n, output extent o) that read the
 * input at some output position; *t0 > *t1 when none does. */
void cpu_conv_used_taps(int64_t n, int64_t o, int64_t k, int64_t s, int64_t p, int64_t d, int64_t *t0, int64_t *t1);

/* Whether the batched-GEMM path takes this convolution (x, w, y: input,
 * weights, output, or their gradients; bwd_data 1 for the backward data):
 * f32, groups 1, a fused activation of none or ReLU, at most a few output
 * positions per image, more than one kernel tap reading data, a column
 * matrix of bounded size, and for the backward data a stride or cropped
 * taps (dnnl_conv_gemm.c says what was measured). */
int cpu_conv_gemm_ok(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y,
                     ct_act act, int bwd_data);
/* The three directions, with conv2d_fwd's, conv2d_bwd_data's and
 * conv2d_bwd_weights' contracts (backend.h); callers hold the device
 * (cpu_op_begin); `what` names the op in errors. */
ct_status cpu_conv_gemm_fwd(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                            const ct_tensor *b, ct_act act, ct_tensor *y, const char *what);
ct_status cpu_conv_gemm_bwd_data(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                                 ct_tensor *dx, const char *what);
ct_status cpu_conv_gemm_bwd_weights(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy,
                                    ct_tensor *dw, ct_tensor *db, float beta, const char *what);

/* Whether dnnl_conv_thin.c takes this backward weights: f32, groups 1,
 * dilation 1 and a plain input of one channel (a network's first layer).
 * The op has conv2d_bwd_weights' contract; callers hold the device. */
int cpu_conv_thin_ok(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *dw,
                     const ct_tensor *db);
ct_status cpu_conv_thin_wgrad(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy,
                              ct_tensor *dw, ct_tensor *db, float beta, const char *what);
/* Whether dnnl_conv_thin.c takes this forward: the same, with up to 4
 * input channels, a kernel larger than 7x7 (AlexNet's 11x11 first layer)
 * and a fused activation of none or ReLU. conv2d_fwd's contract. */
int cpu_conv_thin_fwd_ok(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y,
                         ct_act act);
ct_status cpu_conv_thin_fwd(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                            const ct_tensor *b, ct_act act, ct_tensor *y, const char *what);
#endif

#endif
