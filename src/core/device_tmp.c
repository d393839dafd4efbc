/* Host temporaries kept by a device between calls (device_impl.h).
 *
 * Why: the widening path of 16-bit ops (ref_half.c) needs whole-tensor f32
 * copies on every call. Large ones come from glibc as fresh mmap()s, so
 * each call paid a page fault and a kernel page clear per 4 KiB: on the
 * AVX2 machine AlexNet's first linear layer took 94 ms forward in bf16
 * against 37 in f32, and a bf16 training step ran at 26-30 img/s against
 * 33-34 with the blocks reused. A device therefore keeps up to
 * CT_DEVICE_TMP_KEEP freed blocks of at least TMP_MIN_KEEP bytes and hands
 * out the smallest one that fits; smaller blocks go back to malloc, which
 * reuses them anyway. Kept blocks are host memory outside the memory plan
 * (not in ct_device_mem_in_use), held until the device closes. */
#include <stdlib.h>
#include <string.h>

#include "core/device_impl.h"

#define TMP_MIN_KEEP ((size_t)256 << 10)

/* Each block has a 64-byte header holding its capacity. */
static void *block_new(size_t cap) {
  unsigned char *p = aligned_alloc(64, 64 + cap);
  if (!p) return NULL;
  memcpy(p, &cap, sizeof cap);
  return p + 64;
}

static size_t block_cap(void *b) {
  size_t cap;
  memcpy(&cap, (unsigned char *)b - 64, sizeof cap);
  return cap;
}

static void block_free(void *b) {
  if (b) free((unsigned char *)b - 64);
}

void *ct_device_tmp_get(ct_device *d, size_t bytes) {
  size_t cap = (bytes + 63) / 64 * 64;
  if (cap == 0) cap = 64;
  if (d && cap >= TMP_MIN_KEEP) {
    pthread_mutex_lock(&d->tmp_mu);
    int best = -1;
    for (int i = 0; i < d->tmp_n; i++)
      if (block_cap(d->tmp_kept[i]) >= cap && (best < 0 || block_cap(d->tmp_kept[i]) < block_cap(d->tmp_kept[best])))
        best = i;
    void *b = NULL;
    if (best >= 0) {
      b = d->tmp_kept[best];
      d->tmp_kept[best] = d->tmp_kept[--d->tmp_n];
    }
    pthread_mutex_unlock(&d->tmp_mu);
    if (b) return b;
  }
  return block_new(cap);
}

void ct_device_tmp_put(ct_device *d, void *b) {
  if (!b) return;
  if (!d || block_cap(b) < TMP_MIN_KEEP) {
    block_free(b);
    return;
  }
  pthread_mutex_lock(&d->tmp_mu);
  if (d->tmp_n == CT_DEVICE_TMP_KEEP) {
    /* Full: the smallest of the kept blocks and b gives way. */
    int small = 0;
    for (int i = 1; i < d->tmp_n; i++)
      if (block_cap(d->tmp_kept[i]) < block_cap(d->tmp_kept[small])) small = i;
    if (block_cap(d->tmp_kept[small]) < block_cap(b)) {
      void *out = d->tmp_kept[small];
      d->tmp_kept[small] = b;
      b = out;
    }
  } else {
    d->tmp_kept[d->tmp_n++] = b;
    b = NULL;
  }
  pthread_mutex_unlock(&d->tmp_mu);
  block_free(b);
}

void ct_device_tmp_release(ct_device *d) {
  pthread_mutex_lock(&d->tmp_mu);
  for (int i = 0; i < d->tmp_n; i++) block_free(d->tmp_kept[i]);
  d->tmp_n = 0;
  pthread_mutex_unlock(&d->tmp_mu);
}
