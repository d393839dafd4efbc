/* Loading a CUDA library at run time instead of linking it (cuda_lt.h
 * says why for cuBLASLt; NCCL is loaded the same way, and only by a
 * process that trains over several GPUs).
 *
 * cuda_dl_load tries the candidate files in order (a bare soname goes
 * through the dynamic loader's search), keeps the first that dlopens, and
 * resolves prefix + name for every name into syms. On failure it returns
 * CT_ERR_NO_DEVICE with a one-line reason in why: the first candidate's
 * loader message (it says the most), or the symbol missing from the file
 * that loaded. `lib` names the library in that reason, `env` the variable
 * that forces a path (when forced is 1, the only candidate is its value);
 * `hint` ends the reason when nothing loaded. */
#ifndef CTRAIN_CUDA_DL_H
#define CTRAIN_CUDA_DL_H

#include <stddef.h>

#include "ctrain/status.h"

typedef struct cuda_dl_spec {
  const char *lib, *env, *hint, *prefix;
  const char *const *paths; /* candidates */
  int npaths, forced;
  const char *const *names; /* [count] */
  int count;
} cuda_dl_spec;

ct_status cuda_dl_load(const cuda_dl_spec *s, void **syms, char *why, size_t cap);

#endif
