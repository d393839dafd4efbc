/* What the emulated cuDNN's two halves share (tests only): the legacy
 * descriptor API and its compute live in emu_cudnn.cpp, the graph
 * (backend descriptor) API in emu_cudnn_graph.cpp, and both run a
 * convolution through conv_queue so the two give the same bits for the same
 * operands.
 *
 * conv_queue takes the operands as the graph API describes them: dims in
 * N,C,H,W order (K,C,R,S for the filter) with explicit strides; a filter's
 * strides must be packed KCRS or KRSC (the two the legacy filter
 * descriptors offer). It checks the geometry, then every operand and the
 * workspace in device memory, and queues alpha * result + beta * out on the
 * handle's stream behind a workspace overwritten with 0xFF bytes. */
#ifndef CTRAIN_TESTS_EMU_DNN_H
#define CTRAIN_TESTS_EMU_DNN_H

#include <cudnn.h>

#include <cstdint>

namespace ct_emu {

struct dnn_conv {
  int pass;           /* 0 forward (y from x, w), 1 backward data (x from y, w), 2 backward filter (w from x, y) */
  cudnnDataType_t dt; /* of all three tensors */
  int64_t x[4], xs[4], w[4], wst[4], y[4], ys[4];
  int64_t pad[2], stride[2], dil[2];
  bool cross; /* CROSS_CORRELATION; false: CONVOLUTION (filter flipped) */
  bool tf32;  /* FLOAT inputs rounded to TF32, as a tensor-core engine reads them */
  bool nondet; /* a backward result varied per call (CT_EMU_DNN_NONDET's nudge) */
  int engine;  /* the graph API engine that runs it (CT_EMU_ALGO_BITS's key) */
};

/* The geometry check alone (CUDNN_STATUS_SUCCESS when conv_queue could run
 * it), for a descriptor's finalize. */
cudnnStatus_t conv_check(const dnn_conv &c, const char *who);

/* x, w, y as pass names them (the output is written, the others read). */
cudnnStatus_t conv_queue(cudnnHandle_t h, const dnn_conv &c, void *x, void *w, void *y, double alpha, double beta,
                         void *ws, size_t ws_need, const char *who);

/* Records why a call was refused (cudnnGetLastErrorString) and returns s. */
cudnnStatus_t dnn_refuse(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The emulator's knobs (emu_cudnn.cpp's header lists them). */
bool dnn_no_nhwc();
bool dnn_big_ws();
bool dnn_first_fails();
bool dnn_nondet();

}  // namespace ct_emu

#endif
