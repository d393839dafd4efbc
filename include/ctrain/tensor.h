/* Tensor descriptor.
 *
 * A ct_tensor describes a dense, contiguous, row-major (NCHW for images)
 * block of up to CT_MAX_DIMS dimensions living on one device. The descriptor
 * does not own its memory unless created by ct_tensor_alloc(); views into
 * the flat parameter buffers or the step arena are plain descriptors.
 */
#ifndef CTRAIN_TENSOR_H
#define CTRAIN_TENSOR_H

#include <stdint.h>
#include "ctrain/dtype.h"
#include "ctrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CT_MAX_DIMS 5

typedef struct ct_device ct_device;

/* Memory order of a 4-D tensor. Everything a caller passes or receives is
 * CT_LAYOUT_PLAIN (NCHW). CT_LAYOUT_C16 is [N][C/16][H][W][16] (oneDNN's
 * nChw16c; C a multiple of 16): the executor keeps activations between
 * consecutive convolutions and max pools of the cpu device in it, so the
 * oneDNN kernels, which compute in that order, need no reorders.
 * CT_LAYOUT_C8 is [N][C/8][H][W][8] (nChw8c; C a multiple of 8), the same
 * for a cpu without AVX-512, where oneDNN blocks channels by 8.
 * CT_LAYOUT_NHWC is [N][H][W][C] (channels last, any C; PyTorch's
 * torch.channels_last): the cuda device keeps such activations in it,
 * the order cuDNN's tensor-core convolutions compute in. The shape stays
 * [N, C, H, W] either way; only the element order differs. */
typedef enum ct_layout { CT_LAYOUT_PLAIN = 0, CT_LAYOUT_C16 = 1, CT_LAYOUT_NHWC = 2, CT_LAYOUT_C8 = 3 } ct_layout;

typedef struct ct_tensor {
  void *data;
  ct_dtype dtype;
  int ndim;
  int64_t shape[CT_MAX_DIMS];
  ct_device *device; /* NULL means host memory */
  ct_layout layout;  /* CT_LAYOUT_PLAIN unless the executor chose C16/NHWC */
} ct_tensor;

/* A descriptor over existing memory; shape has ndim entries. */
ct_tensor ct_tensor_view(void *data, ct_dtype dtype, int ndim, const int64_t *shape);
/* Convenience constructors for 1-4 dims over host memory. */
ct_tensor ct_tensor_1d(void *data, ct_dtype dtype, int64_t a);
ct_tensor ct_tensor_2d(void *data, ct_dtype dtype, int64_t a, int64_t b);
ct_tensor ct_tensor_4d(void *data, ct_dtype dtype, int64_t a, int64_t b, int64_t c, int64_t d);

int64_t ct_tensor_numel(const ct_tensor *t);
size_t ct_tensor_nbytes(const ct_tensor *t);
/* 1 if both have the same ndim and extents. */
int ct_tensor_same_shape(const ct_tensor *a, const ct_tensor *b);
/* Writes "[2, 3, 4]" into buf. */
const char *ct_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* Allocates host memory (64-byte aligned) for a tensor of this shape. */
ct_status ct_tensor_alloc(ct_tensor *t, ct_dtype dtype, int ndim, const int64_t *shape);
void ct_tensor_free(ct_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
