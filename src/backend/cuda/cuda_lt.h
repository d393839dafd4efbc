/* cuBLASLt, loaded when the first CUDA device opens.
 *
 * Linking libcublasLt costs every process that links it resident memory
 * and start-up time (its relocations and static constructors run at load;
 * docs/GPU.md, "Building"), whether or not it ever opens a GPU. ctrain's
 * CPU users should not pay that, so the backend does
 * not link it: cuda_lt_load() dlopens libcublasLt.so.<major> (the major
 * version of the headers built against) and resolves the entry points the
 * backend calls into the table cuda_lt, which the backend calls through
 * (cuda_lt.Matmul(...) for cublasLtMatmul(...)). The search: the path in
 * CTRAIN_CUBLASLT_PATH if set (and nothing else), else the soname through
 * the usual dynamic-loader search, else the directory the build found the
 * library in. cuda_open calls it before its first cuBLASLt call. It is
 * thread-safe and runs once; the library then stays loaded, and every later
 * call returns the first call's result (its error message again on
 * failure). Built with CTRAIN_CUDA_LT_LINKED (the CUDA emulator, which
 * links its own cuBLASLt), the table points at the linked functions and
 * nothing is loaded. */
#ifndef CTRAIN_CUDA_LT_H
#define CTRAIN_CUDA_LT_H

#include <cublasLt.h>

#include "ctrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The cuBLASLt functions the backend calls, without their cublasLt prefix. */
#define CUDA_LT_FUNCS(X)                                                                                      \
  X(Create) X(Destroy) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate) X(MatmulDescDestroy)           \
  X(MatmulDescSetAttribute) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute) \
  X(MatrixLayoutCreate) X(MatrixLayoutDestroy)

typedef struct cuda_lt_api {
#define CUDA_LT_FIELD(name) __typeof__(&cublasLt##name) name;
  CUDA_LT_FUNCS(CUDA_LT_FIELD)
#undef CUDA_LT_FIELD
} cuda_lt_api;

/* Filled by cuda_lt_load(); all null before it succeeds. */
extern cuda_lt_api cuda_lt;

/* CT_OK once the table is filled; CT_ERR_NO_DEVICE naming what was tried and
 * the loader's reason when the library or one of its symbols is missing. */
ct_status cuda_lt_load(void);

#ifdef __cplusplus
}
#endif
#endif
