/* Batch loader: a ring of `prefetch` batch buffers filled by worker threads
 * and handed out strictly in batch order.
 *
 * Jobs (batch indices) are claimed in increasing order and a worker fills a
 * whole batch, so which thread filled a batch never shows in its content:
 * the sample order is fixed by (seed, epoch) (DistributedSampler's,
 * sampler.c) and each sample's augmentation by (seed, epoch, sample
 * index). Prefetch is bounded by the buffer count and by next_deliver +
 * prefetch, so memory stays fixed however slow the consumer is. */
#include "data/dataset_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOADER_MAX_WORKERS 64

enum { BUF_FREE = 0, BUF_FILLING, BUF_READY, BUF_OUT };

typedef struct loader_buf {
  ct_batch b;
  int state;
  int64_t job;
  void *xbuf;     /* image storage (b.x.data points here, or is NULL in index mode) */
  int64_t *ids;   /* CT_LOADER_RAW_U8: the batch's own copy of its sample indices */
} loader_buf;

struct ct_loader {
  const ct_dataset *ds;
  ct_loader_options opt;
  int c, oh, ow;
  size_t img_floats;
  float lut[CT_DATA_MAX_CHANNELS][256]; /* see ct_transform_lut */
  ct_sampler sampler; /* the epoch's order for this rank */
  int64_t n_local;   /* samples this rank visits per epoch: ct_sampler_count */
  int64_t nb;        /* batches per epoch */
  int64_t *perm;     /* [ds->n] dataset order of the epoch */
  int64_t *order;    /* [n_local] this rank's share of perm (== perm when not distributed) */
  loader_buf *bufs;  /* [nbuf] */
  int nbuf;
  pthread_t *threads;
  int nthreads;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* workers: a job may be claimable */
  pthread_cond_t done_cv; /* consumer / start_epoch: a buffer finished */
  int started, stop, filling;
  int64_t epoch, next_job, next_deliver;
  void *device_data; /* ct_loader_set_device_data */
};

static void *default_alloc(void *ctx, size_t bytes) {
  (void)ctx;
  return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void default_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

void ct_loader_options_default(ct_loader_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->batch_size = 64;
  ct_transform_default(&opt->transform);
}

/* Fills buffer `buf` with batch `job`; only reads loader state that
 * start_epoch leaves alone while any buffer is FILLING. */
static void fill_batch(ct_loader *l, loader_buf *buf, int64_t job) {
  int64_t B = l->opt.batch_size, start = job * B;
  int64_t n = l->n_local - start < B ? l->n_local - start : B;
  const ct_dataset *ds = l->ds;
  size_t img = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
  void *x = buf->xbuf;
  int64_t *y = buf->b.y.data;
  const int64_t *order = l->order + start;
  for (int64_t i = 0; i < n; i++) {
    int64_t idx = order[i];
    const uint8_t *px = ds->pixels + (size_t)idx * img;
    y[i] = ds->labels[idx];
    /* The device modes skip the transform: the GPU runs it, keyed by the
     * same sample index (samples). */
    if (l->opt.mode == CT_LOADER_FLOAT)
      ct_transform_apply_lut(&l->opt.transform, (const float(*)[256])l->lut, px, ds->c, ds->h, ds->w, l->opt.seed,
                             l->epoch, idx, (float *)x + (size_t)i * l->img_floats);
    else if (l->opt.mode == CT_LOADER_RAW_U8)
      memcpy((uint8_t *)x + (size_t)i * img, px, img);
  }
  buf->b.n = n;
  buf->b.index = job;
  buf->b.epoch = l->epoch;
  if (l->opt.mode == CT_LOADER_FLOAT) {
    int64_t xs[4] = {n, l->c, l->oh, l->ow};
    buf->b.x = ct_tensor_view(x, CT_F32, 4, xs);
  } else {
    int64_t xs[4] = {n, ds->c, ds->h, ds->w};
    buf->b.x = ct_tensor_view(l->opt.mode == CT_LOADER_RAW_U8 ? x : NULL, CT_U8, 4, xs);
  }
  buf->b.y = ct_tensor_view(y, CT_I64, 1, &n);
  if (buf->ids) {
    memcpy(buf->ids, order, (size_t)n * sizeof *order);
    buf->b.samples = buf->ids;
  } else {
    buf->b.samples = order;
  }
  buf->b.order = l->order;
  buf->b.order_n = l->n_local;
}

static loader_buf *find_free(ct_loader *l) {
  for (int i = 0; i < l->nbuf; i++)
    if (l->bufs[i].state == BUF_FREE) return &l->bufs[i];
  return NULL;
}

static int can_claim(ct_loader *l) {
  return l->started && l->next_job < l->nb && l->next_job < l->next_deliver + l->nbuf;
}

static void *worker_main(void *arg) {
  ct_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    loader_buf *buf = NULL;
    while (!l->stop && !(can_claim(l) && (buf = find_free(l)) != NULL)) pthread_cond_wait(&l->work_cv, &l->mu);
    if (l->stop) break;
    int64_t job = l->next_job++;
    buf->state = BUF_FILLING;
    buf->job = job;
    l->filling++;
    pthread_mutex_unlock(&l->mu);
    fill_batch(l, buf, job);
    pthread_mutex_lock(&l->mu);
    l->filling--;
    buf->state = BUF_READY;
    pthread_cond_broadcast(&l->done_cv);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

ct_status ct_loader_create(const ct_dataset *ds, const ct_loader_options *opt, ct_loader **out) {
  *out = NULL;
  ct_loader_options o;
  if (opt)
    o = *opt;
  else
    ct_loader_options_default(&o);
  if (!ds) return ct_error(CT_ERR_INVALID_ARG, "loader: no dataset");
  if (o.batch_size < 1) return ct_error(CT_ERR_INVALID_ARG, "loader: batch_size %lld must be >= 1", (long long)o.batch_size);
  if (o.workers < 0 || o.workers > LOADER_MAX_WORKERS)
    return ct_error(CT_ERR_INVALID_ARG, "loader: workers %d; expected 0..%d", o.workers, LOADER_MAX_WORKERS);
  ct_sampler sampler;
  ct_loader_sampler(&o, ds->n, &sampler);
  if (ct_sampler_check(&sampler) != CT_OK) return ct_error_wrap(CT_ERR_INVALID_ARG, "loader");
  if (o.prefetch < 0) return ct_error(CT_ERR_INVALID_ARG, "loader: prefetch %d must be >= 0", o.prefetch);
  if (!o.alloc != !o.free) return ct_error(CT_ERR_INVALID_ARG, "loader: give both alloc and free hooks or neither");
  if (o.mode < CT_LOADER_FLOAT || o.mode > CT_LOADER_INDICES)
    return ct_error(CT_ERR_INVALID_ARG, "loader: mode %d; expected 0 (float), 1 (raw uint8) or 2 (indices)", o.mode);
  int oh, ow;
  ct_status s = ct_transform_check(&o.transform, ds->c, ds->h, ds->w, &oh, &ow);
  if (s != CT_OK) return ct_error_wrap(s, "loader over %s (%dx%dx%d)", ds->name, ds->c, ds->h, ds->w);
  if (!o.alloc) {
    o.alloc = default_alloc;
    o.free = default_free;
  }
  if (o.prefetch == 0) o.prefetch = 2 * (o.workers > 0 ? o.workers : 1);
  if (o.prefetch < 2) o.prefetch = 2;

  ct_loader *l = calloc(1, sizeof *l);
  if (!l) return ct_error(CT_ERR_OUT_OF_MEMORY, "loader: out of memory");
  l->ds = ds;
  l->opt = o;
  l->c = ds->c;
  l->oh = oh;
  l->ow = ow;
  l->img_floats = (size_t)ds->c * (size_t)oh * (size_t)ow;
  ct_transform_lut(&o.transform, ds->c, l->lut);
  l->sampler = sampler;
  l->n_local = ct_sampler_count(&sampler);
  l->nb = o.drop_last ? l->n_local / o.batch_size : (l->n_local + o.batch_size - 1) / o.batch_size;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->work_cv, NULL);
  pthread_cond_init(&l->done_cv, NULL);
  l->perm = malloc(((size_t)ds->n + 1) * sizeof *l->perm);
  /* One rank's share is the whole order: fill it in place. */
  l->order = o.num_replicas > 1 ? malloc(((size_t)l->n_local + 1) * sizeof *l->order) : l->perm;
  l->nbuf = o.prefetch;
  l->bufs = calloc((size_t)l->nbuf, sizeof *l->bufs);
  if (!l->perm || !l->order || !l->bufs) {
    ct_loader_destroy(l);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "loader: out of memory for %lld indices", (long long)ds->n);
  }
  size_t img_u8 = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
  size_t xbytes = o.mode == CT_LOADER_FLOAT    ? (size_t)o.batch_size * l->img_floats * sizeof(float)
                  : o.mode == CT_LOADER_RAW_U8 ? (size_t)o.batch_size * img_u8
                                               : 64;
  size_t ybytes = (size_t)o.batch_size * sizeof(int64_t);
  for (int i = 0; i < l->nbuf; i++) {
    l->bufs[i].xbuf = l->bufs[i].b.x.data = o.alloc(o.alloc_ctx, xbytes);
    l->bufs[i].b.y.data = o.alloc(o.alloc_ctx, ybytes);
    if (o.mode == CT_LOADER_RAW_U8 && l->bufs[i].xbuf) {
      l->bufs[i].ids = o.alloc(o.alloc_ctx, ybytes);
      if (!l->bufs[i].ids) {
        ct_loader_destroy(l);
        return ct_error(CT_ERR_OUT_OF_MEMORY, "loader: cannot allocate %d sample-index buffers of %zu bytes",
                        o.prefetch, ybytes);
      }
    }
    if (!l->bufs[i].b.x.data || !l->bufs[i].b.y.data || ((uintptr_t)l->bufs[i].b.x.data & 63)) {
      int misaligned = l->bufs[i].b.x.data && ((uintptr_t)l->bufs[i].b.x.data & 63);
      ct_loader_destroy(l);
      return misaligned ? ct_error(CT_ERR_INVALID_ARG, "loader: the alloc hook returned memory not 64-byte aligned")
                        : ct_error(CT_ERR_OUT_OF_MEMORY, "loader: cannot allocate %d batch buffers of %zu bytes",
                                   o.prefetch, xbytes);
    }
  }
  if (o.workers > 0) {
    l->threads = calloc((size_t)o.workers, sizeof *l->threads);
    if (!l->threads) {
      ct_loader_destroy(l);
      return ct_error(CT_ERR_OUT_OF_MEMORY, "loader: out of memory");
    }
    for (int i = 0; i < o.workers; i++) {
      if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0) {
        ct_loader_destroy(l);
        return ct_error(CT_ERR_INTERNAL, "loader: cannot start worker thread %d of %d", i + 1, o.workers);
      }
      l->nthreads++;
    }
  }
  *out = l;
  return CT_OK;
}

int64_t ct_loader_batches_per_epoch(const ct_loader *l) { return l->nb; }

const ct_loader_options *ct_loader_get_options(const ct_loader *l) { return &l->opt; }

const ct_dataset *ct_loader_dataset(const ct_loader *l) { return l->ds; }

void ct_loader_set_device_data(ct_loader *l, void *p) {
  pthread_mutex_lock(&l->mu);
  l->device_data = p;
  pthread_mutex_unlock(&l->mu);
}

void ct_loader_shape(const ct_loader *l, int *c, int *h, int *w) {
  if (c) *c = l->c;
  if (h) *h = l->oh;
  if (w) *w = l->ow;
}

/* The epoch's order: DistributedSampler's for this rank, with
 * set_epoch(epoch) (randperm seeded with seed + epoch when shuffling). */
static void build_order(ct_loader *l, int64_t epoch) { ct_sampler_indices(&l->sampler, epoch, l->perm, l->order); }

ct_status ct_loader_start_epoch(ct_loader *l, int64_t epoch, int64_t start_batch) {
  if (start_batch < 0 || start_batch > l->nb)
    return ct_error(CT_ERR_INVALID_ARG, "loader: start batch %lld is outside [0, %lld]", (long long)start_batch,
                    (long long)l->nb);
  if (epoch < 0 || epoch > 0xFFFFFFFFll)
    return ct_error(CT_ERR_INVALID_ARG, "loader: epoch %lld is outside [0, 2^32)", (long long)epoch);
  pthread_mutex_lock(&l->mu);
  l->started = 0; /* no new claims; let batches in flight finish */
  while (l->filling > 0) pthread_cond_wait(&l->done_cv, &l->mu);
  for (int i = 0; i < l->nbuf; i++)
    if (l->bufs[i].state == BUF_READY) l->bufs[i].state = BUF_FREE;
  l->epoch = epoch;
  build_order(l, epoch);
  l->next_job = l->next_deliver = start_batch;
  l->started = 1;
  pthread_cond_broadcast(&l->work_cv);
  pthread_mutex_unlock(&l->mu);
  return CT_OK;
}

ct_status ct_loader_next(ct_loader *l, ct_batch **b) {
  *b = NULL;
  pthread_mutex_lock(&l->mu);
  if (!l->started) {
    pthread_mutex_unlock(&l->mu);
    return ct_error(CT_ERR_INVALID_ARG, "loader: ct_loader_next before ct_loader_start_epoch");
  }
  ct_status s = CT_OK;
  while (l->next_deliver < l->nb) {
    loader_buf *ready = NULL;
    for (int i = 0; i < l->nbuf && !ready; i++)
      if (l->bufs[i].state == BUF_READY && l->bufs[i].job == l->next_deliver) ready = &l->bufs[i];
    if (ready) {
      ready->state = BUF_OUT;
      ready->b.device_data = l->device_data; /* under the lock: set_device_data may race a fill */
      l->next_deliver++;
      *b = &ready->b;
      pthread_cond_broadcast(&l->work_cv);
      break;
    }
    /* Jobs are claimed in order, so if ours is unclaimed nothing later is
     * either, and a missing free buffer means the caller holds them all. */
    loader_buf *free_buf = l->next_job == l->next_deliver ? find_free(l) : NULL;
    if (l->next_job == l->next_deliver && !free_buf) {
      s = ct_error(CT_ERR_INVALID_ARG,
                   "loader: all %d batch buffers are held by the caller; release batches (ct_loader_release) "
                   "or raise prefetch",
                   l->nbuf);
      break;
    }
    if (l->nthreads == 0) {
      int64_t job = l->next_job++;
      free_buf->state = BUF_FILLING;
      free_buf->job = job;
      l->filling++;
      pthread_mutex_unlock(&l->mu);
      fill_batch(l, free_buf, job);
      pthread_mutex_lock(&l->mu);
      l->filling--;
      free_buf->state = BUF_READY;
      continue;
    }
    pthread_cond_wait(&l->done_cv, &l->mu);
  }
  pthread_mutex_unlock(&l->mu);
  return s;
}

void ct_loader_release(ct_loader *l, ct_batch *b) {
  if (!b) return;
  pthread_mutex_lock(&l->mu);
  for (int i = 0; i < l->nbuf; i++)
    if (&l->bufs[i].b == b && l->bufs[i].state == BUF_OUT) {
      l->bufs[i].state = BUF_FREE;
      pthread_cond_broadcast(&l->work_cv);
      pthread_cond_broadcast(&l->done_cv);
    }
  pthread_mutex_unlock(&l->mu);
}

void ct_loader_destroy(ct_loader *l) {
  if (!l) return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->work_cv);
  pthread_mutex_unlock(&l->mu);
  for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
  free(l->threads);
  if (l->bufs)
    for (int i = 0; i < l->nbuf; i++) {
      if (l->bufs[i].xbuf) l->opt.free(l->opt.alloc_ctx, l->bufs[i].xbuf);
      if (l->bufs[i].ids) l->opt.free(l->opt.alloc_ctx, l->bufs[i].ids);
      if (l->bufs[i].b.y.data) l->opt.free(l->opt.alloc_ctx, l->bufs[i].b.y.data);
    }
  free(l->bufs);
  if (l->order != l->perm) free(l->order);
  free(l->perm);
  pthread_cond_destroy(&l->work_cv);
  pthread_cond_destroy(&l->done_cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
}
