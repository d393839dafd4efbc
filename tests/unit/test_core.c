/* Core: Philox known answers, its block runs, the RNG helpers and bulk fills, f16/bf16 conversion (f16
 * against its definition over every half and a million floats, F16C and
 * the portable code alike),
 * device specs, per-device memory accounting, the worker thread of
 * virtual CPU devices, and the host temporaries a device keeps for reuse. */
#include <pthread.h>
#include <stdatomic.h>

#include "backend/backend_ops.h"
#include "backend/device_impl.h"
#include "core/half_portable.h"
#include "test_util.h"

static void test_philox(void) {
  /* Known-answer vectors of Philox4x32-10 from the Random123 distribution
   * (kat_vectors: counter, key -> output). */
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
       0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
       0x24126ea1}};
  for (int k = 0; k < 3; k++) {
    uint32_t out[4];
    ct_philox4x32(&kat[k][4], &kat[k][0], out);
    for (int i = 0; i < 4; i++) CHECK_MSG(out[i] == kat[k][6 + i], "vector %d word %d: %08x", k, i, out[i]);
  }
  /* The stream helpers: uniform in [0,1), the random-access form equals
   * the sequential one, streams differ. */
  ct_rng r;
  ct_rng_init(&r, 42, CT_RNG_DROPOUT, 3, 7);
  double sum = 0;
  for (int i = 0; i < 4000; i++) {
    float u = ct_rng_uniform(&r);
    CHECK(u >= 0.0f && u < 1.0f);
    CHECK(u == ct_rng_uniform_at(42, CT_RNG_DROPOUT, 3, 7, (uint64_t)i));
    sum += u;
  }
  CHECK(fabs(sum / 4000 - 0.5) < 0.02);
  CHECK(ct_rng_uniform_at(42, CT_RNG_DROPOUT, 3, 7, 5) != ct_rng_uniform_at(42, CT_RNG_DROPOUT, 4, 7, 5));
  int hits[7] = {0};
  for (int i = 0; i < 7000; i++) hits[ct_rng_below(&r, 7)]++;
  for (int i = 0; i < 7; i++) CHECK(hits[i] > 850 && hits[i] < 1150);
  double m = 0, v = 0;
  for (int i = 0; i < 20000; i++) {
    double z = ct_rng_normal(&r);
    m += z, v += z * z;
  }
  CHECK(fabs(m / 20000) < 0.03 && fabs(v / 20000 - 1) < 0.05);
}

/* ct_philox4x32_blocks gives ct_philox4x32's words block by block:
 * counts around the eight-block vector groups, and a first counter word
 * that wraps past 2^32 inside the run (in the vector lanes and the
 * scalar tail alike). */
static void test_philox_blocks(void) {
  static const int nbs[] = {0, 1, 7, 8, 9, 16, 23, 256};
  static const uint32_t c0s[] = {0, 12345, 0xfffffffcu, 0xfffffff0u};
  const uint32_t key[2] = {0x9abcdef0u, 0x12345678u};
  uint32_t got[4 * 256], want[4];
  for (size_t a = 0; a < sizeof c0s / sizeof *c0s; a++)
    for (size_t b = 0; b < sizeof nbs / sizeof *nbs; b++) {
      const int nb = nbs[b];
      ct_philox4x32_blocks(key, c0s[a], CT_RNG_DROPOUT, 3, 7, nb, got);
      int bad = 0;
      for (int j = 0; j < nb; j++) {
        const uint32_t ctr[4] = {c0s[a] + (uint32_t)j, CT_RNG_DROPOUT, 3, 7};
        ct_philox4x32(key, ctr, want);
        bad += memcmp(want, got + 4 * j, sizeof want) != 0;
      }
      CHECK_MSG(bad == 0, "blocks from %08x, %d of them: %d differ from ct_philox4x32", c0s[a], nb, bad);
    }
}

/* The bulk fills give a fresh generator's values bit for bit: sizes
 * around the 8-block vector groups and the 1024-block tasks, and past the
 * OpenMP thresholds (several threads when OMP_NUM_THREADS allows). */
static void test_rng_fill(void) {
  static const int64_t ns[] = {0, 1, 2, 3, 5, 31, 32, 33, 2047, 2049, 4095, 4097, 70001, 300007};
  float *got = malloc(300007 * sizeof *got);
  for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
    const int64_t n = ns[k];
    const uint64_t seed = 0x123456789abcull + (uint64_t)k;
    int64_t bad_u = 0, bad_n = 0;
    ct_rng r;
    ct_rng_fill_uniform(got, n, seed, CT_RNG_INIT, (uint32_t)k, 9);
    ct_rng_init(&r, seed, CT_RNG_INIT, (uint32_t)k, 9);
    for (int64_t i = 0; i < n; i++) bad_u += got[i] != ct_rng_uniform(&r);
    ct_rng_fill_normal(got, n, 0.37, seed, CT_RNG_INIT, (uint32_t)k, 9);
    ct_rng_init(&r, seed, CT_RNG_INIT, (uint32_t)k, 9);
    for (int64_t i = 0; i < n; i++) bad_n += got[i] != (float)(ct_rng_normal(&r) * 0.37);
    CHECK_MSG(bad_u == 0 && bad_n == 0, "fill of %lld: %lld uniform and %lld normal values differ from the generator's",
              (long long)n, (long long)bad_u, (long long)bad_n);
  }
  free(got);
}

static void test_half(void) {
  /* bf16: round to nearest even on the dropped 16 bits. */
  CHECK(ct_f32_to_bf16(1.0f) == 0x3f80);
  float f;
  uint32_t u = 0x3f808000; /* exactly halfway between 0x3f80 and 0x3f81: even wins */
  memcpy(&f, &u, 4);
  CHECK(ct_f32_to_bf16(f) == 0x3f80);
  u = 0x3f818000; /* halfway between 0x3f81 and 0x3f82 */
  memcpy(&f, &u, 4);
  CHECK(ct_f32_to_bf16(f) == 0x3f82);
  CHECK(ct_f32_to_bf16(INFINITY) == 0x7f80 && isnan(ct_bf16_to_f32(ct_f32_to_bf16(NAN))));
  /* f16: exact values, overflow to inf, subnormals, rounding. */
  CHECK(ct_f32_to_f16(1.0f) == 0x3c00 && ct_f32_to_f16(-2.0f) == 0xc000);
  CHECK(ct_f32_to_f16(65504.0f) == 0x7bff && ct_f32_to_f16(65520.0f) == 0x7c00);
  CHECK(ct_f16_to_f32(0x0001) == 5.9604644775390625e-08f);
  CHECK(ct_f32_to_f16(5.9604644775390625e-08f) == 0x0001);
  CHECK(ct_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* halfway: even */
  CHECK(isnan(ct_f16_to_f32(ct_f32_to_f16(NAN))));
  for (uint32_t h = 0; h < 0x7c00; h++) /* every finite positive f16 round-trips */
    if (ct_f32_to_f16(ct_f16_to_f32((uint16_t)h)) != h) {
      CHECK_MSG(0, "f16 %04x does not round-trip", h);
      break;
    }
  ct_dtype t;
  CHECK(ct_dtype_parse("bfloat16", &t) == 0 && t == CT_BF16);
  CHECK(ct_dtype_parse("float8", &t) != 0);
}

/* The f16 value of bits h, from its definition. */
static double f16_value(uint32_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -v : v;
}

/* x rounded to the nearest f16 value, ties to even, from its definition:
 * the representable values near |x| are multiples of 2^(e-10), e the
 * exponent of |x| (at least -14: the subnormals share 2^-24). */
static double f16_round(double x) {
  double a = fabs(x);
  if (isnan(x)) return x;
  if (a >= 65520.0) return x < 0 ? -INFINITY : INFINITY;
  int e = a > 0 ? ilogb(a) : -14;
  if (e < -14) e = -14;
  double r = ldexp(nearbyint(ldexp(a, 10 - e)), e - 10);
  return x < 0 ? -r : r;
}

/* n floats through ct_convert to f16 and one at a time: both must be the
 * nearest f16 (a NaN stays a NaN of the same sign). */
static int check_to_f16(const float *src, int n, uint16_t *h) {
  int bad = 0;
  ct_convert(src, CT_F32, h, CT_F16, (size_t)n);
  for (int i = 0; i < n && bad < 5; i++) {
    double want = f16_round(src[i]), got = f16_value(h[i]);
    uint16_t one = ct_f32_to_f16(src[i]), port = ct_f32_to_f16_portable(src[i]);
    /* the portable code and F16C differ only in a NaN's payload */
    int same = isnan(src[i]) ? isnan(f16_value(port)) && (port & 0x8000) == (one & 0x8000) : port == one;
    int ok = one == h[i] && same && (isnan(want) ? isnan(got) : got == want) && !!(h[i] & 0x8000) == !!signbit(src[i]);
    if (!ok) {
      bad++;
      CHECK_MSG(0, "f32 %a -> f16 %04x (one at a time %04x, portable %04x), expected %.9g", src[i], h[i], one, port,
                want);
    }
  }
  return bad;
}

/* f16 conversion against its definition, one value at a time and through
 * ct_convert's vector loops: all 65536 halves; f32 bit patterns in a
 * stride that visits every exponent and sign (2^32 / 4099, about a
 * million); and the edges (ties to even, the overflow threshold, half the
 * smallest subnormal, signed zero, inf, NaN). */
static void test_half_exhaustive(void) {
  enum { NH = 65536, STRIDE = 4099 };
  uint16_t *h = malloc(NH * sizeof *h);
  float *f = malloc(NH * sizeof *f);
  for (uint32_t i = 0; i < NH; i++) h[i] = (uint16_t)i;
  ct_convert(h, CT_F16, f, CT_F32, NH);
  int bad = 0;
  for (uint32_t i = 0; i < NH && bad < 5; i++) {
    double want = f16_value(i);
    float one = ct_f16_to_f32(h[i]), port = ct_f16_to_f32_portable(h[i]);
    int ok = (isnan(want) ? isnan(f[i]) && isnan(one) && isnan(port) : f[i] == want && one == want && port == want) &&
             !!signbit(f[i]) == !!(i & 0x8000) && !!signbit(one) == !!(i & 0x8000) &&
             !!signbit(port) == !!(i & 0x8000);
    if (!ok) {
      bad++;
      CHECK_MSG(0, "f16 %04x -> %.9g (one at a time %.9g, portable %.9g), expected %.9g", i, f[i], one, port, want);
    }
  }
  static const float edges[] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65504.0f, 65519.99f, -65520.0f,
                                0x1p-14f, 0x1.ff8p-15f, 0x1p-25f, 0x1.8p-25f, -0x1p-26f, -0.0f, 0.0f,
                                INFINITY, -INFINITY, NAN, -NAN, 1e-30f, -3e38f};
  bad += check_to_f16(edges, (int)(sizeof edges / sizeof *edges), h);
  for (uint64_t bits = 0; bits < (1ull << 32) && !bad;) {
    int n = 0;
    for (; n < NH && bits < (1ull << 32); n++, bits += STRIDE) {
      uint32_t u = (uint32_t)bits;
      memcpy(&f[n], &u, 4);
    }
    bad += check_to_f16(f, n, h);
  }
  CHECK(bad == 0);
  free(f), free(h);
}

static _Atomic int order_ok = 1, counter = 0;
static pthread_t main_thread;
static _Atomic int ran_elsewhere = 0;
static void task(void *arg) {
  int want = (int)(intptr_t)arg;
  if (atomic_fetch_add(&counter, 1) != want) order_ok = 0;
  if (!pthread_equal(pthread_self(), main_thread)) ran_elsewhere = 1;
}

static void test_devices(void) {
  ct_device *a = NULL, *b = NULL, *bad = NULL;
  CHECK_OK(ct_device_open("cpu:0", &a));
  CHECK_OK(ct_device_open("cpu:1", &b));
  if (!a || !b) return;
  CHECK(!strcmp(ct_device_name(b), "cpu:1") && ct_device_index(b) == 1);
  /* Every host table keeps backend_ops.h's rules (cuda: test_gpu_device). */
  ct_device *cpu = NULL, *ref = NULL;
  CHECK_OK(ct_device_open("cpu", &cpu));
  CHECK_OK(ct_device_open("ref", &ref));
  ct_device *hosts[4] = {a, b, cpu, ref};
  for (int i = 0; i < 4; i++)
    if (hosts[i]) CHECK_MSG(ct_backend_check(hosts[i]->backend) == CT_OK, "%s", ct_last_error());
  ct_device_close(cpu);
  ct_device_close(ref);
  /* Memory accounting is per device. */
  void *p = ct_device_alloc(a, 1 << 20), *q = ct_device_alloc(b, 4096);
  CHECK(p && q && ((uintptr_t)p % 64) == 0);
  CHECK(ct_device_mem_in_use(a) == 1 << 20 && ct_device_mem_in_use(b) == 4096);
  ct_device_free(a, p);
  CHECK(ct_device_mem_in_use(a) == 0 && ct_device_mem_peak(a) == 1 << 20);
  ct_device_free(b, q);
  /* Work submitted to a virtual device runs on its own thread, in order. */
  main_thread = pthread_self();
  for (int i = 0; i < 100; i++) CHECK_OK(ct_device_submit(b, task, (void *)(intptr_t)i));
  CHECK_OK(ct_device_sync(b));
  CHECK(counter == 100 && order_ok && ran_elsewhere);
  ct_device_close(a);
  ct_device_close(b);
  /* Bad specs are errors with a message, never a crash. */
  const char *specs[] = {"gpu", "cpu:x", "cpu:-1", "cpu:99999", "", "cpux"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    ct_status s = ct_device_open(specs[i], &bad);
    CHECK_MSG(s == CT_ERR_INVALID_ARG && bad == NULL && strlen(ct_last_error()) > 0, "'%s' -> %s", specs[i],
              ct_status_name(s));
  }
  /* Without a GPU (or CUDA build) "cuda" is CT_ERR_NO_DEVICE with a reason. */
  ct_status s = ct_device_open("cuda", &bad);
  if (s == CT_OK) {
    ct_device_close(bad);
  } else {
    CHECK_MSG(s == CT_ERR_NO_DEVICE && strlen(ct_last_error()) > 0, "cuda -> %s: %s", ct_status_name(s), ct_last_error());
  }
}

/* ct_device_tmp_get / put (device_tmp.c): large blocks come back to the
 * next call that fits (the smallest that does), small ones and the
 * deviceless path are plain allocations, at most CT_DEVICE_TMP_KEEP are
 * kept (the largest), kept and handed-out bytes together never exceed the
 * most ever handed out at once (a failed allocation changes nothing), and
 * release empties the device. */
static void test_device_tmp(void) {
  ct_device *d = NULL;
  CHECK_OK(ct_device_open("cpu", &d));
  if (!d) return;
  const size_t MB = (size_t)1 << 20;
  unsigned char *a = ct_device_tmp_get(d, 3 * MB), *b = ct_device_tmp_get(d, 1 * MB);
  CHECK(a && b && a != b && (uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0);
  memset(a, 1, 3 * MB);
  memset(b, 2, 1 * MB);
  ct_device_tmp_put(d, a);
  ct_device_tmp_put(d, b);
  CHECK(d->tmp_n == 2 && d->tmp_peak == 4 * MB && d->tmp_live == 0 && d->tmp_kept_bytes == 4 * MB);
  CHECK(ct_device_tmp_get(d, MB / 2) == b); /* the smallest that fits */
  CHECK(ct_device_tmp_get(d, 2 * MB) == a);
  CHECK(d->tmp_n == 0 && d->tmp_live == 4 * MB);
  void *small = ct_device_tmp_get(d, 1000); /* below the kept size: not counted */
  CHECK(small != NULL && d->tmp_live == 4 * MB);
  ct_device_tmp_put(d, small);
  ct_device_tmp_put(d, a);
  ct_device_tmp_put(d, b);
  /* 5 MB fits no kept block and would take the total past the 4 MB peak
   * with both kept: the smallest goes first (b, 1 MB, still too much),
   * then a; the peak becomes 5 MB. */
  unsigned char *c = ct_device_tmp_get(d, 5 * MB);
  CHECK(c && d->tmp_n == 0 && d->tmp_peak == 5 * MB && d->tmp_kept_bytes == 0);
  memset(c, 3, 5 * MB);
  ct_device_tmp_put(d, c);
  ct_device_tmp_release(d);
  CHECK(d->tmp_n == 0 && d->tmp_kept_bytes == 0);
  /* KEEP + 1 blocks in use at once (1..KEEP+1 MB), then all back: the
   * smallest gives way. */
  void *many[CT_DEVICE_TMP_KEEP + 1];
  for (int i = 0; i <= CT_DEVICE_TMP_KEEP; i++) many[i] = ct_device_tmp_get(d, (size_t)(i + 1) * MB);
  CHECK(d->tmp_kept_bytes + d->tmp_live <= d->tmp_peak);
  for (int i = 0; i <= CT_DEVICE_TMP_KEEP; i++) ct_device_tmp_put(d, many[i]);
  CHECK(d->tmp_n == CT_DEVICE_TMP_KEEP && d->tmp_live == 0 && d->tmp_kept_bytes + d->tmp_live <= d->tmp_peak);
  size_t smallest = (size_t)-1;
  for (int i = 0; i < d->tmp_n; i++)
    if (ct_device_tmp_capacity(d->tmp_kept[i]) < smallest) smallest = ct_device_tmp_capacity(d->tmp_kept[i]);
  CHECK(smallest == 2 * MB);
  /* A larger kept block serves a small request, counted at its size:
   * the total stays within the peak. */
  ct_device_tmp_release(d);
  void *big = ct_device_tmp_get(d, 8 * MB);
  ct_device_tmp_put(d, big);
  void *quarter = ct_device_tmp_get(d, 2 * MB);
  CHECK(quarter == big && d->tmp_live == 8 * MB && d->tmp_n == 0);
  ct_device_tmp_put(d, quarter);
  /* A failed allocation changes nothing; sizes that overflow fail. */
  size_t peak = d->tmp_peak, kept = d->tmp_kept_bytes;
  CHECK(ct_device_tmp_get(d, (size_t)1 << 62) == NULL);
  CHECK(d->tmp_peak == peak && d->tmp_kept_bytes == kept && d->tmp_live == 0);
  CHECK(ct_device_tmp_get(NULL, SIZE_MAX - 10) == NULL && ct_device_tmp_get(d, SIZE_MAX - 10) == NULL);
  void *h = ct_device_tmp_get(NULL, 4 * MB); /* no device: plain allocation */
  CHECK(h != NULL);
  ct_device_tmp_put(NULL, h);
  ct_device_tmp_put(d, ct_device_tmp_get(d, 2 * MB)); /* kept until close */
  ct_device_close(d);
}

int main(void) {
  test_philox();
  test_philox_blocks();
  test_rng_fill();
  test_half();
  test_half_exhaustive();
  test_devices();
  test_device_tmp();
  return test_summary("test_core");
}
