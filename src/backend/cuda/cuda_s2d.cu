/* Space-to-depth staging for a strided convolution with few input
 * channels (cuda_conv.c says when it runs): the convolution of x with w at
 * stride s equals a stride-1 convolution without padding of
 *   S[n][i][j][(di*s + dj)*C + c] = x[n][c][i*s + di - pad_h][j*s + dj - pad_w]
 * with
 *   W'[o][a][b][(di*s + dj)*C + c] = w[o][c][a*s + di][b*s + dj],
 * both zero outside x and w and in the channels past C*s*s (S and W' have
 * Cp, a multiple of 8, so cuDNN's channels-last tensor-core kernels take
 * them). Every product of the direct convolution appears once and the rest
 * are products with zero, so the result is the same sum in another order.
 * The weight gradient folds back the same way: dw[o][c][ky][kx] =
 * dW'[o][ky/s][kx/s][((ky%s)*s + kx%s)*C + c]. S and W' are channels-last
 * (KRSC for W'); x is plain or NHWC, w and dw plain (PyTorch's KCRS). */
#include "backend/cuda/cuda_common.cuh"

/* One thread per 8 channels of one S position (Cp is a multiple of 8, S
 * 16-byte aligned), so S is written in 16-byte stores. The channel's
 * (di, dj, c) is stepped along rather than divided out for each of the
 * 8; I is the index type (32-bit where it fits: division is several
 * times cheaper). */
template <class I>
__device__ __forceinline__ void s2d_x_group(const cuda_s2d &g, const void *x, int xt, int x_nhwc, void *S, int st,
                                            I grp) {
  const I C = (I)g.C, s = (I)g.s, Cp = (I)g.Cp, Hs = (I)g.Hs, Ws = (I)g.Ws, H = (I)g.H, W = (I)g.W;
  const I e = grp * CT_VEC, ch0 = e % Cp, pos = e / Cp;
  const I j = pos % Ws, i = (pos / Ws) % Hs, n = pos / (Ws * Hs);
  /* channel (di*s + dj)*C + c; di reaching s: the zero channels past C*s*s */
  I blk = ch0 / C, c = ch0 - blk * C, di = blk / s, dj = blk - di * s;
  float f[CT_VEC];
#pragma unroll
  for (int k = 0; k < CT_VEC; k++) {
    float v = 0.f;
    const I h = i * s + di - (I)g.pad_h, w = j * s + dj - (I)g.pad_w;
    if (di < s && h >= 0 && h < H && w >= 0 && w < W)
      v = ct_ld(x, xt, x_nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w);
    f[k] = v;
    if (++c == C) {
      c = 0;
      if (++dj == s) dj = 0, ++di;
    }
  }
  ct_stw<CT_VEC>(S, st, e, f);
}

__global__ void k_s2d_x(cuda_s2d g, const void *x, int xt, int x_nhwc, void *S, int st) {
  const int64_t groups = g.N * g.Hs * g.Ws * g.Cp / CT_VEC, grid = (int64_t)gridDim.x * blockDim.x;
  if (groups * CT_VEC + grid <= INT32_MAX && g.N * g.C * g.H * g.W <= INT32_MAX) {
    CT_GRID_STRIDE_T(int32_t, i, (int32_t)groups) s2d_x_group<int32_t>(g, x, xt, x_nhwc, S, st, i);
    return;
  }
  CT_GRID_STRIDE(i, groups) s2d_x_group<int64_t>(g, x, xt, x_nhwc, S, st, i);
}

/* W' [O, KHs, KWs, Cp] from w [O, C, KH, KW]: one thread per W' element
 * (the filter is small). */
__global__ void k_s2d_w(cuda_s2d g, const void *w, int wt, void *Wz, int zt) {
  const int64_t n = g.O * g.KHs * g.KWs * g.Cp;
  CT_GRID_STRIDE(e, n) {
    const int64_t ch = e % g.Cp, b = (e / g.Cp) % g.KWs, a = (e / (g.Cp * g.KWs)) % g.KHs;
    const int64_t o = e / (g.Cp * g.KWs * g.KHs);
    float v = 0.f;
    if (ch < g.C * g.s * g.s) {
      const int64_t blk = ch / g.C, c = ch % g.C, ky = a * g.s + blk / g.s, kx = b * g.s + blk % g.s;
      if (ky < g.KH && kx < g.KW) v = ct_ld(w, wt, ((o * g.C + c) * g.KH + ky) * g.KW + kx);
    }
    ct_st(Wz, zt, e, v);
  }
}

/* dw = beta * dw + dW' folded back: one thread per dw element. */
__global__ void k_s2d_dw(cuda_s2d g, const void *dWz, int zt, void *dw, int dt, float beta) {
  const int64_t n = g.O * g.C * g.KH * g.KW;
  CT_GRID_STRIDE(e, n) {
    const int64_t kx = e % g.KW, ky = (e / g.KW) % g.KH, c = (e / (g.KW * g.KH)) % g.C, o = e / (g.KW * g.KH * g.C);
    const int64_t ch = ((ky % g.s) * g.s + kx % g.s) * g.C + c;
    float v = ct_ld(dWz, zt, ((o * g.KHs + ky / g.s) * g.KWs + kx / g.s) * g.Cp + ch);
    if (beta != 0.f) v += beta * ct_ld(dw, dt, e);
    ct_st(dw, dt, e, v);
  }
}

static ct_status check_dtypes(const char *op, ct_dtype a, ct_dtype b) {
  if (cuda_float_dtype(a) && cuda_float_dtype(b)) return CT_OK;
  return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: dtypes %s -> %s; expected f32, bf16 or f16", op,
                  ct_dtype_name(a) ? ct_dtype_name(a) : "?", ct_dtype_name(b) ? ct_dtype_name(b) : "?");
}

extern "C" ct_status cuda_s2d_input(ct_device *d, const cuda_s2d *g, const void *x, ct_dtype xt, int x_nhwc, void *S,
                                    ct_dtype st) {
  CT_TRY(check_dtypes("s2d_input", xt, st));
  if (g->Cp % CT_VEC || !ct_vec_ok(S))
    return ct_error(CT_ERR_INVALID_ARG, "cuda s2d_input: %lld channels or an S at %p: expected a multiple of 8 and "
                    "16-byte alignment", (long long)g->Cp, S);
  const int64_t groups = g->N * g->Hs * g->Ws * g->Cp / CT_VEC;
  if (!groups) return CT_OK;
  CT_TRY(cuda_enter(d));
  k_s2d_x<<<ct_blocks(groups), CT_THREADS, 0, cuda_stream(d)>>>(*g, x, (int)xt, x_nhwc, S, (int)st);
  CUDA_LAUNCHED("s2d_input");
  return CT_OK;
}

extern "C" ct_status cuda_s2d_weight(ct_device *d, const cuda_s2d *g, const void *w, ct_dtype wt, void *Wz,
                                     ct_dtype zt) {
  CT_TRY(check_dtypes("s2d_weight", wt, zt));
  const int64_t n = g->O * g->KHs * g->KWs * g->Cp;
  if (!n) return CT_OK;
  CT_TRY(cuda_enter(d));
  k_s2d_w<<<ct_blocks(n), CT_THREADS, 0, cuda_stream(d)>>>(*g, w, (int)wt, Wz, (int)zt);
  CUDA_LAUNCHED("s2d_weight");
  return CT_OK;
}

extern "C" ct_status cuda_s2d_weight_grad(ct_device *d, const cuda_s2d *g, const void *dWz, ct_dtype zt, void *dw,
                                          ct_dtype dt, float beta) {
  CT_TRY(check_dtypes("s2d_weight_grad", zt, dt));
  const int64_t n = g->O * g->C * g->KH * g->KW;
  if (!n) return CT_OK;
  CT_TRY(cuda_enter(d));
  k_s2d_dw<<<ct_blocks(n), CT_THREADS, 0, cuda_stream(d)>>>(*g, dWz, (int)zt, dw, (int)dt, beta);
  CUDA_LAUNCHED("s2d_weight_grad");
  return CT_OK;
}
