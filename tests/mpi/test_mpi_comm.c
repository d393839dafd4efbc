/* The MPI communicator and the DDP pieces a command line cannot reach, on
 * 2 ranks (tests/mpi/run_mpi.sh starts them): sums of every dtype in
 * place, a reduce-scatter and an all-gather of uneven parts (ZeRO), the
 * settings comparison naming the field, the weight checksum catching a rank whose weights drifted
 * (--check-sync) and the state broadcast repairing it, and a collective
 * one rank joins late: the other's wait fails after the timeout naming it,
 * and a second wait then completes; and ZeRO-2's release of the gradient
 * pages outside a rank's shard after one training step (mincore: none of
 * them resident, every page of the shard resident; under ZeRO-1 all
 * stay), with the step's weights the same on both ranks and equal to
 * ZeRO-1's bit for bit. */
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm.h"
#include "parallel/ddp.h"
#include "test_util.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sums(ct_comm *c, int rank) {
  float f[3] = {1.5f, (float)rank, -2.0f};
  double g[2] = {0.25, (double)rank * 10};
  int32_t i[2] = {rank + 1, -7};
  int64_t l[1] = {(int64_t)1 << 40};
  CHECK_OK(ct_comm_allreduce(c, f, 3, CT_F32, "f32 sum"));
  CHECK_OK(ct_comm_allreduce(c, g, 2, CT_F64, "f64 sum"));
  CHECK_OK(ct_comm_allreduce(c, i, 2, CT_I32, "i32 sum"));
  CHECK_OK(ct_comm_allreduce(c, l, 1, CT_I64, "i64 sum"));
  CHECK(f[0] == 3.0f && f[1] == 1.0f && f[2] == -4.0f);
  CHECK(g[0] == 0.5 && g[1] == 10.0);
  CHECK(i[0] == 3 && i[1] == -14);
  CHECK(l[0] == (int64_t)1 << 41);
  CHECK(ct_comm_allreduce(c, f, 1, CT_U8, "u8 sum") == CT_ERR_INVALID_ARG);
  char b[8] = "";
  if (rank == 0) memcpy(b, "rank0", 6);
  CHECK_OK(ct_comm_bcast(c, b, sizeof b, 0, "bcast"));
  CHECK(!strcmp(b, "rank0"));
}

/* Uneven parts: rank 0 owns 3 values, rank 1 owns 5. */
static void scatter_gather(ct_comm *c, int rank) {
  const size_t counts[2] = {3, 5};
  float b[8];
  for (int i = 0; i < 8; i++) b[i] = (float)(i + 1) * (rank ? 10.0f : 1.0f);
  int req;
  CHECK_OK(ct_comm_reduce_scatter_start(c, b, counts, CT_F32, "reduce-scatter", &req));
  CHECK_OK(ct_comm_wait(c, req));
  int lo = rank ? 3 : 0, hi = rank ? 8 : 3;
  for (int i = 0; i < 8; i++)
    CHECK_MSG(b[i] == (i >= lo && i < hi ? (float)(i + 1) * 11.0f : 0.0f), "rank %d: b[%d] = %g", rank, i, (double)b[i]);
  /* Each rank's part to all. */
  for (int i = 0; i < 8; i++)
    if (i < lo || i >= hi) b[i] = -1;
  CHECK_OK(ct_comm_allgatherv(c, b, counts, CT_F32, "all-gather"));
  for (int i = 0; i < 8; i++) CHECK_MSG(b[i] == (float)(i + 1) * 11.0f, "rank %d: gathered b[%d] = %g", rank, i, (double)b[i]);
}

static void fields(ct_comm *c, int rank) {
  ct_dist_field same[2] = {{"batch size", 16, 0}, {"model", 0xabc, 1}};
  CHECK_OK(ct_dist_check_same(c, same, 2));
  ct_dist_field diff[2] = {{"batch size", 16, 0}, {"seed", (uint64_t)rank, 0}};
  CHECK(ct_dist_check_same(c, diff, 2) == CT_ERR_INVALID_ARG);
  CHECK_MSG(strstr(ct_last_error(), "rank 1's seed is 1, rank 0's is 0") != NULL, "%s", ct_last_error());
}

static void weights(ct_comm *c, int rank) {
  ct_device *dev;
  ct_model *m;
  CHECK_OK(ct_device_open("cpu", &dev));
  ct_model_options mo = {0};
  mo.in_channels = 4, mo.height = 1, mo.width = 1, mo.num_classes = 3;
  CHECK_OK(ct_model_create("mlp", &mo, &m));
  CHECK_OK(ct_model_prepare(m, dev, 4, 1));
  ct_dist_config dc = {.comm = c, .bucket_mb = 0.0001, .first_bucket_mb = 0.0001};
  ct_ddp *d = NULL;
  CHECK_OK(ct_ddp_create(c, m, &dc, &d));
  CHECK(ct_ddp_bucket_count(d) >= 3); /* 0.1 KB buckets: one per parameter */
  CHECK_OK(ct_ddp_broadcast_state(d));
  CHECK_OK(ct_ddp_check_sync(d, 1));
  size_t n;
  float *p = ct_model_params(m, &n);
  if (rank == 1) p[n / 2] += 1e-6f;
  ct_status s = ct_ddp_check_sync(d, 7);
  CHECK(s == CT_ERR_INTERNAL);
  CHECK_MSG(strstr(ct_last_error(), "after step 7") && strstr(ct_last_error(), "no longer the same"), "%s",
            ct_last_error());
  CHECK_OK(ct_ddp_broadcast_state(d));
  CHECK_OK(ct_ddp_check_sync(d, 8));
  ct_ddp_destroy(d);
  ct_model_destroy(m);
  ct_device_close(dev);
}

/* Pages of [a, a + n floats) that are resident, and the whole pages in it. */
static void residency(const float *a, size_t n, size_t *resident, size_t *pages) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)a + page - 1) & ~(page - 1), hi = (uintptr_t)(a + n) & ~(page - 1);
  *resident = *pages = 0;
  if (hi <= lo) return;
  size_t np = (hi - lo) / page;
  unsigned char *v = malloc(np);
  CHECK(v && mincore((void *)lo, hi - lo, v) == 0);
  for (size_t i = 0; v && i < np; i++) *resident += v[i] & 1;
  *pages = np;
  free(v);
}

/* One DDP step of an 8.5M-parameter mlp under ZeRO stage `zero`; returns
 * the weights after it (malloc'd) and checks where the gradients live. */
static float *zero_step(ct_comm *c, int rank, int zero) {
  ct_device *dev;
  ct_model *m;
  CHECK_OK(ct_device_open("cpu", &dev));
  ct_model_options mo = {0};
  mo.in_channels = 64, mo.height = 16, mo.width = 16, mo.num_classes = 10;
  mo.seed = 5;
  CHECK_OK(ct_model_create("mlp", &mo, &m));
  CHECK_OK(ct_model_prepare(m, dev, 4, 1));
  ct_dist_config dc = {.comm = c, .bucket_mb = 4, .zero = zero};
  ct_ddp *d = NULL;
  CHECK_OK(ct_ddp_create(c, m, &dc, &d));
  CHECK_OK(ct_ddp_broadcast_state(d));
  size_t lo, hi, np;
  ct_ddp_shard(d, &lo, &hi);
  float *g = ct_model_grads(m, &np);
  ct_optim_config oc = ct_optim_config_default(CT_OPTIM_ADAM);
  ct_optimizer *opt;
  CHECK_OK(ct_optimizer_create(&oc, hi - lo, &opt));
  ct_step_config sc;
  ct_step_config_default(&sc);
  sc.shard_lo = lo, sc.shard_hi = hi;
  ct_step *s;
  CHECK_OK(ct_step_create(m, dev, opt, &sc, &s));
  ct_step_hooks h;
  ct_ddp_hooks(d, &h);
  ct_step_set_hooks(s, &h);
  static float x[4 * 64 * 16 * 16];
  static int64_t y[4];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)((i * 7 + (size_t)rank * 13) % 17) / 17.0f;
  for (int i = 0; i < 4; i++) y[i] = (i + rank) % 10;
  int64_t xs[4] = {4, 64, 16, 16}, ys[1] = {4};
  ct_batch b = {0};
  b.x = ct_tensor_view(x, CT_F32, 4, xs), b.y = ct_tensor_view(y, CT_I64, 1, ys), b.n = 4;
  ct_step_pos pos = ct_step_pos_single(1);
  pos.factor = 0.5f, pos.sample_offset = rank, pos.sample_stride = 2;
  ct_step_result r;
  int have = 0;
  CHECK_OK(ct_step_train(s, &b, &pos, &r, &have));
  CHECK_OK(ct_step_drain(s, &r, &have));
  CHECK_OK(ct_ddp_check_sync(d, 1));
  size_t res_own, pages_own, res_other = 0, pages_other = 0, rr, pp;
  residency(g + lo, hi - lo, &res_own, &pages_own);
  residency(g, lo, &rr, &pp), res_other += rr, pages_other += pp;
  residency(g + hi, np - hi, &rr, &pp), res_other += rr, pages_other += pp;
  ct_ddp_stats st;
  ct_ddp_get_stats(d, &st);
  CHECK(pages_own > 1000 && pages_other > 1000);
  CHECK_MSG(res_own == pages_own, "ZeRO-%d: %zu of the shard's %zu gradient pages resident", zero, res_own, pages_own);
  if (zero == 2) {
    CHECK_MSG(res_other == 0, "ZeRO-2: %zu of %zu gradient pages outside the shard still resident", res_other,
              pages_other);
    CHECK(st.released_bytes >= (double)pages_other * (double)sysconf(_SC_PAGESIZE));
  } else {
    CHECK_MSG(res_other == pages_other, "ZeRO-1: %zu of %zu pages resident", res_other, pages_other);
    CHECK(st.released_bytes == 0);
  }
  float *w = malloc(np * sizeof *w);
  CHECK(w != NULL);
  if (w) memcpy(w, ct_model_params(m, NULL), np * sizeof *w);
  ct_step_destroy(s);
  ct_optimizer_destroy(opt);
  ct_ddp_destroy(d);
  ct_model_destroy(m);
  ct_device_close(dev);
  return w;
}

static void zero2(ct_comm *c, int rank) {
  float *w1 = zero_step(c, rank, 1), *w2 = zero_step(c, rank, 2);
  size_t n = 0;
  ct_model *m;
  ct_model_options mo = {0};
  mo.in_channels = 64, mo.height = 16, mo.width = 16, mo.num_classes = 10;
  CHECK_OK(ct_model_create("mlp", &mo, &m));
  ct_model_params(m, &n);
  ct_model_destroy(m);
  CHECK_MSG(w1 && w2 && n && memcmp(w1, w2, n * sizeof *w1) == 0, "ZeRO-2's step differs from ZeRO-1's");
  free(w1);
  free(w2);
}

static void late(ct_comm *c, int rank) {
  double v = 1;
  if (rank == 1) {
    sleep(3);
    CHECK_OK(ct_comm_allreduce(c, &v, 1, CT_F64, "the late sum"));
    CHECK(v == 2);
    return;
  }
  ct_comm_set_timeout(c, 1.0);
  int req;
  CHECK_OK(ct_comm_allreduce_start(c, &v, 1, CT_F64, "the late sum", &req));
  double t0 = now_s();
  ct_status s = ct_comm_wait(c, req);
  double took = now_s() - t0;
  CHECK(s == CT_ERR_BACKEND);
  CHECK_MSG(strstr(ct_last_error(), "the late sum did not complete on rank 0 of 2 within 1 s") != NULL, "%s",
            ct_last_error());
  CHECK_MSG(took >= 1.0 && took < 2.5, "waited %.2f s", took);
  ct_comm_set_timeout(c, 60);
  CHECK_OK(ct_comm_wait(c, req));
  CHECK(v == 2);
}

int main(void) {
  if (!ct_comm_available()) {
    printf("skip: built without MPI\n");
    return 77;
  }
  ct_comm *c;
  CHECK_OK(ct_comm_open_mpi(&c));
  if (!c) return test_summary("test_mpi_comm");
  int rank = ct_comm_rank(c);
  if (ct_comm_size(c) != 2) {
    printf("skip: needs 2 ranks, got %d\n", ct_comm_size(c));
    ct_comm_close(c);
    return 77;
  }
  CHECK(ct_comm_local_size(c) == 2 && ct_comm_local_rank(c) == rank);
  sums(c, rank);
  scatter_gather(c, rank);
  fields(c, rank);
  weights(c, rank);
  zero2(c, rank);
  late(c, rank);
  ct_comm_close(c);
  return test_summary(rank ? "test_mpi_comm (rank 1)" : "test_mpi_comm");
}
