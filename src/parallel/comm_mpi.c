/* The MPI communicator: launch, bootstrap and the CPU collectives.
 *
 * Collectives are MPI's non-blocking ones, waited for by polling with a
 * deadline: a blocking MPI call cannot be interrupted, so a dead or
 * stopped peer would otherwise hang this rank for good. The poll yields
 * the core between tests, so a rank waiting for a slower one on the same
 * core leaves it to it. */
#include "parallel/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "ctrain/dist.h"

int ct_comm_available(void) { return CTRAIN_HAVE_MPI; }

uint64_t ct_dist_hash(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  if (!h) h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

#if CTRAIN_HAVE_MPI
#include <limits.h>
#include <mpi.h>

/* A started collective: MPI requests (a count beyond INT_MAX is split). */
typedef struct comm_slot {
  int used, nr;
  MPI_Request *r;
  char what[160];
  /* Done when the collective completes: reduce-scatter in place leaves a
   * rank's part at the buffer's start (moved to its place), and the rest
   * of the buffer [base, base + bytes) holds scratch (zeroed: a gradient
   * buffer's gaps between parameters must stay zero). */
  void *move_dst;
  const void *move_src;
  size_t move_bytes;
  char *base;
  size_t bytes;
} comm_slot;

struct ct_comm {
  MPI_Comm world, local;
  int rank, size, local_rank, local_size;
  int inited_here; /* MPI_Finalize is ours to call */
  double timeout;
  comm_slot *slots;
  int nslots;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static ct_status mpi_failed(int rc, const char *call, const char *what, int rank) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return ct_error(CT_ERR_BACKEND, "rank %d: MPI %s failed in %s: %s", rank, call, what, msg);
}

#define MPI_CK(c, call, what)                                              \
  do {                                                                     \
    int rc_ = (call);                                                      \
    if (rc_ != MPI_SUCCESS) return mpi_failed(rc_, #call, what, (c)->rank); \
  } while (0)

ct_status ct_comm_open_mpi(ct_comm **out) {
  *out = NULL;
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  ct_comm *c = calloc(1, sizeof *c);
  if (!c) return ct_error(CT_ERR_OUT_OF_MEMORY, "comm: out of host memory");
  c->timeout = 600;
  if (!inited) {
    /* Loader threads never call MPI; only the training thread does. */
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
      free(c);
      return mpi_failed(rc, "MPI_Init_thread", "start-up", -1);
    }
    c->inited_here = 1;
  }
  ct_status s = CT_OK;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &c->world) != MPI_SUCCESS) s = ct_error(CT_ERR_BACKEND, "MPI_Comm_dup failed");
  if (s == CT_OK) {
    MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->world, &c->rank);
    MPI_Comm_size(c->world, &c->size);
    /* The ranks sharing this host: the local rank picks the device. */
    if (MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &c->local) != MPI_SUCCESS)
      s = ct_error(CT_ERR_BACKEND, "rank %d: MPI_Comm_split_type failed", c->rank);
  }
  if (s != CT_OK) {
    if (c->inited_here) MPI_Finalize();
    free(c);
    return s;
  }
  MPI_Comm_rank(c->local, &c->local_rank);
  MPI_Comm_size(c->local, &c->local_size);
  *out = c;
  return CT_OK;
}

int ct_comm_rank(const ct_comm *c) { return c ? c->rank : 0; }
int ct_comm_size(const ct_comm *c) { return c ? c->size : 1; }
int ct_comm_local_rank(const ct_comm *c) { return c ? c->local_rank : 0; }
int ct_comm_local_size(const ct_comm *c) { return c ? c->local_size : 1; }
void ct_comm_set_timeout(ct_comm *c, double seconds) {
  if (seconds > 0) c->timeout = seconds;
}
double ct_comm_timeout(const ct_comm *c) { return c->timeout; }

void ct_comm_abort(ct_comm *c, int code) {
  (void)c;
  MPI_Abort(MPI_COMM_WORLD, code);
}

void ct_comm_close(ct_comm *c) {
  if (!c) return;
  for (int i = 0; i < c->nslots; i++) free(c->slots[i].r);
  free(c->slots);
  MPI_Comm_free(&c->local);
  MPI_Comm_free(&c->world);
  if (c->inited_here) MPI_Finalize();
  free(c);
}

/* A free slot with room for nr requests. */
static ct_status slot_take(ct_comm *c, int nr, const char *what, int *idx) {
  int i = 0;
  while (i < c->nslots && c->slots[i].used) i++;
  if (i == c->nslots) {
    comm_slot *ns = realloc(c->slots, (size_t)(c->nslots + 8) * sizeof *ns);
    if (!ns) return ct_error(CT_ERR_OUT_OF_MEMORY, "comm: out of host memory");
    memset(ns + c->nslots, 0, 8 * sizeof *ns);
    c->slots = ns;
    c->nslots += 8;
  }
  comm_slot *sl = &c->slots[i];
  if (sl->nr < nr) {
    MPI_Request *r = realloc(sl->r, (size_t)nr * sizeof *r);
    if (!r) return ct_error(CT_ERR_OUT_OF_MEMORY, "comm: out of host memory");
    sl->r = r;
  }
  sl->nr = nr;
  sl->used = 1;
  sl->move_bytes = 0;
  sl->base = NULL;
  for (int k = 0; k < nr; k++) sl->r[k] = MPI_REQUEST_NULL;
  snprintf(sl->what, sizeof sl->what, "%s", what);
  *idx = i;
  return CT_OK;
}

static MPI_Datatype mpi_type(ct_dtype dt, size_t *esize) {
  switch (dt) {
    case CT_F32: *esize = 4; return MPI_FLOAT;
    case CT_F64: *esize = 8; return MPI_DOUBLE;
    case CT_I32: *esize = 4; return MPI_INT32_T;
    case CT_I64: *esize = 8; return MPI_INT64_T;
    default: *esize = 0; return MPI_DATATYPE_NULL;
  }
}

ct_status ct_comm_allreduce_start(ct_comm *c, void *buf, size_t count, ct_dtype dt, const char *what, int *req) {
  size_t es;
  MPI_Datatype t = mpi_type(dt, &es);
  if (t == MPI_DATATYPE_NULL) return ct_error(CT_ERR_INVALID_ARG, "comm: %s: dtype %s cannot be summed", what, ct_dtype_name(dt));
  const size_t chunk = INT_MAX / 2;
  int nr = count ? (int)((count + chunk - 1) / chunk) : 0;
  CT_TRY(slot_take(c, nr, what, req));
  comm_slot *sl = &c->slots[*req];
  for (int k = 0; k < nr; k++) {
    size_t off = (size_t)k * chunk, n = count - off < chunk ? count - off : chunk;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n, t, MPI_SUM, c->world, &sl->r[k]);
    if (rc != MPI_SUCCESS) {
      sl->used = 0;
      return mpi_failed(rc, "MPI_Iallreduce", what, c->rank);
    }
  }
  return CT_OK;
}

ct_status ct_comm_test(ct_comm *c, int req, int *done) {
  comm_slot *sl = &c->slots[req];
  int flag = 1;
  if (sl->nr) MPI_CK(c, MPI_Testall(sl->nr, sl->r, &flag, MPI_STATUSES_IGNORE), sl->what);
  *done = flag;
  if (flag && sl->base) {
    char *d = sl->move_dst;
    if (sl->move_bytes) memmove(d, sl->move_src, sl->move_bytes);
    memset(sl->base, 0, (size_t)(d - sl->base));
    memset(d + sl->move_bytes, 0, sl->bytes - (size_t)(d - sl->base) - sl->move_bytes);
  }
  if (flag) sl->used = 0;
  return CT_OK;
}

ct_status ct_comm_wait(ct_comm *c, int req) {
  double t0 = now_s();
  for (;;) {
    int done = 0;
    CT_TRY(ct_comm_test(c, req, &done));
    if (done) return CT_OK;
    double waited = now_s() - t0;
    if (waited > c->timeout) {
      /* The requests stay pending: the job is beyond repair, and the
       * caller's answer is ct_comm_abort. */
      return ct_error(CT_ERR_BACKEND,
                      "%s did not complete on rank %d of %d within %g s (--dist-timeout): another rank failed, died "
                      "or stopped answering",
                      c->slots[req].what, c->rank, c->size, c->timeout);
    }
    /* MPI's non-blocking collectives progress only inside MPI calls, so a
     * sleep between tests stalls them: yield instead, which still leaves
     * the core to a rank that shares it; sleep only once the wait is long
     * (a straggler), where a test every 200 us costs nothing. */
    if (waited < 1.0) {
      sched_yield();
    } else {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
  }
}

/* counts as MPI's ints, with the parts' offsets; CT_ERR_INVALID_ARG
 * beyond INT_MAX values. */
static ct_status int_counts(const ct_comm *c, const size_t *counts, const char *what, int *ic, int *displs) {
  size_t off = 0;
  for (int r = 0; r < c->size; r++) {
    if (counts[r] > INT_MAX || off > INT_MAX)
      return ct_error(CT_ERR_INVALID_ARG, "comm: %s: %zu values from offset %zu are too many for one call", what,
                      counts[r], off);
    ic[r] = (int)counts[r], displs[r] = (int)off;
    off += counts[r];
  }
  return CT_OK;
}

ct_status ct_comm_reduce_scatter_start(ct_comm *c, void *buf, const size_t *counts, ct_dtype dt, const char *what,
                                       int *req) {
  size_t es;
  MPI_Datatype t = mpi_type(dt, &es);
  int *ic = malloc(2 * (size_t)c->size * sizeof *ic);
  if (!ic) return ct_error(CT_ERR_OUT_OF_MEMORY, "comm: out of host memory");
  ct_status s = t == MPI_DATATYPE_NULL ? ct_error(CT_ERR_INVALID_ARG, "comm: %s: dtype cannot be summed", what)
                                       : int_counts(c, counts, what, ic, ic + c->size);
  if (s == CT_OK) s = slot_take(c, 1, what, req);
  if (s == CT_OK) {
    comm_slot *sl = &c->slots[*req];
    int rc = MPI_Ireduce_scatter(MPI_IN_PLACE, buf, ic, t, MPI_SUM, c->world, &sl->r[0]);
    if (rc != MPI_SUCCESS) {
      sl->used = 0;
      s = mpi_failed(rc, "MPI_Ireduce_scatter", what, c->rank);
    } else {
      sl->move_dst = (char *)buf + (size_t)ic[c->size + c->rank] * es;
      sl->move_src = buf;
      sl->move_bytes = (size_t)ic[c->rank] * es;
      sl->base = buf;
      sl->bytes = (size_t)(ic[c->size + c->size - 1] + ic[c->size - 1]) * es;
    }
  }
  free(ic);
  return s;
}

ct_status ct_comm_allgatherv(ct_comm *c, void *buf, const size_t *counts, ct_dtype dt, const char *what) {
  size_t es;
  MPI_Datatype t = mpi_type(dt, &es);
  int *ic = malloc(2 * (size_t)c->size * sizeof *ic), req = -1;
  if (!ic) return ct_error(CT_ERR_OUT_OF_MEMORY, "comm: out of host memory");
  ct_status s = t == MPI_DATATYPE_NULL ? ct_error(CT_ERR_INVALID_ARG, "comm: %s: unknown dtype", what)
                                       : int_counts(c, counts, what, ic, ic + c->size);
  if (s == CT_OK) s = slot_take(c, 1, what, &req);
  if (s == CT_OK) {
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, ic, ic + c->size, t, c->world,
                             &c->slots[req].r[0]);
    if (rc != MPI_SUCCESS) {
      c->slots[req].used = 0;
      s = mpi_failed(rc, "MPI_Iallgatherv", what, c->rank);
    }
  }
  free(ic);
  return s == CT_OK ? ct_comm_wait(c, req) : s;
}

ct_status ct_comm_allreduce(ct_comm *c, void *buf, size_t count, ct_dtype dt, const char *what) {
  int req = -1;
  CT_TRY(ct_comm_allreduce_start(c, buf, count, dt, what, &req));
  return ct_comm_wait(c, req);
}

ct_status ct_comm_bcast(ct_comm *c, void *buf, size_t bytes, int root, const char *what) {
  const size_t chunk = INT_MAX / 2;
  int nr = bytes ? (int)((bytes + chunk - 1) / chunk) : 0, req = -1;
  CT_TRY(slot_take(c, nr, what, &req));
  comm_slot *sl = &c->slots[req];
  for (int k = 0; k < nr; k++) {
    size_t off = (size_t)k * chunk, n = bytes - off < chunk ? bytes - off : chunk;
    int rc = MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE, root, c->world, &sl->r[k]);
    if (rc != MPI_SUCCESS) {
      sl->used = 0;
      return mpi_failed(rc, "MPI_Ibcast", what, c->rank);
    }
  }
  return ct_comm_wait(c, req);
}

ct_status ct_comm_allgather(ct_comm *c, const void *mine, void *all, size_t bytes, const char *what) {
  if (bytes > INT_MAX) return ct_error(CT_ERR_INVALID_ARG, "comm: %s: %zu bytes per rank is too many to gather", what, bytes);
  int req = -1;
  CT_TRY(slot_take(c, 1, what, &req));
  int rc = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, c->world, &c->slots[req].r[0]);
  if (rc != MPI_SUCCESS) {
    c->slots[req].used = 0;
    return mpi_failed(rc, "MPI_Iallgather", what, c->rank);
  }
  return ct_comm_wait(c, req);
}

#else /* no MPI in this build */

struct ct_comm {
  int unused;
};

static ct_status no_mpi(void) {
  return ct_error(CT_ERR_UNSUPPORTED, "this ctrain was built without MPI (apt-get install libopenmpi-dev openmpi-bin, "
                                      "then configure again)");
}
ct_status ct_comm_open_mpi(ct_comm **out) {
  *out = NULL;
  return no_mpi();
}
int ct_comm_rank(const ct_comm *c) { return (void)c, 0; }
int ct_comm_size(const ct_comm *c) { return (void)c, 1; }
int ct_comm_local_rank(const ct_comm *c) { return (void)c, 0; }
int ct_comm_local_size(const ct_comm *c) { return (void)c, 1; }
void ct_comm_set_timeout(ct_comm *c, double seconds) { (void)c, (void)seconds; }
double ct_comm_timeout(const ct_comm *c) { return (void)c, 0; }
void ct_comm_abort(ct_comm *c, int code) { (void)c, (void)code; }
void ct_comm_close(ct_comm *c) { (void)c; }
ct_status ct_comm_allreduce_start(ct_comm *c, void *buf, size_t count, ct_dtype dt, const char *what, int *req) {
  (void)c, (void)buf, (void)count, (void)dt, (void)what, (void)req;
  return no_mpi();
}
ct_status ct_comm_test(ct_comm *c, int req, int *done) {
  (void)c, (void)req, *done = 1;
  return no_mpi();
}
ct_status ct_comm_reduce_scatter_start(ct_comm *c, void *buf, const size_t *counts, ct_dtype dt, const char *what,
                                       int *req) {
  (void)c, (void)buf, (void)counts, (void)dt, (void)what, (void)req;
  return no_mpi();
}
ct_status ct_comm_allgatherv(ct_comm *c, void *buf, const size_t *counts, ct_dtype dt, const char *what) {
  (void)c, (void)buf, (void)counts, (void)dt, (void)what;
  return no_mpi();
}
ct_status ct_comm_wait(ct_comm *c, int req) { return (void)c, (void)req, no_mpi(); }
ct_status ct_comm_allreduce(ct_comm *c, void *buf, size_t count, ct_dtype dt, const char *what) {
  (void)c, (void)buf, (void)count, (void)dt, (void)what;
  return no_mpi();
}
ct_status ct_comm_bcast(ct_comm *c, void *buf, size_t bytes, int root, const char *what) {
  (void)c, (void)buf, (void)bytes, (void)root, (void)what;
  return no_mpi();
}
ct_status ct_comm_allgather(ct_comm *c, const void *mine, void *all, size_t bytes, const char *what) {
  (void)c, (void)mine, (void)all, (void)bytes, (void)what;
  return no_mpi();
}
#endif

ct_status ct_dist_check_same(ct_comm *c, const ct_dist_field *fields, int n) {
  int size = ct_comm_size(c);
  uint64_t *mine = calloc((size_t)n + 1, sizeof *mine), *all = calloc((size_t)n * (size_t)size + 1, sizeof *all);
  ct_status s = mine && all ? CT_OK : ct_error(CT_ERR_OUT_OF_MEMORY, "comm: out of host memory");
  for (int i = 0; s == CT_OK && i < n; i++) mine[i] = fields[i].value;
  if (s == CT_OK) s = ct_comm_allgather(c, mine, all, (size_t)n * sizeof *mine, "the start-up comparison of the ranks' settings");
  for (int i = 0; s == CT_OK && i < n; i++)
    for (int r = 1; r < size; r++) {
      uint64_t v0 = all[i], vr = all[(size_t)r * (size_t)n + (size_t)i];
      if (v0 == vr) continue;
      if (fields[i].is_hash)
        s = ct_error(CT_ERR_INVALID_ARG, "distributed start: rank %d's %s differs from rank 0's: every rank must train "
                     "the same run", r, fields[i].name);
      else
        s = ct_error(CT_ERR_INVALID_ARG, "distributed start: rank %d's %s is %llu, rank 0's is %llu: every rank must "
                     "train the same run", r, fields[i].name, (unsigned long long)vr, (unsigned long long)v0);
      break;
    }
  free(mine);
  free(all);
  return s;
}
