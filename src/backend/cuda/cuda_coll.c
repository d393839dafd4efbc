/* Collectives between devices over NCCL (backend_ops.def's coll_*
 * entries): a rank per device, in processes of their own (DDP) or as
 * threads of one process (DataParallel: each thread joins with its
 * device's rank, as NCCL allows).
 *
 * NCCL is loaded when a device first joins a communicator, as cuBLASLt is
 * (cuda_dl.h): only processes that train over several GPUs pay for it.
 * Built with CTRAIN_CUDA_NCCL_LINKED (the CUDA emulator, which links an
 * NCCL of its own over MPI) the table points at the linked functions.
 *
 * Each collective runs on the device's collective stream after an event
 * recorded on the compute stream, so a gradient bucket's all-reduce starts
 * as soon as the kernels that wrote it are done and overlaps the rest of
 * the backward. A fence makes the compute stream wait for all of them
 * before the update. The host never waits for a collective except in
 * coll_wait, with a deadline: a peer that died or hangs turns into an
 * error there instead of a stream that never drains. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_impl.h"

#ifndef CTRAIN_HAVE_NCCL

void cuda_coll_close(ct_device *d) { (void)d; }

#else

#include <nccl.h>
#include <pthread.h>

#include "backend/cuda/cuda_dl.h"

_Static_assert(sizeof(ncclUniqueId) == CT_COLL_ID_BYTES, "CT_COLL_ID_BYTES is NCCL's unique id size");

#define NCCL_FUNCS(X)                                                                                      \
  X(GetUniqueId) X(CommInitRank) X(AllReduce) X(Broadcast) X(Reduce) X(GroupStart) X(GroupEnd) X(CommAbort) \
  X(CommDestroy) X(CommGetAsyncError) X(GetErrorString)

static struct {
#define NCCL_FIELD(name) __typeof__(&nccl##name) name;
  NCCL_FUNCS(NCCL_FIELD)
#undef NCCL_FIELD
} nccl;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static ct_status nccl_status;
static char nccl_why[1024];

static void nccl_load_once(void) {
#ifdef CTRAIN_CUDA_NCCL_LINKED
#define NCCL_LINK(name) nccl.name = nccl##name;
  NCCL_FUNCS(NCCL_LINK)
#undef NCCL_LINK
  nccl_status = CT_OK;
#else
  const char *forced = getenv("CTRAIN_NCCL_PATH");
  const char *tried[1] = {forced && forced[0] ? forced : "libnccl.so.2"};
#define NCCL_NAME(name) #name,
  static const char *const names[] = {NCCL_FUNCS(NCCL_NAME)};
#undef NCCL_NAME
  cuda_dl_spec spec = {"NCCL", "CTRAIN_NCCL_PATH", "install NCCL (libnccl2) and add its lib directory to LD_LIBRARY_PATH",
                       "nccl", tried, 1, forced && forced[0], names, (int)(sizeof names / sizeof names[0])};
  nccl_status = cuda_dl_load(&spec, (void **)&nccl, nccl_why, sizeof nccl_why);
#endif
}

static ct_status nccl_load(void) {
  pthread_once(&nccl_once, nccl_load_once);
  return nccl_status == CT_OK ? CT_OK : ct_error(nccl_status, "%s", nccl_why);
}

#define NCCL_TRY(call)                                                                                          \
  do {                                                                                                          \
    ncclResult_t nccl_e_ = (call);                                                                              \
    if (nccl_e_ != ncclSuccess)                                                                                 \
      return ct_error(CT_ERR_BACKEND, "%s:%d: %s: %s", __FILE__, __LINE__, #call, nccl.GetErrorString(nccl_e_)); \
  } while (0)

typedef struct cuda_coll {
  ncclComm_t comm;
  int size, rank; /* ranks, and this one's */
  cudaStream_t stream;
  cudaEvent_t ready;    /* the compute stream's point a collective waits for */
  cudaEvent_t fence[2]; /* the last two fences, alternating */
  cudaEvent_t join;     /* a fence inside a stream capture */
  cudaEvent_t point[CT_COLL_POINTS]; /* coll_record's points */
  int64_t fences;       /* fences recorded */
} cuda_coll;

ct_status cuda_coll_new_id(ct_device *d, void *id) {
  (void)d;
  CT_TRY(nccl_load());
  NCCL_TRY(nccl.GetUniqueId((ncclUniqueId *)id));
  return CT_OK;
}

ct_status cuda_coll_open(ct_device *d, const void *id, int rank, int size) {
  cuda_dev *cd = cuda_dev_of(d);
  if (cd->coll) return ct_error(CT_ERR_INVALID_ARG, "%s: already joined a communicator", d->name);
  CT_TRY(nccl_load());
  CT_TRY(cuda_enter(d));
  cuda_coll *c = calloc(1, sizeof *c);
  if (!c) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of host memory", d->name);
  cd->coll = c;
  CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  CUDA_TRY(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
  for (int k = 0; k < 2; k++) CUDA_TRY(cudaEventCreateWithFlags(&c->fence[k], cudaEventDisableTiming));
  CUDA_TRY(cudaEventCreateWithFlags(&c->join, cudaEventDisableTiming));
  for (int k = 0; k < CT_COLL_POINTS; k++) CUDA_TRY(cudaEventCreateWithFlags(&c->point[k], cudaEventDisableTiming));
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  NCCL_TRY(nccl.CommInitRank(&c->comm, size, u, rank));
  c->size = size, c->rank = rank;
  return CT_OK;
}

/* The collective stream waits for the compute stream's work so far. */
static ct_status after_compute(ct_device *d, cuda_coll **out) {
  cuda_dev *cd = cuda_dev_of(d);
  cuda_coll *c = cd->coll;
  if (!c || !c->comm) return ct_error(CT_ERR_INVALID_ARG, "%s: no communicator (coll_open) or it was aborted", d->name);
  CT_TRY(cuda_enter(d));
  CUDA_TRY(cudaEventRecord(c->ready, cd->stream));
  CUDA_TRY(cudaStreamWaitEvent(c->stream, c->ready, 0));
  *out = c;
  return CT_OK;
}

ct_status cuda_coll_allreduce(ct_device *d, void *buf, size_t count, ct_dtype dt) {
  ncclDataType_t t = dt == CT_F32 ? ncclFloat32 : dt == CT_F64 ? ncclFloat64 : dt == CT_I32 ? ncclInt32 : ncclNumTypes;
  if (t == ncclNumTypes)
    return ct_error(CT_ERR_UNSUPPORTED, "%s: all-reduce of %s values (f32, f64 or i32)", d->name, ct_dtype_name(dt));
  cuda_coll *c = NULL;
  CT_TRY(after_compute(d, &c));
  NCCL_TRY(nccl.AllReduce(buf, buf, count, t, ncclSum, c->comm, c->stream));
  return CT_OK;
}

/* One call per rank's part, grouped so NCCL runs them as one operation:
 * reduce (scatter) part r to rank r (into mine on this rank, when given),
 * or broadcast (gather) it from there. NCCL's own reduce-scatter and
 * all-gather take equal parts only. */
static ct_status parts(ct_device *d, float *buf, float *mine, const size_t *counts, int gather) {
  cuda_coll *c = NULL;
  CT_TRY(after_compute(d, &c));
  NCCL_TRY(nccl.GroupStart());
  ncclResult_t e = ncclSuccess;
  int nranks = c->size, me = c->rank;
  for (int r = 0; r < nranks && e == ncclSuccess; buf += counts[r], r++) {
    if (!counts[r]) continue;
    float *to = r == me && mine ? mine : buf;
    e = gather ? nccl.Broadcast(buf, buf, counts[r], ncclFloat32, r, c->comm, c->stream)
               : nccl.Reduce(buf, to, counts[r], ncclFloat32, ncclSum, r, c->comm, c->stream);
  }
  ncclResult_t g = nccl.GroupEnd();
  NCCL_TRY(e != ncclSuccess ? e : g);
  return CT_OK;
}

ct_status cuda_coll_reduce_scatter(ct_device *d, float *buf, float *mine, const size_t *counts) {
  return parts(d, buf, mine, counts, 0);
}

ct_status cuda_coll_allgather(ct_device *d, float *buf, const size_t *counts) { return parts(d, buf, NULL, counts, 1); }

ct_status cuda_coll_bcast(ct_device *d, void *buf, size_t bytes, int root) {
  cuda_coll *c = NULL;
  CT_TRY(after_compute(d, &c));
  NCCL_TRY(nccl.Broadcast(buf, buf, bytes, ncclUint8, root, c->comm, c->stream));
  return CT_OK;
}

/* Whether the compute stream is capturing a graph. */
static int capturing(cuda_dev *cd) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(cd->stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone;
}

ct_status cuda_coll_fence(ct_device *d) {
  cuda_dev *cd = cuda_dev_of(d);
  cuda_coll *c = cd->coll;
  if (!c) return ct_error(CT_ERR_INVALID_ARG, "%s: no communicator (coll_open)", d->name);
  CT_TRY(cuda_enter(d));
  int cap = capturing(cd);
  cudaEvent_t e = cap ? c->join : c->fence[c->fences % 2];
  CUDA_TRY(cudaEventRecord(e, c->stream));
  CUDA_TRY(cudaStreamWaitEvent(cd->stream, e, 0));
  c->fences += !cap;
  return CT_OK;
}

/* A point's event, on a communicator that is open. */
static ct_status point(ct_device *d, int k, cuda_coll **out) {
  cuda_coll *c = cuda_dev_of(d)->coll;
  if (!c) return ct_error(CT_ERR_INVALID_ARG, "%s: no communicator (coll_open)", d->name);
  if (k < 0 || k >= CT_COLL_POINTS) return ct_error(CT_ERR_INVALID_ARG, "coll point %d is not in [0, %d)", k, CT_COLL_POINTS);
  *out = c;
  return cuda_enter(d);
}

ct_status cuda_coll_record(ct_device *d, int k) {
  cuda_coll *c = NULL;
  CT_TRY(point(d, k, &c));
  CUDA_TRY(cudaEventRecord(c->point[k], c->stream));
  return CT_OK;
}

ct_status cuda_coll_await(ct_device *d, int k) {
  cuda_coll *c = NULL;
  CT_TRY(point(d, k, &c));
  CUDA_TRY(cudaStreamWaitEvent(cuda_dev_of(d)->stream, c->point[k], 0));
  return CT_OK;
}

ct_status cuda_coll_mark(ct_device *d) {
  cuda_dev *cd = cuda_dev_of(d);
  cuda_coll *c = cd->coll;
  if (!c) return ct_error(CT_ERR_INVALID_ARG, "%s: no communicator (coll_open)", d->name);
  CT_TRY(cuda_enter(d));
  CUDA_TRY(cudaEventRecord(c->fence[c->fences % 2], cd->stream));
  c->fences++;
  return CT_OK;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A stuck or failed communicator is aborted: NCCL's kernels then return,
 * so the streams drain and the process can exit. */
static ct_status abort_with(cuda_coll *c, ct_status st) {
  if (c->comm) (void)nccl.CommAbort(c->comm);
  c->comm = NULL;
  return st;
}

ct_status cuda_coll_wait(ct_device *d, int back, double timeout, const char *what) {
  cuda_coll *c = cuda_dev_of(d)->coll;
  if (!c) return ct_error(CT_ERR_INVALID_ARG, "%s: no communicator (coll_open)", d->name);
  if (back < 0 || back > 1) return ct_error(CT_ERR_INVALID_ARG, "coll_wait: back %d is not 0 or 1", back);
  if (c->fences <= back || capturing(cuda_dev_of(d))) return CT_OK;
  CT_TRY(cuda_enter(d));
  cudaEvent_t e = c->fence[(c->fences - 1 - back) % 2];
  double t0 = now_s();
  for (;;) {
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return CT_OK;
    if (q != cudaErrorNotReady) return abort_with(c, cuda_rt_fail(q, __FILE__, __LINE__, "cudaEventQuery"));
    ncclResult_t async = ncclSuccess;
    if (c->comm) (void)nccl.CommGetAsyncError(c->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      return abort_with(c, ct_error(CT_ERR_BACKEND, "%s failed on %s: NCCL: %s", what, d->name,
                                       nccl.GetErrorString(async)));
    if (now_s() - t0 > timeout)
      return abort_with(c, ct_error(CT_ERR_BACKEND,
                                       "%s did not complete on %s within %g s (--dist-timeout): another rank failed, "
                                       "died or stopped answering",
                                       what, d->name, timeout));
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

void cuda_coll_close(ct_device *d) {
  cuda_coll *c = cuda_dev_of(d)->coll;
  if (!c) return;
  (void)cuda_enter(d);
  if (c->comm) {
    (void)cudaStreamSynchronize(c->stream);
    (void)nccl.CommDestroy(c->comm);
  }
  for (int k = 0; k < 2; k++)
    if (c->fence[k]) (void)cudaEventDestroy(c->fence[k]);
  if (c->join) (void)cudaEventDestroy(c->join);
  for (int k = 0; k < CT_COLL_POINTS; k++)
    if (c->point[k]) (void)cudaEventDestroy(c->point[k]);
  if (c->ready) (void)cudaEventDestroy(c->ready);
  if (c->stream) (void)cudaStreamDestroy(c->stream);
  free(c);
  cuda_dev_of(d)->coll = NULL;
}

#endif
