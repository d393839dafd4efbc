/* Switches that change how the library computes, not what it computes:
 * for benchmarks and A/B experiments (bench_train's --no-fuse,
 * --no-conv-gemm, --conv-thin). Results agree to rounding either way.
 * Process-wide; set them before ct_model_prepare. */
#ifndef CTRAIN_TUNING_H
#define CTRAIN_TUNING_H

#ifdef __cplusplus
extern "C" {
#endif

/* Folding a ReLU into the layer before it, and the gradient sharing of
 * residual adds (docs/ARCHITECTURE.md, "Fusion at prepare time"); on by
 * default. */
void ct_tuning_set_fusion(int on);
/* The cpu's convolutions as batched GEMMs where they fit (on by default)
 * and the thin-channel kernels (docs/ARCHITECTURE.md); no-ops without
 * oneDNN. */
void ct_tuning_set_cpu_conv_gemm(int on);
void ct_tuning_set_cpu_conv_thin(int on);

#ifdef __cplusplus
}
#endif
#endif
