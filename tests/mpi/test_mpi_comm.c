/* The MPI communicator and the DDP pieces a command line cannot reach, on
 * 2 ranks (tests/mpi/run_mpi.sh starts them): sums of every dtype in
 * place, a reduce-scatter and an all-gather of uneven parts (ZeRO), the
 * settings comparison naming the field, the weight checksum catching a rank whose weights drifted
 * (--check-sync) and the state broadcast repairing it, and a collective
 * one rank joins late: the other's wait fails after the timeout naming it,
 * and a second wait then completes. */
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
  late(c, rank);
  ct_comm_close(c);
  return test_summary(rank ? "test_mpi_comm (rank 1)" : "test_mpi_comm");
}
