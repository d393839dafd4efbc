/* --gpu-transforms and --data-on-gpu, shared by train, eval and predict. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int cli_take_gpu_data_flags(int argc, char **argv, int *mode) {
  *mode = CT_LOADER_FLOAT;
  int given_raw = 0, given_idx = 0, n = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--gpu-transforms")) given_raw = 1;
    else if (!strcmp(argv[i], "--data-on-gpu")) given_idx = 1;
    else argv[n++] = argv[i];
  }
  if (n < argc) argv[n] = NULL;
  /* --data-on-gpu includes what --gpu-transforms does: both = the former. */
  *mode = given_idx ? CT_LOADER_INDICES : given_raw ? CT_LOADER_RAW_U8 : CT_LOADER_FLOAT;
  return n;
}

int cli_use_gpu_data(const char *cmd, int mode, cli_opts *o) {
  if (mode != CT_LOADER_FLOAT && strncmp(o->device, "cuda", 4) != 0) {
    /* Refused before anything is loaded: the transform runs in a CUDA kernel. */
    fprintf(stderr, "ctrain %s: %s needs --device cuda (the transforms run in a CUDA kernel); device is '%s'\n", cmd,
            mode == CT_LOADER_INDICES ? "--data-on-gpu" : "--gpu-transforms", o->device);
    return CLI_EXIT_USAGE;
  }
  /* --data-on-gpu: the loader only orders indices; --gpu-transforms: it
   * hands over the stored uint8 images untransformed. */
  o->loader_mode = mode;
  return 0;
}

void cli_gpu_data_model(const cli_opts *o, ct_model *m) {
  if (o->loader_mode == CT_LOADER_FLOAT) return;
  ct_model_share_stage_x(m, 1);
  ct_model_narrow_input(m, 1);
}
