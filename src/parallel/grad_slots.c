/* ZeRO-2's gradient slots on a device: the contract is in grad_slots.h. */
#include "parallel/grad_slots.h"

#include <stdlib.h>

#include "backend/backend.h"
#include "backend/device_impl.h"

struct ct_grad_slots {
  ct_model *m;
  ct_device *dev;
  const ct_buckets *b;
  int nb, nslots;
  void *block;                  /* the slots, then the shard */
  float *slot[CT_GRAD_SLOTS];
  float *shard;
  unsigned char *taken, *queued; /* [nb] this step */
};

/* Floats a slot or the shard takes, in whole 256-byte units. */
static size_t rounded(size_t n) { return (n + 63) / 64 * 64; }

static size_t bucket_len(const ct_buckets *b, int k) {
  size_t lo, hi;
  ct_buckets_range(b, k, &lo, &hi);
  return hi - lo;
}

/* Slot s holds the longest of the buckets k with k % nslots == s. */
static size_t slot_len(const ct_buckets *b, int s, int nslots) {
  size_t n = 0;
  for (int k = s; k < ct_buckets_count(b); k += nslots)
    if (bucket_len(b, k) > n) n = bucket_len(b, k);
  return rounded(n);
}

static int slot_count(const ct_buckets *b) {
  int nb = ct_buckets_count(b);
  return nb < CT_GRAD_SLOTS ? nb : CT_GRAD_SLOTS;
}

size_t ct_grad_slots_bytes(const ct_buckets *b, size_t n) {
  size_t total = rounded(n ? n : 1);
  for (int s = 0; s < slot_count(b); s++) total += slot_len(b, s, slot_count(b));
  return total * sizeof(float);
}

float *ct_grad_slots_shard(const ct_grad_slots *g) { return g->shard; }

float *ct_grad_slots_of(const ct_grad_slots *g, int k) { return g->slot[k % g->nslots]; }

/* The model's gradient views: each parameter in its bucket's slot. */
static float *place(void *ctx, size_t offset, size_t count) {
  (void)count;
  ct_grad_slots *g = ctx;
  int k = ct_buckets_find(g->b, offset);
  size_t lo, hi;
  if (k < 0) return NULL;
  ct_buckets_range(g->b, k, &lo, &hi);
  return ct_grad_slots_of(g, k) + (offset - lo);
}

static ct_status zero(ct_grad_slots *g, float *p, size_t n) {
  int64_t len = (int64_t)n;
  ct_tensor t = ct_tensor_view(p, CT_F32, 1, &len);
  t.device = g->dev;
  return n ? g->dev->backend->fill(g->dev, &t, 0.0f) : CT_OK;
}

ct_status ct_grad_slots_create(ct_model *m, ct_device *dev, const ct_buckets *b, size_t lo, size_t hi,
                               ct_grad_slots **out) {
  *out = NULL;
  ct_grad_slots *g = calloc(1, sizeof *g);
  int nb = ct_buckets_count(b);
  if (g) g->taken = calloc((size_t)nb + 1, 2);
  if (!g || !g->taken) {
    free(g);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "ZeRO-2: out of host memory");
  }
  g->queued = g->taken + nb + 1;
  g->m = m, g->dev = dev, g->b = b, g->nb = nb, g->nslots = slot_count(b);
  size_t bytes = ct_grad_slots_bytes(b, hi - lo);
  /* The model's block first gives up its gradient buffer, unless it was
   * prepared without one (ct_ddp_zero2_plan). */
  ct_status s = ct_model_grads(m, NULL) ? ct_model_prepare_grads_elsewhere(m, bytes) : CT_OK;
  if (s == CT_OK && !(g->block = ct_device_alloc(dev, bytes)))
    s = ct_error(CT_ERR_OUT_OF_MEMORY, "ZeRO-2: %.3f MB of gradient slots and shard on %s cannot be allocated",
                 (double)bytes / 1e6, ct_device_name(dev));
  if (s != CT_OK) {
    ct_grad_slots_destroy(g);
    return s;
  }
  float *p = g->block;
  for (int k = 0; k < g->nslots; k++) g->slot[k] = p, p += slot_len(b, k, g->nslots);
  g->shard = p;
  /* The shard's offsets that no bucket covers (gaps) stay zero. */
  s = zero(g, g->block, bytes / sizeof(float));
  if (s != CT_OK) {
    ct_grad_slots_destroy(g);
    return s;
  }
  ct_model_place_grads(m, place, g);
  *out = g;
  return CT_OK;
}

void ct_grad_slots_destroy(ct_grad_slots *g) {
  if (!g) return;
  if (g->block) {
    ct_model_place_grads(g->m, NULL, NULL);
    (void)ct_device_sync(g->dev);
    ct_device_free(g->dev, g->block);
  }
  free(g->taken);
  free(g);
}

/* Bucket k takes its slot: after the collective of the bucket that held
 * it before in this step, zeroed. */
static ct_status take(ct_grad_slots *g, int k) {
  if (g->taken[k]) return CT_OK;
  int before = k - g->nslots;
  if (before >= 0 && !g->queued[before])
    return ct_error(CT_ERR_INTERNAL, "ZeRO-2: gradient bucket %d needs its slot before bucket %d, which held it, is "
                    "final; one layer's parameters span more than %d buckets (raise --bucket-mb)",
                    k + 1, before + 1, g->nslots);
  if (before >= 0) CT_TRY(g->dev->backend->coll_await(g->dev, k % g->nslots));
  g->taken[k] = 1;
  return zero(g, ct_grad_slots_of(g, k), bucket_len(g->b, k));
}

ct_status ct_grad_slots_take(ct_grad_slots *g, size_t first, size_t count) {
  for (int k = 0; k < g->nb; k++) {
    size_t lo, hi;
    ct_buckets_range(g->b, k, &lo, &hi);
    if (lo < first + count && first < hi) CT_TRY(take(g, k));
  }
  return CT_OK;
}

ct_status ct_grad_slots_take_all(ct_grad_slots *g) {
  for (int k = 0; k < g->nb; k++) CT_TRY(take(g, k));
  return CT_OK;
}

ct_status ct_grad_slots_queued(ct_grad_slots *g, int k) {
  g->queued[k] = 1;
  return g->dev->backend->coll_record(g->dev, k % g->nslots);
}

void ct_grad_slots_reset(ct_grad_slots *g) {
  for (int k = 0; k < g->nb; k++) g->taken[k] = g->queued[k] = 0;
}
