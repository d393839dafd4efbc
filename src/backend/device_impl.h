/* The device object behind the opaque ct_device handle. Internal: backends
 * keep their private state (oneDNN engine and stream, CUDA stream and
 * handles) in `impl`. It lives in src/backend, not src/core, because a
 * device is a backend table plus state: device.c binds one to the other,
 * and core stays free of any backend. */
#ifndef CTRAIN_BACKEND_DEVICE_IMPL_H
#define CTRAIN_BACKEND_DEVICE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include "ctrain/device.h"
#include "backend/backend.h"

/* Freed host temporaries a device keeps for reuse (device_tmp.c). */
#define CT_DEVICE_TMP_KEEP 8

struct ct_device {
  ct_device_type type;
  int index;
  int is_virtual; /* cpu:N */
  char name[32];
  const ct_backend *backend;
  atomic_size_t in_use;
  atomic_size_t peak;
  int threads;
  void *impl;
  /* Virtual CPU devices run submitted work on their own thread, and so
   * does a device given one by ct_device_start_worker. */
  pthread_t worker;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int worker_running, stop;
  struct ct_device_task *head, *tail;
  int pending;
  /* Host temporaries kept between calls (device_tmp.c): the kept blocks,
   * their bytes, the bytes handed out and not yet back, and the most ever
   * handed out at once (blocks of TMP_MIN_KEEP and up only). */
  pthread_mutex_t tmp_mu;
  int tmp_n;
  void *tmp_kept[CT_DEVICE_TMP_KEEP];
  size_t tmp_kept_bytes, tmp_live, tmp_peak;
};

/* Backend tables (each complete after ct_backend_fill_defaults). */
const ct_backend *ct_ref_backend(void);
const ct_backend *ct_cpu_backend(void);
const ct_backend *ct_cuda_backend(void); /* NULL when built without CUDA */


/* Gives d a thread of its own for ct_device_submit's work (virtual CPU
 * devices have one from the start): DataParallel runs each replica's
 * phases on its device's thread. ct_device_close stops it. */
ct_status ct_device_start_worker(ct_device *d);
/* Waits until the work submitted to d has run (not for the device's own
 * queue: ct_device_sync waits for both). */
void ct_device_wait_tasks(ct_device *d);

/* Memory accounting hooks for backends that allocate themselves. */
void ct_device_account(ct_device *d, long long delta);

/* Host temporaries for a single call (device_tmp.c): get returns at least
 * `bytes`, 64-byte aligned, uninitialised (NULL when out of memory); put
 * hands it back. With a device, blocks of 256 KiB and more are kept (up to
 * CT_DEVICE_TMP_KEEP, the largest) and reused by later calls instead of
 * being faulted in afresh (the smallest kept block that fits), while kept
 * and handed-out blocks together stay within the most that was ever
 * handed out at once; release frees the kept
 * ones (ct_device_close calls it). Thread-safe; d may be NULL (plain
 * allocation). Outside the memory plan and its accounting. */
void *ct_device_tmp_get(ct_device *d, size_t bytes);
/* The capacity of a block from ct_device_tmp_get (at least what was asked). */
size_t ct_device_tmp_capacity(const void *block);
void ct_device_tmp_put(ct_device *d, void *block);
void ct_device_tmp_release(ct_device *d);

#endif
