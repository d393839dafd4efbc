/* dlopen and dlsym for the run-time-loaded CUDA libraries (cuda_dl.h). */
#include "backend/cuda/cuda_dl.h"

#include <dlfcn.h>
#include <stdio.h>

ct_status cuda_dl_load(const cuda_dl_spec *s, void **syms, char *why, size_t cap) {
  void *h = NULL;
  const char *from = NULL;
  char first_err[512] = "";
  for (int i = 0; i < s->npaths && !h; i++) {
    h = dlopen(from = s->paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!h && i == 0) snprintf(first_err, sizeof first_err, "%s", dlerror());
  }
  if (!h) {
    if (s->forced)
      snprintf(why, cap, "cannot load %s from %s: %s", s->lib, s->env, first_err);
    else
      snprintf(why, cap, "cannot load %s: %s; %s, or set %s to the library's file", s->lib, first_err, s->hint, s->env);
    return CT_ERR_NO_DEVICE;
  }
  for (int i = 0; i < s->count; i++) {
    char sym[128];
    snprintf(sym, sizeof sym, "%s%s", s->prefix, s->names[i]);
    syms[i] = dlsym(h, sym);
    if (!syms[i]) {
      snprintf(why, cap, "cannot use %s from %s: it has no symbol %s", s->lib, from, sym);
      dlclose(h);
      return CT_ERR_NO_DEVICE;
    }
  }
  return CT_OK;
}
