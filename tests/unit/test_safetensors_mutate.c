/* The fuzz target's body over a deterministic corpus (tests/mutate_util.h):
 * two valid files, mostly their JSON headers damaged, plus the header
 * length nudged. Every input must be rejected with a message or accepted
 * and fully readable, and the file reader must decide as the memory reader
 * does; under ASan/valgrind this also catches out-of-bounds reads. Set
 * CT_MUTATE_ITERS to run longer. */
#define CT_FUZZ_BODY_ONLY
#include "../../fuzz/fuzz_safetensors.c"

#include <unistd.h>

#include "mutate_util.h"
#include "test_util.h"

static ct_rng rng;

static unsigned char *make_seed(const char *path, int variant, size_t *n) {
  enum { E = 24 };
  float a[E];
  uint16_t h[E];
  int32_t i32[3];
  uint8_t u8[5];
  double d[2];
  for (int i = 0; i < E; i++) a[i] = (float)ct_rng_normal(&rng), h[i] = ct_f32_to_f16(a[i]);
  for (int i = 0; i < 3; i++) i32[i] = (int32_t)ct_rng_u32(&rng);
  for (int i = 0; i < 5; i++) u8[i] = (uint8_t)ct_rng_u32(&rng);
  d[0] = ct_rng_normal(&rng), d[1] = ct_rng_normal(&rng);
  int64_t s4[4] = {2, 3, 2, 2};
  ct_named_tensor t[6] = {{"conv.weight", ct_tensor_view(a, CT_F32, 4, s4)},
                          {"conv.bias", ct_tensor_1d(h, CT_F16, variant ? 12 : 24)},
                          {"module.fc.idx", ct_tensor_1d(i32, CT_I32, 3)},
                          {"mask", ct_tensor_1d(u8, CT_U8, 5)},
                          {"scalar", ct_tensor_view(d, CT_F64, 0, NULL)},
                          {"bn.bf", ct_tensor_2d(h, CT_BF16, 2, 2)}};
  const char *meta[] = {"format", "pt", "step", "123", NULL};
  ct_safetensors_write(path, t, variant ? 6 : 4, variant ? meta : NULL);
  return test_read_file(path, n);
}

static char path[600];
static long calls;

/* The body, and every 50th input also through the file reader, which must
 * decide as the memory reader does. */
static int one(const uint8_t *data, size_t n) {
  if (ct_fuzz_safetensors_one(data, n) != 0) return -1;
  if (calls++ % 50) return 0;
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) return -1;
  ct_safetensors *st = NULL;
  ct_status s1 = ct_safetensors_open(path, &st);
  ct_safetensors_close(st);
  st = NULL;
  ct_status s2 = ct_safetensors_open_mem(data, n, "m", &st);
  ct_safetensors_close(st);
  if (s1 != s2) ct_error(CT_ERR_INVALID_ARG, "file reader %s, memory reader %s", ct_status_name(s1), ct_status_name(s2));
  return s1 == s2 ? 0 : -1;
}

int main(void) {
  ct_rng_init(&rng, 5, CT_RNG_TEST, 4, 0);
  snprintf(path, sizeof path, "%s/st_mutate_%ld.safetensors", test_tmpdir(), (long)getpid());
  size_t seed_n[2];
  unsigned char *seed[2] = {make_seed(path, 0, &seed_n[0]), make_seed(path, 1, &seed_n[1])};
  for (int i = 0; i < 2; i++) {
    ct_safetensors *st = NULL;
    CHECK_OK(ct_safetensors_open_mem(seed[i], seed_n[i], "seed", &st));
    ct_safetensors_close(st);
  }
  /* The safetensors header sits behind its 8-byte length: 8 + that many
   * bytes take most of the damage. */
  size_t hot = 8 + (size_t)seed[0][0] + ((size_t)seed[0][1] << 8);
  const mutate_seed seeds[2] = {{seed[0], seed_n[0]}, {seed[1], seed_n[1]}};
  mutate_spec sp = {.seeds = seeds,
                    .n_seeds = 2,
                    .hot = hot,
                    .sig = "{}[]\",:0123456789-.eE\\u ",
                    .cap = 16000,
                    .iters = 100000,
                    .extra = mutate_le64_prefix,
                    .one = one};
  int bad = mutate_run("test_safetensors_mutate", &sp);
  CHECK_MSG(bad == 0, "%d inconsistent inputs", bad);
  unlink(path);
  free(seed[0]), free(seed[1]);
  return test_summary("test_safetensors_mutate");
}
