/* The checkpoint fuzz target's body (fuzz/fuzz_checkpoint.c) over a
 * deterministic corpus: a checkpoint as ct_checkpoint_save writes it and
 * one whose tensors are half precision (the loader converts), mutated,
 * mostly in their JSON headers. Every input must be loaded or refused with
 * a message and the model and optimizer untouched. Also checked directly:
 * both seeds load, and a checkpoint of another model is refused by name.
 * Set CT_MUTATE_ITERS to run longer. */
#define CT_FUZZ_BODY_ONLY
#include "../../fuzz/fuzz_checkpoint.c"

#include "mutate_util.h"
#include "test_util.h"

/* The fixture's state as a checkpoint with every tensor in f16, written by
 * the safetensors writer directly (names as ct_checkpoint_save gives them). */
static uint8_t *half_seed(fuzz_ck_fixture *fx, const char *const *meta, const char *path, size_t *n) {
  int nm = ct_model_state_count(fx->m);
  size_t no = ct_optimizer_state_count(fx->o), k = 0;
  ct_named_tensor *t = calloc((size_t)nm + no, sizeof *t);
  char (*names)[128] = calloc((size_t)nm + no, sizeof *names);
  uint16_t *h = calloc(fuzz_ck_snapshot(fx, NULL) / 2 + 1, sizeof *h);
  size_t at = 0;
  for (int i = 0; i < nm; i++, k++) {
    const ct_state_entry *e = ct_model_state(fx->m, i);
    snprintf(names[k], sizeof names[k], "model.%s", e->name);
    t[k].name = names[k];
    t[k].t = e->value; /* counters (batch norm's num_batches_tracked) keep their integer type */
    if (e->value.dtype != CT_F32) continue;
    int64_t cnt = ct_tensor_numel(&e->value);
    for (int64_t j = 0; j < cnt; j++) h[at + (size_t)j] = ct_f32_to_f16(((const float *)e->value.data)[j]);
    t[k].t = ct_tensor_view(h + at, CT_F16, e->value.ndim, e->value.shape);
    at += (size_t)cnt;
  }
  for (size_t i = 0; i < no; i++, k++) {
    const char *sn;
    float *d;
    size_t cnt;
    ct_optimizer_state(fx->o, i, &sn, &d, &cnt);
    snprintf(names[k], sizeof names[k], "optim.%s", sn);
    for (size_t j = 0; j < cnt; j++) h[at + j] = ct_f32_to_f16(d[j]);
    t[k].name = names[k];
    t[k].t = ct_tensor_1d(h + at, CT_F16, (int64_t)cnt);
    at += cnt;
  }
  CHECK_OK(ct_safetensors_write(path, t, k, meta));
  free(t), free(names), free(h);
  return test_read_file(path, n);
}

/* Targeted damage the random loop seldom hits: the seed with the first
 * `from` replaced by `to` (same length, so the header keeps its size) must
 * be refused, with the state untouched (fuzz_checkpoint_one checks that
 * part). */
static void refused_untouched(const mutate_seed *sd, const char *from, const char *to) {
  size_t fl = strlen(from), at = 0;
  while (at + fl <= sd->n && memcmp(sd->data + at, from, fl)) at++;
  CHECK_MSG(at + fl <= sd->n, "'%s' not in the seed", from);
  if (at + fl > sd->n) return;
  uint8_t *b = malloc(sd->n);
  memcpy(b, sd->data, sd->n);
  memcpy(b + at, to, fl);
  CHECK_MSG(fuzz_checkpoint_one(b, sd->n) == 0, "'%s' -> '%s': %s", from, to, ct_last_error());
  char path[1024];
  ct_safetensors *mt = NULL;
  CHECK_MSG(fuzz_scratch_file("edited.safetensors", b, sd->n, path, sizeof path) &&
                ct_checkpoint_load(path, fuzz_checkpoint_fixture()->m, fuzz_checkpoint_fixture()->o, &mt) != CT_OK,
            "'%s' -> '%s' loaded", from, to);
  ct_safetensors_close(mt);
  free(b);
}

int main(void) {
  fuzz_ck_fixture *fx = fuzz_checkpoint_fixture();
  CHECK_MSG(fx != NULL, "fixture: %s", ct_last_error());
  if (!fx) return test_summary("test_checkpoint_mutate");
  const char *meta[] = {"format", "ctrain-checkpoint-1", "model", ct_model_name(fx->m), "loop.epoch", "1", NULL};
  char path[1024];
  snprintf(path, sizeof path, "%s/seed.safetensors", fuzz_scratch_dir());
  CHECK_OK(ct_checkpoint_save(path, fx->m, fx->o, meta));
  mutate_seed seeds[2];
  size_t n0 = 0, n1 = 0;
  uint8_t *s0 = test_read_file(path, &n0), *s1 = half_seed(fx, meta, path, &n1);
  seeds[0] = (mutate_seed){s0, n0};
  seeds[1] = (mutate_seed){s1, n1};
  for (int i = 0; i < 2; i++) {
    ct_safetensors *mt = NULL;
    fuzz_scratch_file("direct.safetensors", seeds[i].data, seeds[i].n, path, sizeof path);
    CHECK_OK(ct_checkpoint_load(path, fx->m, fx->o, &mt));
    ct_safetensors_close(mt);
  }
  /* Another model's checkpoint: refused, naming both models. */
  const char *other[] = {"format", "ctrain-checkpoint-1", "model", "resnet50", NULL};
  snprintf(path, sizeof path, "%s/other.safetensors", fuzz_scratch_dir());
  CHECK_OK(ct_checkpoint_save(path, fx->m, fx->o, other));
  ct_safetensors *mt = NULL;
  ct_status s = ct_checkpoint_load(path, fx->m, fx->o, &mt);
  CHECK(s == CT_ERR_INVALID_ARG && mt == NULL && strstr(ct_last_error(), "resnet50"));

  refused_untouched(&seeds[0], "\"F32\"", "\"I32\"");         /* a dtype that does not convert */
  refused_untouched(&seeds[1], "\"F16\"", "\"U16\"");
  refused_untouched(&seeds[0], "[3,32]", "[32,3]");              /* the linear weight transposed */
  refused_untouched(&seeds[0], "\"model.", "\"modex.");         /* one name off: missing + unexpected */
  refused_untouched(&seeds[0], "checkpoint-1", "checkpoint-2");  /* another format */

  size_t hot = 8 + (size_t)s0[0] + ((size_t)s0[1] << 8);
  mutate_spec sp = {.seeds = seeds,
                    .n_seeds = 2,
                    .hot = hot,
                    .sig = "{}[]\",:0123456789-.eE\\u ",
                    .cap = (n0 > n1 ? n0 : n1) + 4096,
                    .iters = 10000,
                    .extra = mutate_le64_prefix,
                    .one = fuzz_checkpoint_one};
  int bad = mutate_run("test_checkpoint_mutate", &sp);
  CHECK_MSG(bad == 0, "%d inconsistent checkpoints", bad);
  free(s0), free(s1);
  ct_optimizer_destroy(fx->o);
  ct_model_destroy(fx->m);
  fuzz_scratch_clear();
  return test_summary("test_checkpoint_mutate");
}
