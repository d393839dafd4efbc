/* src/math/: host code and CUDA kernels share it; any layer may include it.
 *
 * The fused training-step update shared by the host reference
 * (src/optim/optimizer_fused.c) and the CUDA kernels
 * (src/backend/cuda/cuda_optim.cu): per-element formulas, the argument
 * block and the device-resident step statistics. Compiled as C (gcc) and as
 * CUDA C++ (nvcc), hence CT_HD and plain structs.
 *
 * One fused step = what the CPU trainer does in four calls
 * (ct_grad_scaler_unscale, ct_clip_grad_norm, ct_optimizer_step,
 * ct_grad_scaler_update): a reduction pass writes sum((g*inv_scale)^2) and
 * an inf/NaN flag into ct_step_stats, then one pass over all parameters
 * unscales, clips and applies SGD/Adam/AdamW with the exact f32 operations
 * of src/optim/optimizer_step.c, skipping everything when the scaler found
 * inf/NaN, then a one-thread update moves the scale (GradScaler). The
 * device never waits for the host: the scale, the skip decision and the
 * clip coefficient are read from device memory by the kernels. */
#ifndef CTRAIN_MATH_FUSED_STEP_H
#define CTRAIN_MATH_FUSED_STEP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CT_HD __host__ __device__ __forceinline__
#else
#define CT_HD static inline
#endif

/* GradScaler state as the device keeps it (mirrors ct_grad_scaler). */
typedef struct ct_scaler_dev {
  float scale;
  float growth_factor, backoff_factor;
  int32_t enabled, dynamic;
  /* 1: without the scaler too, a step with inf/NaN gradients is not
   * applied (ct_step_config.apply_nonfinite 0); fills the padding. */
  int32_t guard;
  int64_t growth_interval, growth_tracker, skipped_steps;
} ct_scaler_dev;


/* Scalars of one fused optimizer step, rounded on the host exactly where
 * src/optim/optimizer_step.c rounds them. */
typedef struct ct_fused_optim_args {
  int32_t kind;          /* ct_optim_kind: 0 SGD, 1 Adam, 2 AdamW */
  int64_t n;
  double max_norm;       /* clip_grad_norm_ threshold; <= 0: no clipping */
  /* SGD */
  float wd, mom, damp1, neg_lr;
  int32_t momentum_on, first, nesterov;
  /* Adam / AdamW */
  float neg_step_size, bc2_sqrt, b1, omb1, b2, omb2, eps, l2, decay;
  int32_t apply_decay, amsgrad;
} ct_fused_optim_args;

/* Widest linear regression the fused CUDA kernel takes (per-thread
 * accumulators live in registers). */
#define CT_LINREG_MAX_FEATURES 16

/* How many steps may be queued whose skip decision the host has not read
 * yet (the lagged read-back keeps one; 2 leaves room). */
#define CT_STEP_LAG_MAX 2

/* The per-step optimizer scalars in device memory, written by the host
 * before each step (a plain copy on the stream) so a replayed CUDA graph
 * reads the current learning rate and step count instead of the values
 * frozen at capture. row[j] holds the arguments for the case that j of the
 * steps still in flight when the host wrote it were taken (not skipped):
 * the device picks row[opt_steps - base_steps]. Every row is rounded on
 * the host exactly as ct_optimizer_step rounds, so the lag changes no
 * bit of the update. */
typedef struct ct_step_args {
  int64_t base_steps;  /* the host's optimizer step count when it wrote this */
  ct_fused_optim_args row[CT_STEP_LAG_MAX + 1];
} ct_step_args;

/* Everything one step leaves on the device for the host; read back in one
 * copy per step. */
typedef struct ct_step_stats {
  double sumsq;          /* sum over i of (float)(g[i] * inv_scale)^2, in double */
  int32_t nonfinite;     /* 1 when a scaled gradient is inf/NaN */
  float loss;            /* the loss forward's one-element output */
  int64_t top1, top5;    /* correct predictions of the step's batch */
  ct_scaler_dev scaler;  /* persistent across steps */
  /* Optimizer steps taken on the device (not skipped), counted by the
   * scaler-update kernel: with a lagged read-back the host does not yet
   * know whether the last queued steps were skipped, so the device picks
   * the matching row of the argument table (ct_step_args). */
  int64_t opt_steps;
  /* Written by the host, never read back (the read-back copies the bytes
   * before it: CT_STEP_STATS_READBACK). */
  ct_step_args args;
  /* The dropout mask key's step of the step queued next, written by the
   * host before it (a copy in stream order, like args); the dropout
   * kernels read it through dropout_step_from's pointer, so a replayed
   * CUDA graph draws the current step's masks. Never read back. */
  uint32_t dropout_step;
} ct_step_stats;

#define CT_STEP_STATS_READBACK offsetof(ct_step_stats, args)


/* The row of t that matches the device's own step count (clamped, so a
 * corrupted count cannot index outside the table). */
CT_HD const ct_fused_optim_args *ct_step_args_pick(const ct_step_args *t, int64_t opt_steps) {
  int64_t j = opt_steps - t->base_steps;
  if (j < 0) j = 0;
  if (j > CT_STEP_LAG_MAX) j = CT_STEP_LAG_MAX;
  return &t->row[j];
}

/* inv_scale as GradScaler computes it: reciprocal in double, rounded to f32. */
CT_HD float ct_fused_inv_scale(const ct_scaler_dev *s) { return s->enabled ? (float)(1.0 / (double)s->scale) : 1.0f; }

/* Whether the update is skipped: the scaler is on and found inf/NaN. */
CT_HD int ct_fused_skip(const ct_step_stats *st) { return (st->scaler.enabled || st->scaler.guard) && st->nonfinite; }

/* The clip coefficient (as f32) and whether to apply it: torch's
 * clip_grad_norm_ rule, and ct_clip_grad_norm's "non-finite norm leaves
 * the gradients alone". */
CT_HD int ct_fused_clip(const ct_fused_optim_args *a, const ct_step_stats *st, float *cf) {
  if (!(a->max_norm > 0)) return 0;
  double norm = sqrt(st->sumsq);
  if (!isfinite(norm)) return 0;
  double coef = a->max_norm / (norm + 1e-6);
  *cf = (float)coef;
  return coef < 1.0;
}

/* Gradient element after unscaling and clipping (two f32 roundings, as the
 * CPU's axpby then clip). */
CT_HD float ct_fused_grad(float g, float inv, int clip, float cf) {
  if (inv != 1.0f) g = g * inv;
  if (clip) g = g * cf;
  return g;
}

/* One SGD element; buf may be unused (momentum off). */
CT_HD void ct_fused_sgd_elem(const ct_fused_optim_args *a, float *p, float g, float *buf) {
  float d = a->wd != 0 ? fmaf(*p, a->wd, g) : g;
  if (!a->momentum_on) {
    *p = fmaf(d, a->neg_lr, *p);
    return;
  }
  float decayed = *buf * a->mom;
  float b = a->first ? d : fmaf(d, a->damp1, decayed);
  *buf = b;
  float u = a->nesterov ? fmaf(b, a->mom, d) : b;
  *p = fmaf(u, a->neg_lr, *p);
}

/* One Adam/AdamW element; vmax only with amsgrad. */
CT_HD void ct_fused_adam_elem(const ct_fused_optim_args *a, float *p, float g, float *m, float *v, float *vmax) {
  float pi = *p;
  if (a->l2 != 0) g = fmaf(pi, a->l2, g);
  if (a->apply_decay) pi = pi * a->decay;
  float m_decayed = *m * a->b1, v_decayed = *v * a->b2;
  float mi = fmaf(g, a->omb1, m_decayed);
  float vi = fmaf(a->omb2 * g, g, v_decayed);
  *m = mi;
  *v = vi;
  float vd = vi;
  if (a->amsgrad) {
    vd = *vmax > vi ? *vmax : vi;
    *vmax = vd;
  }
  float denom = sqrtf(vd) / a->bc2_sqrt + a->eps;
  /* Written as the fused multiply-add gcc forms from p + step*(m/denom)
   * with FMA hardware (and that matched torch.optim bit for bit), so no
   * compiler or flag can round it differently on the CPU or the GPU. */
  *p = fmaf(a->neg_step_size, mi / denom, pi);
}

/* GradScaler.update() (amp_update_scale_cuda_kernel), the rule of
 * ct_grad_scaler_update, on the device-resident state. */
CT_HD void ct_fused_scaler_update(ct_scaler_dev *s, int found_inf) {
  if (!s->enabled) return;
  if (found_inf) s->skipped_steps++;
  if (!s->dynamic) return;
  if (found_inf) {
    s->scale = s->scale * s->backoff_factor;
    s->growth_tracker = 0;
    return;
  }
  int64_t successful = s->growth_tracker + 1;
  if (successful == s->growth_interval) {
    float grown = s->scale * s->growth_factor;
    if (isfinite(grown)) s->scale = grown;
    s->growth_tracker = 0;
  } else {
    s->growth_tracker = successful;
  }
}

#endif
