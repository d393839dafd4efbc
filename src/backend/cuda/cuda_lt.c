/* cuBLASLt's entry points, resolved once (cuda_lt.h says why it is loaded
 * rather than linked). */
#include "backend/cuda/cuda_lt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cuda_lt_api cuda_lt;

#ifdef CTRAIN_CUDA_LT_LINKED

ct_status cuda_lt_load(void) {
#define CUDA_LT_LINK(name) cuda_lt.name = cublasLt##name;
  CUDA_LT_FUNCS(CUDA_LT_LINK)
#undef CUDA_LT_LINK
  return CT_OK;
}

#else

#include "backend/cuda/cuda_dl.h"

#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)
#define LT_SONAME "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR)

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static ct_status lt_status;
static char lt_why[1024]; /* the failure's message, repeated to later callers */

static void lt_load_once(void) {
  const char *forced = getenv("CTRAIN_CUBLASLT_PATH");
  const char *tried[2];
  int n = 0;
  if (forced && forced[0]) {
    tried[n++] = forced;
  } else {
    tried[n++] = LT_SONAME;
#ifdef CTRAIN_CUBLASLT_DIR
    tried[n++] = CTRAIN_CUBLASLT_DIR "/" LT_SONAME;
#endif
  }
#define CUDA_LT_NAME(name) #name,
  static const char *const names[] = {CUDA_LT_FUNCS(CUDA_LT_NAME)};
#undef CUDA_LT_NAME
  cuda_dl_spec spec = {"cuBLASLt", "CTRAIN_CUBLASLT_PATH",
                       "install the CUDA toolkit's cuBLAS, add its lib directory to LD_LIBRARY_PATH", "cublasLt",
                       tried, n, forced && forced[0], names, (int)(sizeof names / sizeof names[0])};
  cuda_lt_api t;
  lt_status = cuda_dl_load(&spec, (void **)&t, lt_why, sizeof lt_why);
  if (lt_status == CT_OK) cuda_lt = t;
}

ct_status cuda_lt_load(void) {
  pthread_once(&lt_once, lt_load_once);
  if (lt_status != CT_OK) return ct_error(lt_status, "%s", lt_why);
  return CT_OK;
}

#endif
