/* The descriptors behind ctrain's cuDNN graph API plans (src/backend/cuda/
 * cuda_conv_graph.c) against the real cuDNN library, with no GPU:
 * cuda_conv_graph_check builds the tensors, convolution, operation and
 * operation graph of a pass and finalizes each, which is where cuDNN
 * checks attribute types and counts, the output shape against the
 * convolution and the strides. Every pass (forward, backward data,
 * backward filter) in f32, bf16 and f16, NCHW and NHWC, beta 0 and 1, on
 * AlexNet's first convolution (11x11 stride 4 over 3 channels), a 3x3
 * padded one, a strided 1x1 and a dilated one must finalize. Controls: an
 * output one row too tall and a filter with the wrong channel count must
 * be refused, so the check can fail. The emulator accepts what ctrain
 * sends by construction; this is the library's own verdict. Plans,
 * workspace sizes and execution need a device (test_gpu_*_graph). Skipped
 * (77) when the CUDA backend is not built. */
#include "test_util.h"

#ifndef CTRAIN_HAVE_CUDA
int main(void) {
  printf("CUDA backend not built: no cuDNN to check against\n");
  return 77;
}
#else
#include "backend/cuda/cuda_conv_graph.h"

typedef struct shape {
  const char *name;
  int64_t n, c, h, w, k, r, s;
  ct_conv2d_params p;
} shape;

static int64_t out_dim(int64_t in, int64_t k, int pad, int stride, int dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* The status of c's check for shape sh; bad_y / bad_c: the controls. */
static cudnnStatus_t check(const shape *sh, int kind, ct_dtype rt, int nhwc, float beta, int bad_y, int bad_c,
                           const char **what) {
  int64_t xs[4] = {sh->n, sh->c, sh->h, sh->w}, wsh[4] = {sh->k, sh->c + (bad_c ? 1 : 0), sh->r, sh->s};
  int64_t ys[4] = {sh->n, sh->k, out_dim(sh->h, sh->r, sh->p.pad_h, sh->p.stride_h, sh->p.dil_h) + (bad_y ? 1 : 0),
                   out_dim(sh->w, sh->s, sh->p.pad_w, sh->p.stride_w, sh->p.dil_w)};
  cuda_conv_desc c = {kind, &sh->p, xs, wsh, ys, rt, nhwc, beta, 0};
  return cuda_conv_graph_check(&c, what);
}

int main(void) {
  const shape shapes[] = {
      {"alexnet conv1 11x11/4", 2, 3, 227, 227, 64, 11, 11, {4, 4, 2, 2, 1, 1, 1}},
      {"3x3 pad 1", 4, 64, 14, 14, 128, 3, 3, {1, 1, 1, 1, 1, 1, 1}},
      {"1x1 stride 2", 2, 256, 28, 28, 512, 1, 1, {2, 2, 0, 0, 1, 1, 1}},
      {"3x3 dilation 2", 2, 32, 17, 19, 16, 3, 3, {1, 1, 2, 2, 2, 2, 1}},
  };
  const ct_dtype dts[] = {CT_F32, CT_BF16, CT_F16};
  const char *pass[] = {"forward", "backward data", "backward filter"};
  int ok = 0, total = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int kind = 0; kind < 3; kind++)
      for (int d = 0; d < 3; d++)
        for (int nhwc = 0; nhwc < 2; nhwc++)
          for (int b = 0; b < 2; b++) {
            const char *what = NULL;
            cudnnStatus_t e = check(&shapes[i], kind, dts[d], nhwc, (float)b, 0, 0, &what);
            total++;
            ok += e == CUDNN_STATUS_SUCCESS;
            CHECK_MSG(e == CUDNN_STATUS_SUCCESS, "%s, %s, %s, %s, beta %d: %s at %s", shapes[i].name, pass[kind],
                      ct_dtype_name(dts[d]), nhwc ? "NHWC" : "NCHW", b, cudnnGetErrorString(e), what ? what : "?");
          }
  printf("%d of %d descriptor sets finalized by cuDNN %zu\n", ok, total, cudnnGetVersion());
  for (int kind = 0; kind < 3; kind++) {
    const char *what = NULL;
    cudnnStatus_t e = check(&shapes[1], kind, CT_BF16, 1, 0.f, 1, 0, &what);
    CHECK_MSG(e != CUDNN_STATUS_SUCCESS, "%s: an output one row too tall was accepted", pass[kind]);
    printf("%s, output one row too tall: %s at %s\n", pass[kind], cudnnGetErrorString(e), what ? what : "?");
    e = check(&shapes[1], kind, CT_F16, 0, 0.f, 0, 1, &what);
    CHECK_MSG(e != CUDNN_STATUS_SUCCESS, "%s: a filter with one channel too many was accepted", pass[kind]);
    printf("%s, filter channels off by one: %s at %s\n", pass[kind], cudnnGetErrorString(e), what ? what : "?");
  }
  return test_summary("cudnn_graph_desc");
}
#endif
