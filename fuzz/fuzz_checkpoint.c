/* libFuzzer target for checkpoint loading (see fuzz/README.md): the input
 * is written as a checkpoint file and loaded with ct_checkpoint_load into
 * a small fixed model (convolution, batch norm with its running buffers,
 * linear) and its Adam optimizer, as `ctrain train --resume` does before it
 * reads the metadata. A refused file must leave a message and every byte
 * of the model's and the optimizer's state as it was (the loader checks
 * names, shapes and dtypes before it writes anything); an accepted one
 * must hand back its metadata with the checkpoint format in it.
 *
 * The body is shared with tests/unit/test_checkpoint_mutate.c
 * (CT_FUZZ_BODY_ONLY), which drives it with the deterministic mutation
 * loop and builds its seeds with fuzz_checkpoint_fixture(). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/checkpoint.h"
#include "ctrain/ctrain.h"
#include "fuzz_scratch.h"
#include "fuzz_entry.h"

#define FUZZ_CK_MODEL                                                                        \
  "input 1x4x4\nconv2d 1 2 3 padding=1\nbatchnorm2d 2\nrelu\nflatten\nlinear 32 3\n"

typedef struct fuzz_ck_fixture {
  ct_model *m;
  ct_optimizer *o;
} fuzz_ck_fixture;

/* The model and optimizer every input loads into, made once. */
static fuzz_ck_fixture *fuzz_checkpoint_fixture(void) {
  static fuzz_ck_fixture fx;
  if (fx.m) return &fx;
  char path[1024];
  if (!fuzz_scratch_file("ck_model.txt", (const uint8_t *)FUZZ_CK_MODEL, strlen(FUZZ_CK_MODEL), path, sizeof path))
    return NULL;
  ct_model_options opt = {0};
  opt.seed = 1;
  if (ct_model_create(path, &opt, &fx.m) != CT_OK) return NULL;
  ct_optim_config cfg = ct_optim_config_default(CT_OPTIM_ADAM);
  if (ct_optimizer_create(&cfg, (size_t)ct_model_param_count(fx.m), &fx.o) != CT_OK) {
    ct_model_destroy(fx.m);
    fx.m = NULL;
    return NULL;
  }
  return &fx;
}

/* Every state byte of the fixture, concatenated into buf (NULL: just the
 * size). */
static size_t fuzz_ck_snapshot(fuzz_ck_fixture *fx, uint8_t *buf) {
  size_t at = 0;
  for (int i = 0; i < ct_model_state_count(fx->m); i++) {
    const ct_tensor *t = &ct_model_state(fx->m, i)->value;
    size_t nb = ct_tensor_nbytes(t);
    if (buf) memcpy(buf + at, t->data, nb);
    at += nb;
  }
  for (size_t i = 0; i < ct_optimizer_state_count(fx->o); i++) {
    const char *name;
    float *d;
    size_t n;
    if (ct_optimizer_state(fx->o, i, &name, &d, &n) != CT_OK) continue;
    if (buf) memcpy(buf + at, d, n * sizeof *d);
    at += n * sizeof *d;
  }
  return at;
}

static int fuzz_checkpoint_one(const uint8_t *data, size_t size) {
  fuzz_ck_fixture *fx = fuzz_checkpoint_fixture();
  char path[1024];
  if (!fx || !fuzz_scratch_file("ck.safetensors", data, size, path, sizeof path)) return -1;
  size_t nb = fuzz_ck_snapshot(fx, NULL);
  uint8_t *before = malloc(nb), *after = malloc(nb);
  if (!before || !after) {
    free(before);
    free(after);
    return -1;
  }
  fuzz_ck_snapshot(fx, before);
  ct_safetensors *meta = (ct_safetensors *)1; /* must come back NULL on failure */
  ct_status s = ct_checkpoint_load(path, fx->m, fx->o, &meta);
  int rc = 0;
  if (s != CT_OK) {
    fuzz_ck_snapshot(fx, after);
    if (meta != NULL || ct_last_error()[0] == 0 || memcmp(before, after, nb) != 0) rc = -1;
  } else {
    const char *f = meta ? ct_safetensors_metadata(meta, "format") : NULL;
    if (!f || strcmp(f, "ctrain-checkpoint-1") != 0) rc = -1;
    ct_safetensors_close(meta);
  }
  free(before);
  free(after);
  return rc;
}

CT_FUZZ_ENTRY(fuzz_checkpoint_one)
