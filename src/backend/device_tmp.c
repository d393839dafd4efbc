/* Host temporaries kept by a device between calls (device_impl.h).
 *
 * Why: the widening path of 16-bit ops (ref_half.c) needs whole-tensor f32
 * copies on every call. Large ones come from glibc as fresh mmap()s, so
 * each call paid a page fault and a kernel page clear per 4 KiB, which
 * made bf16 layers far slower than f32 ones. A device therefore keeps up to
 * CT_DEVICE_TMP_KEEP freed blocks of at least TMP_MIN_KEEP bytes and hands
 * out the smallest one that fits; smaller blocks go back to malloc, which
 * reuses them anyway.
 *
 * Bound: the kept blocks plus those handed out never exceed the most that
 * was handed out at once (tmp_peak, over all calls in flight on the
 * device, counting blocks at their size, which best fit can make larger
 * than asked). A request no kept block serves frees kept blocks, smallest
 * first, until it fits under that peak (after its own allocation
 * succeeded, so a failed one changes nothing). The peak grows only by
 * fresh allocations. A rule that a block serve only requests of at least
 * half its size was tried and dropped: AlexNet bf16 steps then kept
 * evicting the block of the 9216x4096 weight to make room for the
 * convolutions' smaller ones and faulted it in again every step. Kept
 * blocks are host memory outside the memory plan (not in
 * ct_device_mem_in_use), held until the device closes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device_impl.h"

#define TMP_MIN_KEEP ((size_t)256 << 10)

/* Each block has a 64-byte header holding its capacity. */
static void *block_new(size_t cap) {
  unsigned char *p = aligned_alloc(64, 64 + cap);
  if (!p) return NULL;
  memcpy(p, &cap, sizeof cap);
  return p + 64;
}

static size_t block_cap(const void *b) {
  size_t cap;
  memcpy(&cap, (const unsigned char *)b - 64, sizeof cap);
  return cap;
}

static void block_free(void *b) {
  if (b) free((unsigned char *)b - 64);
}

/* Index of the smallest kept block that holds cap bytes (any size when
 * cap is 0), or -1. Under tmp_mu. */
static int smallest_kept(const ct_device *d, size_t cap) {
  int best = -1;
  for (int i = 0; i < d->tmp_n; i++) {
    size_t c = block_cap(d->tmp_kept[i]);
    if (c >= cap && (best < 0 || c < block_cap(d->tmp_kept[best]))) best = i;
  }
  return best;
}

/* Takes kept block i out of the list; returns it. Under tmp_mu. */
static void *unkeep(ct_device *d, int i) {
  void *b = d->tmp_kept[i];
  d->tmp_kept[i] = d->tmp_kept[--d->tmp_n];
  d->tmp_kept_bytes -= block_cap(b);
  return b;
}

void *ct_device_tmp_get(ct_device *d, size_t bytes) {
  if (bytes > SIZE_MAX - 128) return NULL;
  size_t cap = (bytes + 63) / 64 * 64;
  if (cap == 0) cap = 64;
  if (!d || cap < TMP_MIN_KEEP) return block_new(cap);
  pthread_mutex_lock(&d->tmp_mu);
  int i = smallest_kept(d, cap);
  void *b = NULL;
  if (i >= 0) {
    b = unkeep(d, i);
    d->tmp_live += block_cap(b);
  }
  pthread_mutex_unlock(&d->tmp_mu);
  if (b) return b;
  b = block_new(cap);
  if (!b) return NULL;
  void *gone[CT_DEVICE_TMP_KEEP];
  int n_gone = 0;
  pthread_mutex_lock(&d->tmp_mu);
  d->tmp_live += cap;
  if (d->tmp_live > d->tmp_peak) d->tmp_peak = d->tmp_live;
  while (d->tmp_n > 0 && d->tmp_kept_bytes + d->tmp_live > d->tmp_peak) gone[n_gone++] = unkeep(d, smallest_kept(d, 0));
  pthread_mutex_unlock(&d->tmp_mu);
  for (int k = 0; k < n_gone; k++) block_free(gone[k]);
  return b;
}

size_t ct_device_tmp_capacity(const void *b) { return block_cap(b); }

void ct_device_tmp_put(ct_device *d, void *b) {
  if (!b) return;
  size_t cap = block_cap(b);
  if (!d || cap < TMP_MIN_KEEP) {
    block_free(b);
    return;
  }
  pthread_mutex_lock(&d->tmp_mu);
  d->tmp_live -= cap;
  if (d->tmp_n == CT_DEVICE_TMP_KEEP) {
    /* Full: the smallest of the kept blocks and b gives way. */
    int s = smallest_kept(d, 0);
    if (block_cap(d->tmp_kept[s]) < cap) {
      void *out = unkeep(d, s);
      d->tmp_kept[d->tmp_n++] = b;
      d->tmp_kept_bytes += cap;
      b = out;
    }
  } else {
    d->tmp_kept[d->tmp_n++] = b;
    d->tmp_kept_bytes += cap;
    b = NULL;
  }
  pthread_mutex_unlock(&d->tmp_mu);
  block_free(b);
}

void ct_device_tmp_release(ct_device *d) {
  pthread_mutex_lock(&d->tmp_mu);
  while (d->tmp_n > 0) block_free(unkeep(d, d->tmp_n - 1));
  pthread_mutex_unlock(&d->tmp_mu);
}
