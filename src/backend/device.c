/* Device objects: spec parsing, memory accounting, and the worker thread
 * behind virtual CPU devices (and behind any device DataParallel drives). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device_impl.h"

struct ct_device_task {
  void (*fn)(void *);
  void *arg;
  struct ct_device_task *next;
};

static ct_status parse_index(const char *spec, const char *rest, int *idx) {
  if (*rest == 0) {
    *idx = 0;
    return CT_OK;
  }
  if (*rest != ':') return ct_error(CT_ERR_INVALID_ARG, "device '%s': expected cpu, cpu:N, ref, cuda or cuda:N", spec);
  char *end;
  long v = strtol(rest + 1, &end, 10);
  if (end == rest + 1 || *end || v < 0 || v > 1023)
    return ct_error(CT_ERR_INVALID_ARG, "device '%s': index must be an integer 0..1023", spec);
  *idx = (int)v;
  return CT_OK;
}

static void *worker_main(void *arg) {
  ct_device *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->head && !d->stop) pthread_cond_wait(&d->cv, &d->mu);
    if (!d->head && d->stop) break;
    struct ct_device_task *t = d->head;
    d->head = t->next;
    if (!d->head) d->tail = NULL;
    pthread_mutex_unlock(&d->mu);
    t->fn(t->arg);
    free(t);
    pthread_mutex_lock(&d->mu);
    d->pending--;
    pthread_cond_broadcast(&d->cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

ct_status ct_device_open(const char *spec, ct_device **out) {
  *out = NULL;
  if (!spec) return ct_error(CT_ERR_INVALID_ARG, "device: no spec given");
  ct_device *d = calloc(1, sizeof *d);
  if (!d) return ct_error(CT_ERR_OUT_OF_MEMORY, "device: out of host memory");
  ct_status s = CT_OK;
  if (strncmp(spec, "cpu", 3) == 0) {
    s = parse_index(spec, spec + 3, &d->index);
    d->type = CT_DEVICE_CPU;
    d->is_virtual = spec[3] == ':';
    d->backend = ct_cpu_backend();
  } else if (strncmp(spec, "ref", 3) == 0) {
    s = parse_index(spec, spec + 3, &d->index);
    d->type = CT_DEVICE_REF;
    d->is_virtual = spec[3] == ':';
    d->backend = ct_ref_backend();
  } else if (strncmp(spec, "cuda", 4) == 0) {
    s = parse_index(spec, spec + 4, &d->index);
    d->type = CT_DEVICE_CUDA;
    d->backend = ct_cuda_backend();
    if (s == CT_OK && !d->backend)
      s = ct_error(CT_ERR_NO_DEVICE, "device '%s': this ctrain was built without CUDA (nvcc was not found at build time)", spec);
  } else {
    s = ct_error(CT_ERR_INVALID_ARG, "device '%s': expected cpu, cpu:N, ref, cuda or cuda:N", spec);
  }
  if (s != CT_OK) {
    free(d);
    return s;
  }
  snprintf(d->name, sizeof d->name, "%s", spec);
  atomic_init(&d->in_use, 0);
  atomic_init(&d->peak, 0);
  d->threads = 0; /* 0 = the runtime's default */
  if (d->backend->open && (s = d->backend->open(d)) != CT_OK) {
    free(d);
    return s;
  }
  pthread_mutex_init(&d->tmp_mu, NULL);
  if (d->is_virtual && (s = ct_device_start_worker(d)) != CT_OK) {
    if (d->backend->close) d->backend->close(d);
    pthread_mutex_destroy(&d->tmp_mu);
    free(d);
    return s;
  }
  *out = d;
  return CT_OK;
}

ct_status ct_device_start_worker(ct_device *d) {
  if (d->worker_running) return CT_OK;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  if (pthread_create(&d->worker, NULL, worker_main, d) != 0) {
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    return ct_error(CT_ERR_INTERNAL, "device '%s': cannot start its worker thread", d->name);
  }
  d->worker_running = 1;
  return CT_OK;
}

void ct_device_close(ct_device *d) {
  if (!d) return;
  if (d->worker_running) {
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->worker, NULL);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
  }
  if (d->backend && d->backend->close) d->backend->close(d);
  ct_device_tmp_release(d);
  pthread_mutex_destroy(&d->tmp_mu);
  free(d);
}

ct_device_type ct_device_get_type(const ct_device *d) { return d->type; }
int ct_device_index(const ct_device *d) { return d->index; }
const char *ct_device_name(const ct_device *d) { return d->name; }
size_t ct_device_mem_in_use(const ct_device *d) { return atomic_load(&((ct_device *)d)->in_use); }
size_t ct_device_mem_peak(const ct_device *d) { return atomic_load(&((ct_device *)d)->peak); }
void ct_device_reset_peak(ct_device *d) { atomic_store(&d->peak, atomic_load(&d->in_use)); }
void ct_device_set_threads(ct_device *d, int n) { d->threads = n; }
int ct_device_threads(const ct_device *d) { return d->threads; }

/* A cuda-only switch: set through the backend, refused on a device without
 * one when turned on (missing: what the device lacks). */
static ct_status cuda_switch(ct_device *d, const char *option, int on, const char *missing) {
  if (d->backend->set_option) return d->backend->set_option(d, option, on);
  return on ? ct_error(CT_ERR_INVALID_ARG, "device '%s' has no %s", d->name, missing) : CT_OK;
}

ct_status ct_device_set_cudnn_benchmark(ct_device *d, int on) {
  return cuda_switch(d, "cudnn_benchmark", on, "cuDNN");
}

ct_status ct_device_set_tf32(ct_device *d, int on) { return cuda_switch(d, "tf32", on, "TF32 tensor cores"); }

ct_status ct_device_set_deterministic(ct_device *d, int on) {
  /* cpu and ref have no set_option: their kernels are deterministic. */
  return d->backend->set_option ? d->backend->set_option(d, "deterministic", on) : CT_OK;
}
const ct_backend *ct_device_backend(const ct_device *d) { return d->backend; }

void ct_device_account(ct_device *d, long long delta) {
  size_t now = atomic_fetch_add(&d->in_use, (size_t)delta) + (size_t)delta;
  size_t pk = atomic_load(&d->peak);
  while (now > pk && !atomic_compare_exchange_weak(&d->peak, &pk, now)) {
  }
}

/* Host allocations carry a 64-byte header holding their size, so frees are
 * accounted without a side table. */
void *ct_device_alloc(ct_device *d, size_t bytes) {
  if (d && d->backend->alloc) {
    void *p = d->backend->alloc(d, bytes);
    if (p) ct_device_account(d, (long long)bytes);
    return p;
  }
  size_t total = 64 + (bytes + 63) / 64 * 64;
  unsigned char *p = aligned_alloc(64, total);
  if (!p) {
    ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of host memory", d ? d->name : "host", bytes);
    return NULL;
  }
  memcpy(p, &bytes, sizeof bytes);
  if (d) ct_device_account(d, (long long)bytes);
  return p + 64;
}

void ct_device_free(ct_device *d, void *ptr) {
  if (!ptr) return;
  if (d && d->backend->free) {
    d->backend->free(d, ptr);
    return;
  }
  unsigned char *p = (unsigned char *)ptr - 64;
  size_t bytes;
  memcpy(&bytes, p, sizeof bytes);
  if (d) ct_device_account(d, -(long long)bytes);
  free(p);
}

ct_status ct_device_copy(ct_device *dst_dev, void *dst, ct_device *src_dev, const void *src, size_t bytes) {
  ct_device *dev = (dst_dev && dst_dev->backend->copy) ? dst_dev : (src_dev && src_dev->backend->copy) ? src_dev : NULL;
  if (!dev) {
    memmove(dst, src, bytes);
    return CT_OK;
  }
  return dev->backend->copy(dev, dst, dst_dev == dev, src, src_dev == dev, bytes);
}

void ct_device_wait_tasks(ct_device *d) {
  if (!d->worker_running) return;
  pthread_mutex_lock(&d->mu);
  while (d->pending) pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
}

ct_status ct_device_sync(ct_device *d) {
  ct_device_wait_tasks(d);
  return d->backend->sync ? d->backend->sync(d) : CT_OK;
}

ct_status ct_device_submit(ct_device *d, void (*fn)(void *), void *arg) {
  if (!d->worker_running) {
    fn(arg);
    return CT_OK;
  }
  struct ct_device_task *t = malloc(sizeof *t);
  if (!t) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot queue work", d->name);
  t->fn = fn;
  t->arg = arg;
  t->next = NULL;
  pthread_mutex_lock(&d->mu);
  if (d->tail)
    d->tail->next = t;
  else
    d->head = t;
  d->tail = t;
  d->pending++;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  return CT_OK;
}

#ifndef CTRAIN_HAVE_CUDA
const ct_backend *ct_cuda_backend(void) { return NULL; }
int ct_cuda_list_devices(char *buf, size_t n) {
  snprintf(buf, n, "this ctrain was built without CUDA (nvcc was not found at build time)");
  return -1;
}
#endif

void *ct_device_host_alloc(ct_device *d, size_t bytes) {
  const ct_backend *be = ct_device_backend(d);
  return be->host_alloc ? be->host_alloc(d, bytes) : NULL;
}

void ct_device_host_free(ct_device *d, void *p) {
  const ct_backend *be = ct_device_backend(d);
  if (p && be->host_free) be->host_free(d, p);
}

int ct_device_can_capture_graphs(const ct_device *d) { return ct_device_backend(d)->graph_begin != NULL; }

size_t ct_device_describe(ct_device *d, char *buf, size_t n) {
  const ct_backend *be = ct_device_backend(d);
  if (be->describe) return be->describe(d, buf, n);
  if (n) buf[0] = 0;
  return 0;
}

ct_status ct_device_set_profiler_range(ct_device *d, int on) {
  const ct_backend *be = ct_device_backend(d);
  if (!be->set_option)
    return ct_error(CT_ERR_UNSUPPORTED, "device %s has no profiler range (cuda has)", ct_device_name(d));
  return be->set_option(d, "profiler_range", on);
}
