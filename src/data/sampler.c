/* torch.utils.data.DistributedSampler, bit for bit: torch.randperm's CPU
 * algorithm on PyTorch's MT19937, then the sampler's padding or cut and its
 * strided split over the ranks. The loader (loader.c) and the GPU data path
 * (gpu_data.c) both size and fill the epoch's order from here, so a run's
 * order is PyTorch's for the same seed, epoch and world size. */
#include "data/dataset_impl.h"

#define MT_N 624
#define MT_M 397

/* at::mt19937 (ATen/core/MT19937RNGEngine.h): the reference MT19937, which
 * is what std::mt19937 and numpy's legacy RandomState also produce. */
typedef struct mt19937 {
  uint32_t s[MT_N];
  int next; /* index of the next word to temper; MT_N: twist first */
} mt19937;

/* init_genrand: at::mt19937(seed) keeps seed & 0xffffffff, so a seed that
 * differs above bit 31 gives the same stream there and here. */
static void mt_seed(mt19937 *m, uint32_t seed) {
  m->s[0] = seed;
  for (uint32_t j = 1; j < MT_N; j++) m->s[j] = 1812433253u * (m->s[j - 1] ^ (m->s[j - 1] >> 30)) + j;
  m->next = MT_N;
}

/* Regenerates all 624 words; entries past i + M wrap to words already
 * regenerated in this pass, as in the reference implementation. */
static void mt_twist(mt19937 *m) {
  for (int i = 0; i < MT_N; i++) {
    uint32_t y = (m->s[i] & 0x80000000u) | (m->s[(i + 1) % MT_N] & 0x7fffffffu);
    m->s[i] = m->s[(i + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
  }
  m->next = 0;
}

static uint32_t mt_next(mt19937 *m) {
  if (m->next >= MT_N) mt_twist(m);
  uint32_t y = m->s[m->next++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

/* randperm_cpu (ATen/native/TensorFactories.cpp, 1.13): the identity, then
 * a forward Fisher-Yates pass; z = random() % (n - i) is one 32-bit draw
 * reduced modulo the remaining length (a slight bias torch accepts, kept so
 * the order is torch's). */
void ct_randperm(int64_t n, uint64_t seed, int64_t *out) {
  for (int64_t i = 0; i < n; i++) out[i] = i;
  if (n < 2) return;
  mt19937 m;
  mt_seed(&m, (uint32_t)seed);
  for (int64_t i = 0; i < n - 1; i++) {
    int64_t z = (int64_t)(mt_next(&m) % (uint64_t)(n - i));
    int64_t t = out[i];
    out[i] = out[i + z];
    out[i + z] = t;
  }
}

/* num_replicas 0 and 1 both mean one rank holding everything. */
static int64_t replicas(const ct_sampler *s) { return s->num_replicas > 1 ? s->num_replicas : 1; }
static int64_t rank_of(const ct_sampler *s) { return s->num_replicas > 1 ? s->rank : 0; }

ct_status ct_sampler_check(const ct_sampler *s) {
  if (s->n < 0) return ct_error(CT_ERR_INVALID_ARG, "sampler: dataset length %lld is negative", (long long)s->n);
  if (s->num_replicas < 0)
    return ct_error(CT_ERR_INVALID_ARG, "sampler: num_replicas %d is negative (0 or 1: not distributed)",
                    s->num_replicas);
  if (s->num_replicas > 1 && (s->rank < 0 || s->rank >= s->num_replicas))
    return ct_error(CT_ERR_INVALID_ARG, "sampler: rank %d is outside [0, num_replicas=%d)", s->rank, s->num_replicas);
  if (s->tail < CT_DIST_PAD || s->tail > CT_DIST_EXACT)
    return ct_error(CT_ERR_INVALID_ARG, "sampler: tail %d; expected 0 (pad), 1 (drop) or 2 (exact)", s->tail);
  return CT_OK;
}

int64_t ct_sampler_count(const ct_sampler *s) {
  int64_t n = s->n, R = replicas(s), r = rank_of(s);
  switch (s->tail) {
  case CT_DIST_DROP:
    /* DistributedSampler's ceil((n - R) / R) when R does not divide n
     * (0 for n < R: Python's ceil of a value in (-1, 0)), n / R when it
     * does: floor(n / R) either way. */
    return n / R;
  case CT_DIST_EXACT:
    return r < n ? (n - r + R - 1) / R : 0;
  default:
    return (n + R - 1) / R;
  }
}

void ct_sampler_indices(const ct_sampler *s, int64_t epoch, int64_t *work, int64_t *out) {
  int64_t n = s->n, R = replicas(s), r = rank_of(s), count = ct_sampler_count(s);
  /* The padded order repeats the order from its start, so its entry k is
   * entry k % n; with DROP and EXACT every k read is already below n. */
  if (s->shuffle) {
    ct_randperm(n, s->seed + (uint64_t)epoch, work);
    for (int64_t j = 0; j < count; j++) out[j] = work[(r + j * R) % n];
  } else {
    for (int64_t j = 0; j < count; j++) out[j] = (r + j * R) % n;
  }
}

void ct_loader_sampler(const ct_loader_options *o, int64_t n, ct_sampler *s) {
  s->n = n;
  s->num_replicas = o->num_replicas;
  s->rank = o->rank;
  s->shuffle = o->shuffle != 0;
  s->seed = o->seed;
  s->tail = o->dist_tail;
}
