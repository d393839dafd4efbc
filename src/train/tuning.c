/* The public tuning switches (ctrain/tuning.h), set where they live. */
#include "ctrain/tuning.h"

#include "backend/cpu/cpu_conv.h"
#include "plan/fuse.h"

void ct_tuning_set_fusion(int on) { ct_fuse_set_enabled(on); }

void ct_tuning_set_cpu_conv_gemm(int on) {
#if CTRAIN_HAVE_DNNL
  cpu_conv_set_gemm(on);
#else
  (void)on;
#endif
}

void ct_tuning_set_cpu_conv_thin(int on) {
#if CTRAIN_HAVE_DNNL
  cpu_conv_set_thin(on);
#else
  (void)on;
#endif
}
