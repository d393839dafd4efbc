/* cuBLASLt is loaded when a CUDA device opens, not at process start
 * (src/backend/cuda/cuda_lt.h): a process linked with ctrain does not map
 * libcublasLt until then, cuda_lt_load() resolves every entry point the
 * backend calls (and they work: a matrix layout is created and destroyed,
 * which needs no GPU), a second call returns the first one's result, and
 * with CTRAIN_CUBLASLT_PATH naming a missing file the load fails with a
 * message naming that file and nothing is mapped. Needs no GPU; skipped
 * (77) when the CUDA backend is not built. */
#include "test_util.h"

#ifndef CTRAIN_HAVE_CUDA
int main(void) {
  printf("CUDA backend not built: nothing to load\n");
  return 77;
}
#else
#include "backend/cuda/cuda_lt.h"

static int lt_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[4096];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "libcublasLt")) found = 1;
  fclose(f);
  return found;
}

static int table_filled(void) {
  int all = 1;
#define FILLED(name) all &= cuda_lt.name != NULL;
  CUDA_LT_FUNCS(FILLED)
#undef FILLED
  return all;
}

int main(void) {
  if (lt_mapped() < 0) {
    printf("no /proc/self/maps: cannot tell what is mapped\n");
    return 77;
  }
  CHECK_MSG(lt_mapped() == 0, "libcublasLt is mapped at start: the process links it");
  /* A CPU device and a forward pass load nothing either. */
  ct_device *cpu;
  CHECK_OK(ct_device_open("cpu", &cpu));
  CHECK(lt_mapped() == 0);
  ct_device_close(cpu);

  const char *forced = getenv("CTRAIN_CUBLASLT_PATH");
  if (forced && forced[0]) {
    ct_status s = cuda_lt_load();
    CHECK(s == CT_ERR_NO_DEVICE);
    char first[1024];
    snprintf(first, sizeof first, "%s", ct_last_error());
    CHECK_MSG(strstr(first, forced) && strstr(first, "CTRAIN_CUBLASLT_PATH") && !strchr(first, '\n'),
              "message: %s", first);
    CHECK(cuda_lt_load() == CT_ERR_NO_DEVICE);
    CHECK_MSG(!strcmp(first, ct_last_error()), "second message: %s", ct_last_error());
    CHECK(cuda_lt.Create == NULL && cuda_lt.Matmul == NULL);
    CHECK(lt_mapped() == 0);
  } else {
    CHECK_OK(cuda_lt_load());
    CHECK(table_filled());
    CHECK(lt_mapped() == 1);
    cublasLtMatrixLayout_t l = NULL;
    CHECK(cuda_lt.MatrixLayoutCreate(&l, CUDA_R_32F, 4, 3, 4) == CUBLAS_STATUS_SUCCESS && l);
    if (l) CHECK(cuda_lt.MatrixLayoutDestroy(l) == CUBLAS_STATUS_SUCCESS);
    cuda_lt_api first = cuda_lt;
    CHECK_OK(cuda_lt_load());
    CHECK(!memcmp(&first, &cuda_lt, sizeof first));
  }
  return test_summary("test_cuda_lt_load");
}
#endif
