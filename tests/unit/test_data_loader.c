/* Loader: coverage and order per epoch, determinism across seeds, epochs,
 * worker counts and resume points, drop_last, the alloc hook, the
 * distributed split with its three tails, the shuffle being torch's
 * randperm (DistributedSampler(num_replicas=1) with set_epoch), and clean
 * teardown mid-epoch. Labels equal sample
 * indices (classes = N) so every delivered sample can be identified. */
#include "ctrain/data.h"
#include "test_data_util.h"

#define N 1000
#define IC 3
#define IH 6
#define IW 7

static ct_dataset *make_ds(void) {
  static uint8_t px[N * IC * IH * IW];
  static int64_t lab[N];
  tdata_fill(px, sizeof px, 3);
  for (int i = 0; i < N; i++) lab[i] = i;
  ct_dataset *ds = NULL;
  CHECK_OK(ct_dataset_from_memory("ids", N, IC, IH, IW, N, px, lab, &ds));
  return ds;
}

/* One epoch: the label sequence into ids (returns the count) and, when
 * xs is given, every x value concatenated. */
static int64_t run_epoch(ct_loader *l, int64_t epoch, int64_t start, int64_t *ids, float *xs, int64_t *nbatches,
                         int64_t *last_n) {
  int64_t n = 0, nb = 0;
  size_t xo = 0;
  CHECK_OK(ct_loader_start_epoch(l, epoch, start));
  for (;;) {
    ct_batch *b = NULL;
    ct_status s = ct_loader_next(l, &b);
    CHECK_OK(s);
    if (s != CT_OK || !b) break;
    CHECK(b->index == start + nb && b->epoch == epoch);
    CHECK(((uintptr_t)b->x.data & 63) == 0);
    CHECK(b->x.ndim == 4 && b->x.shape[0] == b->n && b->y.shape[0] == b->n && b->x.dtype == CT_F32 &&
          b->y.dtype == CT_I64);
    const int64_t *y = b->y.data;
    for (int64_t i = 0; i < b->n; i++) ids[n++] = y[i];
    if (xs) {
      size_t m = (size_t)ct_tensor_numel(&b->x);
      memcpy(xs + xo, b->x.data, m * sizeof(float));
      xo += m;
    }
    if (last_n) *last_n = b->n;
    nb++;
    ct_loader_release(l, b);
  }
  if (nbatches) *nbatches = nb;
  return n;
}

static int is_permutation(const int64_t *ids, int64_t n) {
  static int seen[N];
  memset(seen, 0, sizeof seen);
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= N || seen[ids[i]]) return 0;
    seen[ids[i]] = 1;
  }
  return n == N;
}

static size_t alloc_live = 0, alloc_calls = 0;
static void *hook_alloc(void *ctx, size_t bytes) {
  (*(int *)ctx)++;
  alloc_live++;
  alloc_calls++;
  return aligned_alloc(64, (bytes + 63) / 64 * 64);
}
static void hook_free(void *ctx, void *p) {
  (*(int *)ctx)--;
  alloc_live--;
  free(p);
}

int main(void) {
  ct_dataset *ds = make_ds();
  if (!ds) return test_summary("test_data_loader");
  static int64_t a[N], b[N], c[N];
  ct_loader_options o;
  ct_loader_options_default(&o);
  o.batch_size = 64;
  o.shuffle = 1;
  o.seed = 1234;
  o.workers = 2;
  ct_loader *l = NULL;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  CHECK(ct_loader_batches_per_epoch(l) == 16);
  int64_t nb = 0, last = 0;
  /* Every sample once, different order per epoch, not file order. */
  CHECK(run_epoch(l, 0, 0, a, NULL, &nb, &last) == N);
  CHECK(nb == 16 && last == N - 15 * 64);
  CHECK(is_permutation(a, N));
  CHECK(run_epoch(l, 1, 0, b, NULL, NULL, NULL) == N);
  CHECK(is_permutation(b, N));
  CHECK(memcmp(a, b, sizeof a) != 0);
  int in_place = 0;
  for (int i = 0; i < N; i++) in_place += a[i] == i;
  CHECK_MSG(in_place < 20, "%d samples at their file position after a shuffle", in_place);
  /* The shuffled order is torch.randperm(N, manual_seed(seed + epoch)),
   * which is what DistributedSampler(num_replicas=1) yields after
   * set_epoch(epoch); num_replicas 0 and 1 both mean that. */
  {
    static int64_t want[N];
    ct_randperm(N, 1234, want);
    CHECK(memcmp(a, want, sizeof want) == 0);
    ct_randperm(N, 1235, want);
    CHECK(memcmp(b, want, sizeof want) == 0);
    o.num_replicas = 1;
    ct_loader *l1 = NULL;
    CHECK_OK(ct_loader_create(ds, &o, &l1));
    CHECK(ct_loader_batches_per_epoch(l1) == 16);
    CHECK(run_epoch(l1, 1, 0, c, NULL, NULL, NULL) == N && memcmp(c, b, sizeof b) == 0);
    ct_loader_destroy(l1);
    o.num_replicas = 0;
  }
  /* Same seed and epoch, a new loader: same order. */
  ct_loader *l2 = NULL;
  CHECK_OK(ct_loader_create(ds, &o, &l2));
  CHECK(run_epoch(l2, 0, 0, c, NULL, NULL, NULL) == N && memcmp(a, c, sizeof a) == 0);
  ct_loader_destroy(l2);
  /* Another seed: another order. */
  o.seed = 99;
  CHECK_OK(ct_loader_create(ds, &o, &l2));
  CHECK(run_epoch(l2, 0, 0, c, NULL, NULL, NULL) == N && memcmp(a, c, sizeof a) != 0);
  ct_loader_destroy(l2);
  o.seed = 1234;
  /* Resume at batch 5 of epoch 1: exactly the remaining batches. */
  CHECK(run_epoch(l, 1, 5, c, NULL, &nb, NULL) == N - 5 * 64);
  CHECK(nb == 11 && memcmp(c, b + 5 * 64, sizeof(int64_t) * (N - 5 * 64)) == 0);
  CHECK(run_epoch(l, 1, 16, c, NULL, &nb, NULL) == 0 && nb == 0);
  CHECK(ct_loader_start_epoch(l, 1, 17) == CT_ERR_INVALID_ARG);
  /* Restart in the middle of an epoch (outstanding prefetch dropped). */
  {
    ct_batch *bt = NULL;
    CHECK_OK(ct_loader_start_epoch(l, 0, 0));
    CHECK_OK(ct_loader_next(l, &bt));
    ct_loader_release(l, bt);
    CHECK(run_epoch(l, 1, 0, c, NULL, NULL, NULL) == N && memcmp(c, b, sizeof b) == 0);
  }
  ct_loader_destroy(l);

  /* No shuffle: file order in contiguous batches. drop_last counts. */
  o.shuffle = 0;
  o.drop_last = 1;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  CHECK(ct_loader_batches_per_epoch(l) == 15);
  CHECK(run_epoch(l, 3, 0, a, NULL, &nb, &last) == 15 * 64);
  CHECK(nb == 15 && last == 64);
  int order_bad = 0;
  for (int i = 0; i < 15 * 64; i++) order_bad += a[i] != i;
  CHECK(order_bad == 0);
  ct_loader_destroy(l);
  o.drop_last = 0;
  o.batch_size = 1000;
  o.drop_last = 1;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  CHECK(ct_loader_batches_per_epoch(l) == 1);
  ct_loader_destroy(l);
  o.batch_size = 1001;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  CHECK(ct_loader_batches_per_epoch(l) == 0);
  CHECK(run_epoch(l, 0, 0, a, NULL, &nb, NULL) == 0);
  ct_loader_destroy(l);
  o.drop_last = 0;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  CHECK(ct_loader_batches_per_epoch(l) == 1);
  CHECK(run_epoch(l, 0, 0, a, NULL, &nb, &last) == N && last == N);
  ct_loader_destroy(l);

  /* With augmentation: 0, 1 and 4 workers deliver identical bytes. */
  o.batch_size = 48;
  o.shuffle = 1;
  o.transform.crop_h = 5;
  o.transform.crop_w = 5;
  o.transform.crop_padding = 1;
  o.transform.hflip_p = 0.5f;
  o.transform.normalize = 1;
  for (int k = 0; k < IC; k++) {
    o.transform.mean[k] = 0.1f * (float)(k + 1);
    o.transform.std[k] = 0.2f + 0.1f * (float)k;
  }
  static float x0[N * IC * 5 * 5], x1[N * IC * 5 * 5];
  int workers[3] = {0, 1, 4};
  for (int wi = 0; wi < 3; wi++) {
    o.workers = workers[wi];
    o.prefetch = wi == 2 ? 3 : 0;
    CHECK_OK(ct_loader_create(ds, &o, &l));
    int lc, lh, lw;
    ct_loader_shape(l, &lc, &lh, &lw);
    CHECK(lc == IC && lh == 5 && lw == 5);
    float *dst = wi == 0 ? x0 : x1;
    CHECK(run_epoch(l, 2, 0, wi == 0 ? a : b, dst, NULL, NULL) == N);
    if (wi > 0) {
      CHECK_MSG(memcmp(a, b, sizeof a) == 0, "%d workers: order differs", o.workers);
      CHECK_MSG(memcmp(x0, x1, sizeof x0) == 0, "%d workers: pixels differ", o.workers);
    }
    /* Resume at batch 7 with this worker count: same tail bytes. */
    static float xr[N * IC * 5 * 5];
    int64_t got = run_epoch(l, 2, 7, c, xr, NULL, NULL);
    CHECK(got == N - 7 * 48);
    CHECK(memcmp(xr, x0 + 7 * 48 * IC * 25, sizeof(float) * (size_t)got * IC * 25) == 0);
    ct_loader_destroy(l);
  }
  /* Transformed values are the transform of the identified sample. */
  {
    float one[IC * 5 * 5];
    int bad = 0;
    for (int i = 0; i < N; i += 37) {
      const uint8_t *px;
      CHECK_OK(ct_dataset_sample(ds, a[i], &px, NULL));
      ct_transform_apply(&o.transform, px, IC, IH, IW, o.seed, 2, a[i], one);
      bad += memcmp(one, x0 + (size_t)i * IC * 25, sizeof one) != 0;
    }
    CHECK(bad == 0);
  }

  /* Alloc hook: used for every buffer, all freed; holding every buffer is
   * an error, not a hang; destroy mid-epoch with work in flight. */
  int live = 0;
  o.alloc = hook_alloc;
  o.free = hook_free;
  o.alloc_ctx = &live;
  o.workers = 3;
  o.prefetch = 4;
  o.batch_size = 16;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  CHECK(live == 8 && alloc_calls == 8);
  CHECK_OK(ct_loader_start_epoch(l, 0, 0));
  ct_batch *held[5] = {0};
  for (int i = 0; i < 4; i++) CHECK_OK(ct_loader_next(l, &held[i]));
  CHECK(ct_loader_next(l, &held[4]) == CT_ERR_INVALID_ARG && held[4] == NULL);
  CHECK(strstr(ct_last_error(), "release") != NULL);
  ct_loader_release(l, held[0]);
  CHECK_OK(ct_loader_next(l, &held[4]));
  CHECK(held[4] && held[4]->index == 4);
  for (int i = 1; i < 5; i++) ct_loader_release(l, held[i]);
  CHECK_OK(ct_loader_next(l, &held[0]));
  ct_loader_destroy(l); /* holding one batch, workers mid-epoch */
  CHECK(live == 0);
  CHECK(ct_loader_create(ds, &o, &l) == CT_OK);
  ct_loader_destroy(l); /* never started */
  CHECK(live == 0);

  /* Distributed over 3 ranks (1000 = 3 * 333 + 1), shuffled: rank r takes
   * randperm(N, seed + epoch)[r::3] of the padded or cut order.
   *   pad (default): 334 each, two samples twice (wrapped from the start)
   *   drop:          333 each, the order's last sample left out
   *   exact:         334, 333, 333; every sample exactly once */
  o.alloc = NULL;
  o.free = NULL;
  o.num_replicas = 3;
  o.batch_size = 50;
  o.workers = 1;
  {
    static int64_t perm[N];
    ct_randperm(N, o.seed + 4, perm);
    const int tails[3] = {CT_DIST_PAD, CT_DIST_DROP, CT_DIST_EXACT};
    const int64_t counts[3][3] = {{334, 334, 334}, {333, 333, 333}, {334, 333, 333}};
    const int want_uncovered[3] = {0, 1, 0}, want_twice[3] = {2, 0, 0};
    for (int t = 0; t < 3; t++) {
      static int hits[N];
      memset(hits, 0, sizeof hits);
      o.dist_tail = tails[t];
      for (int r = 0; r < 3; r++) {
        o.rank = r;
        CHECK_OK(ct_loader_create(ds, &o, &l));
        CHECK(ct_loader_batches_per_epoch(l) == 7);
        int64_t got = run_epoch(l, 4, 0, a, NULL, NULL, NULL);
        CHECK_MSG(got == counts[t][r], "tail %d rank %d: %lld samples", t, r, (long long)got);
        int off = 0;
        for (int64_t i = 0; i < got; i++) {
          hits[a[i]]++;
          off += a[i] != perm[(r + 3 * i) % N];
        }
        CHECK_MSG(off == 0, "tail %d rank %d: %d samples off randperm[rank::3]", t, r, off);
        ct_loader_destroy(l);
      }
      int uncovered = 0, twice = 0;
      for (int i = 0; i < N; i++) {
        uncovered += hits[i] == 0;
        twice += hits[i] > 1;
      }
      CHECK_MSG(uncovered == want_uncovered[t] && twice == want_twice[t], "tail %d: %d uncovered, %d twice", t,
                uncovered, twice);
      if (t == 1) CHECK(hits[perm[N - 1]] == 0);
    }
  }
  /* The partial-batch drop_last is separate: exact tail, rank 0's 334
   * samples in 6 full batches of 50. */
  o.rank = 0;
  o.drop_last = 1;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  CHECK(ct_loader_batches_per_epoch(l) == 6);
  CHECK(run_epoch(l, 4, 0, a, NULL, NULL, NULL) == 300);
  ct_loader_destroy(l);
  o.drop_last = 0;
  /* Refused: an unknown tail, and rank 3 of 3 replicas. */
  o.dist_tail = CT_DIST_EXACT + 1;
  CHECK(ct_loader_create(ds, &o, &l) == CT_ERR_INVALID_ARG);
  CHECK(strstr(ct_last_error(), "tail") != NULL);
  o.dist_tail = CT_DIST_PAD;
  o.rank = 3;
  CHECK(ct_loader_create(ds, &o, &l) == CT_ERR_INVALID_ARG);
  CHECK(strstr(ct_last_error(), "rank 3") != NULL);
  o.num_replicas = 0;
  o.rank = 0;

  /* The sampler alone: ct_randperm is torch.randperm(10,
   * generator=torch.Generator().manual_seed(0)) of PyTorch 1.13 (the
   * parity test, tests/parity/test_sampler_torch.py, checks thousands of
   * cases against torch itself), and only the seed's low 32 bits count,
   * as in at::mt19937. */
  {
    const int64_t torch0[10] = {4, 1, 7, 5, 3, 9, 0, 8, 6, 2};
    int64_t p[10], q[10];
    ct_randperm(10, 0, p);
    CHECK(memcmp(p, torch0, sizeof p) == 0);
    ct_randperm(10, 0x100000000ull, q);
    CHECK(memcmp(p, q, sizeof p) == 0);
    /* DistributedSampler(range(10), 4, rank 3, seed 7, drop_last=False)
     * after set_epoch(2): randperm(10, 9) padded to 12, entries 3, 7, 11. */
    ct_sampler sm = {.n = 10, .num_replicas = 4, .rank = 3, .shuffle = 1, .seed = 7, .tail = CT_DIST_PAD};
    CHECK_OK(ct_sampler_check(&sm));
    CHECK(ct_sampler_count(&sm) == 3);
    int64_t share[3];
    ct_randperm(10, 9, p);
    ct_sampler_indices(&sm, 2, q, share);
    CHECK(share[0] == p[3] && share[1] == p[7] && share[2] == p[1]);
    /* Unshuffled, no scratch needed; more ranks than samples. */
    ct_sampler few = {.n = 2, .num_replicas = 4, .rank = 3, .tail = CT_DIST_PAD};
    CHECK(ct_sampler_count(&few) == 1);
    ct_sampler_indices(&few, 0, NULL, share);
    CHECK(share[0] == 1);
    few.tail = CT_DIST_DROP;
    CHECK(ct_sampler_count(&few) == 0);
    few.tail = CT_DIST_EXACT;
    CHECK(ct_sampler_count(&few) == 0);
    few.rank = 1;
    CHECK(ct_sampler_count(&few) == 1);
    few.n = -1;
    CHECK(ct_sampler_check(&few) == CT_ERR_INVALID_ARG);
    few.n = 2;
    few.num_replicas = -2;
    CHECK(ct_sampler_check(&few) == CT_ERR_INVALID_ARG);
  }

  /* Bad options. */
  o.batch_size = 0;
  CHECK(ct_loader_create(ds, &o, &l) == CT_ERR_INVALID_ARG);
  o.batch_size = 8;
  o.transform.crop_h = o.transform.crop_w = 20;
  CHECK(ct_loader_create(ds, &o, &l) == CT_ERR_INVALID_ARG);
  CHECK(strstr(ct_last_error(), "crop") != NULL);
  ct_transform_default(&o.transform);
  CHECK_OK(ct_loader_create(ds, &o, &l));
  ct_batch *bt = NULL;
  CHECK(ct_loader_next(l, &bt) == CT_ERR_INVALID_ARG);
  ct_loader_destroy(l);

  /* Synthetic data: seeded, split-dependent, learnable by nearest mean. */
  {
    ct_dataset_options so;
    ct_dataset_options_default(&so);
    so.seed = 5;
    so.synth_channels = 3;
    so.synth_height = 8;
    so.synth_width = 8;
    so.synth_classes = 4;
    ct_dataset *tr = NULL, *tr2 = NULL, *te = NULL, *other = NULL;
    CHECK_OK(ct_dataset_open("synthetic", 1, &so, &tr));
    CHECK_OK(ct_dataset_open("synthetic", 1, &so, &tr2));
    CHECK_OK(ct_dataset_open("synthetic", 0, &so, &te));
    so.seed = 6;
    CHECK_OK(ct_dataset_open("synthetic", 1, &so, &other));
    if (tr && tr2 && te && other) {
      CHECK(ct_dataset_size(tr) == 1024 && ct_dataset_size(te) == 256 && ct_dataset_classes(tr) == 4);
      const uint8_t *p1, *p2;
      int64_t y1, y2;
      int same = 1, diff_seed = 0, counts[4] = {0};
      double mean[4][192];
      memset(mean, 0, sizeof mean);
      for (int i = 0; i < 1024; i++) {
        ct_dataset_sample(tr, i, &p1, &y1);
        ct_dataset_sample(tr2, i, &p2, &y2);
        same &= y1 == y2 && memcmp(p1, p2, 192) == 0;
        ct_dataset_sample(other, i, &p2, &y2);
        diff_seed += memcmp(p1, p2, 192) != 0;
        CHECK(y1 >= 0 && y1 < 4);
        counts[y1]++;
        for (int k = 0; k < 192; k++) mean[y1][k] += p1[k];
      }
      CHECK(same);
      CHECK(diff_seed > 1000);
      for (int k = 0; k < 4; k++) {
        CHECK(counts[k] > 150);
        for (int j = 0; j < 192; j++) mean[k][j] /= counts[k] ? counts[k] : 1;
      }
      ct_dataset_sample(te, 0, &p2, NULL);
      ct_dataset_sample(tr, 0, &p1, NULL);
      CHECK(memcmp(p1, p2, 192) != 0);
      int correct = 0;
      for (int i = 0; i < 256; i++) {
        ct_dataset_sample(te, i, &p2, &y2);
        int best = 0;
        double bd = 1e300;
        for (int k = 0; k < 4; k++) {
          double d = 0;
          for (int j = 0; j < 192; j++) d += (p2[j] - mean[k][j]) * (p2[j] - mean[k][j]);
          if (d < bd) {
            bd = d;
            best = k;
          }
        }
        correct += best == y2;
      }
      CHECK_MSG(correct > 240, "nearest-mean accuracy %d/256", correct);
    }
    ct_dataset_close(tr);
    ct_dataset_close(tr2);
    ct_dataset_close(te);
    ct_dataset_close(other);
    /* "synthetic:N": N train / ceil(N/4) test samples, the first ones the
     * same as the default set's (sample i depends on the seed and i only). */
    ct_dataset *small = NULL, *small_te = NULL;
    so.seed = 5;
    CHECK_OK(ct_dataset_open("synthetic:10", 1, &so, &small));
    CHECK_OK(ct_dataset_open("synthetic:10", 0, &so, &small_te));
    CHECK_OK(ct_dataset_open("synthetic", 1, &so, &tr));
    if (small && small_te && tr) {
      CHECK(ct_dataset_size(small) == 10 && ct_dataset_size(small_te) == 3);
      const uint8_t *p1, *p2;
      int64_t y1, y2;
      ct_dataset_sample(small, 9, &p1, &y1);
      ct_dataset_sample(tr, 9, &p2, &y2);
      CHECK(y1 == y2 && memcmp(p1, p2, 192) == 0);
    }
    ct_dataset_close(small);
    ct_dataset_close(small_te);
    ct_dataset_close(tr);
    const char *bad[] = {"synthetic:", "synthetic:0", "synthetic:-4", "synthetic:12x", "synthetic:4294967296"};
    for (int i = 0; i < 5; i++) {
      CHECK_MSG(ct_dataset_open(bad[i], 1, &so, &tr) == CT_ERR_INVALID_ARG, "%s accepted", bad[i]);
      CHECK_MSG(strstr(ct_last_error(), "synthetic:N") != NULL, "%s: %s", bad[i], ct_last_error());
    }
    so.synth_channels = 0;
    CHECK(ct_dataset_open("synthetic", 1, &so, &tr) == CT_ERR_INVALID_ARG);
  }
  ct_dataset_close(ds);
  return test_summary("test_data_loader");
}
