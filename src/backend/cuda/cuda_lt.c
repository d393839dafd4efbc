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

#include <dlfcn.h>

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
  lt_status = CT_ERR_NO_DEVICE;
  void *h = NULL;
  const char *from = NULL;
  char first_err[512] = ""; /* the first candidate's reason says the most */
  for (int i = 0; i < n && !h; i++) {
    h = dlopen(from = tried[i], RTLD_NOW | RTLD_LOCAL);
    if (!h && i == 0) snprintf(first_err, sizeof first_err, "%s", dlerror());
  }
  if (!h) {
    if (n == 1 && tried[0] == forced)
      snprintf(lt_why, sizeof lt_why, "cannot load cuBLASLt from CTRAIN_CUBLASLT_PATH: %s", first_err);
    else
      snprintf(lt_why, sizeof lt_why,
               "cannot load cuBLASLt: %s; install the CUDA toolkit's cuBLAS, add its lib directory to "
               "LD_LIBRARY_PATH, or set CTRAIN_CUBLASLT_PATH to the library's file",
               first_err);
    return;
  }
  cuda_lt_api t;
#define CUDA_LT_SYM(name)                                                                           \
  *(void **)&t.name = dlsym(h, "cublasLt" #name);                                                   \
  if (!t.name) {                                                                                    \
    snprintf(lt_why, sizeof lt_why, "cannot use cuBLASLt from %s: it has no symbol cublasLt" #name, \
             from);                                                                                 \
    dlclose(h);                                                                                     \
    return;                                                                                         \
  }
  CUDA_LT_FUNCS(CUDA_LT_SYM)
#undef CUDA_LT_SYM
  cuda_lt = t;
  lt_status = CT_OK;
}

ct_status cuda_lt_load(void) {
  pthread_once(&lt_once, lt_load_once);
  if (lt_status != CT_OK) return ct_error(lt_status, "%s", lt_why);
  return CT_OK;
}

#endif
