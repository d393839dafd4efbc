/* The emulator's NCCL (tests only): the calls src/backend/cuda/cuda_coll.c
 * makes, between processes that each emulate one GPU (DDP: mpirun -np N,
 * every rank a process of its own) or between the emulated devices of one
 * process (DataParallel: a rank per device, each driven by a thread of
 * its own).
 *
 * Between processes a communicator is an MPI communicator split from
 * MPI_COMM_WORLD by the unique id, ranks ordered as NCCL's. In a process
 * without MPI (or alone in its MPI world) the ranks holding one id form a
 * clique in memory: each collective meets there, the last rank to arrive
 * checks that all called the same collective on the same sizes, sums in
 * rank order (or copies the root's bytes) into every rank's buffer and
 * releases the others. A rank that does not arrive within
 * CT_EMU_NCCL_TIMEOUT seconds (default 60) fails the collective for all
 * (a real NCCL would spin until the communicator is aborted). Each
 * communicator belongs to the device current when it was made, and its
 * collectives must be called with that device current on buffers of it.
 * A collective first runs everything
 * its stream has queued (with what that stream waits for through events),
 * then communicates at once, before returning; inside a stream capture
 * it is recorded and communicates at each replay (in-process ranks meet
 * outside the emulator's lock there). Running it at the call
 * rather than when the stream is next drained keeps every rank's MPI
 * calls in host program order, so the emulated collectives and the host's
 * own MPI collectives (ct_comm) never wait on each other. What this checks:
 * that the backend ordered a collective after the kernels that wrote its
 * buffer (without the event the stream would not run them, and stale
 * gradients would be summed), device pointers, dtypes and the calls'
 * order across ranks; and, since a collective at its call reads and
 * writes its buffers early, that no other work writes them before the
 * collective is seen complete on the device (collective_watch in
 * emu.h: a buffer reused without waiting for its collective's stream
 * fails there). What it cannot: a read of a collective's output before
 * it is seen complete (the output is always there already), or real
 * overlap. */
#ifdef CTRAIN_CUDA_NCCL_LINKED

/* The C API only: OpenMPI's C++ bindings would need libmpi_cxx. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

#include "emu.h"

namespace {

/* The ranks of one id in this process. */
struct Clique {
  int n = 0, joined = 0, refs = 0;
  std::mutex mu;
  std::condition_variable cv;
  /* The collective under way: who arrived, with what. */
  int arrived = 0;
  long gen = 0;
  bool failed = false;
  std::vector<void *> bufs;
  std::vector<std::string> calls;
};

}  // namespace

struct ncclComm {
  MPI_Comm mc;
  int rank, size;
  int device;
  Clique *clique; /* in-process ranks; NULL over MPI */
};

namespace {

std::mutex g_cliques_mu;
std::map<std::string, Clique *> g_cliques; /* ids whose ranks are still joining */

std::chrono::steady_clock::time_point deadline() {
  const char *e = getenv("CT_EMU_NCCL_TIMEOUT");
  const int s = e && atoi(e) > 0 ? atoi(e) : 60;
  return std::chrono::steady_clock::now() + std::chrono::seconds(s);
}

/* Whether this process's ranks communicate in memory: no MPI world to
 * split, or one of a single process. */
bool in_process() {
  int init = 0, size = 1;
  MPI_Initialized(&init);
  if (init) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return !init || size == 1;
}

ncclResult_t join_clique(ncclComm_t *comm, int nranks, const ncclUniqueId &id, int rank) {
  const std::string key(id.internal, sizeof id.internal);
  Clique *q;
  {
    std::lock_guard<std::mutex> lk(g_cliques_mu);
    auto it = g_cliques.find(key);
    if (it == g_cliques.end()) {
      q = new Clique();
      q->n = nranks;
      q->bufs.resize(nranks);
      q->calls.resize(nranks);
      g_cliques[key] = q;
    } else {
      q = it->second;
    }
  }
  std::unique_lock<std::mutex> lk(q->mu);
  if (q->n != nranks) {
    fprintf(stderr, "ct_emu: ncclCommInitRank: rank %d of %d, but the id's first rank said %d ranks\n", rank, nranks,
            q->n);
    return ncclInvalidUsage;
  }
  q->joined++, q->refs++;
  q->cv.notify_all();
  if (!q->cv.wait_until(lk, deadline(), [q] { return q->joined == q->n; })) {
    fprintf(stderr, "ct_emu: ncclCommInitRank: %d of %d ranks joined in time\n", q->joined, q->n);
    q->joined--, q->refs--;
    return ncclSystemError;
  }
  lk.unlock();
  {
    std::lock_guard<std::mutex> g(g_cliques_mu);
    g_cliques.erase(key);
  }
  *comm = new ncclComm{MPI_COMM_NULL, rank, nranks, ct_emu::current_device(), q};
  return ncclSuccess;
}

/* One in-process collective: call names it with its sizes (every rank
 * must name the same), act runs once all arrived, on every rank's buffer. */
template <class F>
ncclResult_t meet(ncclComm_t comm, void *buf, const std::string &call, F act) {
  Clique *q = comm->clique;
  std::unique_lock<std::mutex> lk(q->mu);
  if (q->failed) return ncclSystemError;
  q->bufs[comm->rank] = buf;
  q->calls[comm->rank] = call;
  const long gen = q->gen;
  if (++q->arrived == q->n) {
    for (int r = 1; r < q->n; r++)
      if (q->calls[r] != q->calls[0]) {
        fprintf(stderr, "ct_emu: rank 0 called %s, rank %d %s\n", q->calls[0].c_str(), r, q->calls[r].c_str());
        q->failed = true;
      }
    if (!q->failed) act(q->bufs);
    q->arrived = 0, q->gen++;
    q->cv.notify_all();
  } else if (!q->cv.wait_until(lk, deadline(), [q, gen] { return q->gen != gen || q->failed; })) {
    fprintf(stderr, "ct_emu: %s: rank %d waited for the others in vain\n", call.c_str(), comm->rank);
    q->failed = true;
    q->cv.notify_all();
  }
  return q->failed ? ncclSystemError : ncclSuccess;
}

void leave(ncclComm_t comm) {
  Clique *q = comm->clique;
  bool last;
  {
    std::lock_guard<std::mutex> lk(q->mu);
    q->failed = q->failed || q->arrived > 0; /* a collective some rank waits in cannot complete now */
    q->cv.notify_all();
    last = --q->refs == 0;
  }
  if (last) delete q;
  delete comm;
}

/* Checks a collective as NCCL would fail it (a host pointer, a dtype or
 * op the backend does not use: by the callers) and runs op: at once, after
 * the stream's queued work (what writes the buffer), or, inside a stream
 * capture, at each replay of the graph, in its place among the captured
 * work (NCCL's own graph support). Ranks of one process meet in a replay
 * outside the emulator's lock (record_meeting), so each rank's launch
 * gets in to arrive. */
ncclResult_t issue(ncclComm_t comm, const void *send, const void *buf, size_t bytes, cudaStream_t stream,
                   const char *who, std::function<ncclResult_t()> op) {
  if (!comm) return ncclInvalidArgument;
  if (ct_emu::current_device() != comm->device) {
    fprintf(stderr, "ct_emu: %s on the communicator of device %d with device %d current\n", who, comm->device,
            ct_emu::current_device());
    return ncclInvalidUsage;
  }
  if (!ct_emu::check_device_range(buf, bytes, who, "buffer")) return ncclInvalidArgument;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs == cudaStreamCaptureStatusInvalidated)
    return ncclInvalidUsage;
  if (cs == cudaStreamCaptureStatusActive) {
    ct_emu::trace(stream, "%s %zu bytes", who, bytes);
    std::string name = who;
    auto replay = [op, name]() {
      if (op() != ncclSuccess) ct_emu::fail(cudaErrorLaunchFailure, name + " failed in a graph replay");
    };
    if (comm->clique) ct_emu::record_meeting(stream, replay);
    else ct_emu::enqueue(stream, replay);
    return ncclSuccess;
  }
  if (ct_emu::drain_stream(stream, who) != cudaSuccess) return ncclUnhandledCudaError;
  std::vector<std::pair<const void *, size_t>> touched{{buf, bytes}};
  if (send != buf) touched.emplace_back(send, bytes);
  ct_emu::collective_settle(stream, touched);
  ct_emu::trace(stream, "%s %zu bytes", who, bytes);
  ncclResult_t r = op();
  if (r == ncclSuccess)
    ct_emu::collective_watch(stream, std::string(who) + " of " + std::to_string(bytes) + " bytes", touched);
  return r;
}

ncclResult_t mpi(int e) { return e == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }

/* The sum of every rank's count values into dst (may be one of them),
 * in rank order. */
template <class T>
void sum_into(void *dst, const std::vector<void *> &bufs, size_t count) {
  for (size_t i = 0; i < count; i++) {
    T s = 0;
    for (void *b : bufs) s += ((const T *)b)[i];
    ((T *)dst)[i] = s;
  }
}

/* The dtypes the backend sums: f32 gradients, f64 norms, i32 flags. */
bool sum_type(ncclDataType_t t, size_t *size, MPI_Datatype *mt) {
  switch (t) {
    case ncclFloat32: *size = 4, *mt = MPI_FLOAT; return true;
    case ncclFloat64: *size = 8, *mt = MPI_DOUBLE; return true;
    case ncclInt32: *size = 4, *mt = MPI_INT; return true;
    default: return false;
  }
}

void sum_as(ncclDataType_t t, void *dst, const std::vector<void *> &bufs, size_t count) {
  if (t == ncclFloat32) sum_into<float>(dst, bufs, count);
  else if (t == ncclFloat64) sum_into<double>(dst, bufs, count);
  else sum_into<int32_t>(dst, bufs, count);
}

std::string call_name(const char *what, size_t count, ncclDataType_t t, int root) {
  return std::string(what) + " of " + std::to_string(count) + " values of type " + std::to_string((int)t) +
         (root >= 0 ? " to/from rank " + std::to_string(root) : "");
}

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static std::atomic<long> made{0};
  memset(id, 0, sizeof *id);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  snprintf(id->internal, sizeof id->internal, "emu %d %ld %ld %ld", (int)getpid(), (long)t.tv_sec, (long)t.tv_nsec,
           made++);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (in_process()) return join_clique(comm, nranks, id, rank);
  /* Ranks holding the same id form one communicator. */
  unsigned h = 2166136261u;
  for (size_t i = 0; i < sizeof id.internal; i++) h = (h ^ (unsigned char)id.internal[i]) * 16777619u;
  ncclComm *c = new ncclComm();
  c->device = ct_emu::current_device();
  if (MPI_Comm_split(MPI_COMM_WORLD, (int)(h & 0x7fffffff), rank, &c->mc) != MPI_SUCCESS) {
    delete c;
    return ncclSystemError;
  }
  MPI_Comm_rank(c->mc, &c->rank);
  MPI_Comm_size(c->mc, &c->size);
  if (c->size != nranks || c->rank != rank) {
    fprintf(stderr, "ct_emu: ncclCommInitRank: rank %d of %d, but %d of %d processes hold the id\n", rank, nranks,
            c->rank, c->size);
    MPI_Comm_free(&c->mc);
    delete c;
    return ncclInvalidUsage;
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  size_t size;
  MPI_Datatype mt;
  if (!sum_type(datatype, &size, &mt) || op != ncclSum || count > (size_t)INT32_MAX) return ncclInvalidArgument;
  return issue(comm, sendbuff, recvbuff, count * size, stream, "ncclAllReduce", [=]() {
    if (comm->clique) {
      if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, count * size);
      return meet(comm, recvbuff, call_name("ncclAllReduce", count, datatype, -1),
                  [datatype, count](std::vector<void *> &bufs) {
                    std::vector<char> sum(count * (datatype == ncclFloat64 ? 8 : 4));
                    sum_as(datatype, sum.data(), bufs, count);
                    for (void *b : bufs) memcpy(b, sum.data(), sum.size());
                  });
    }
    return mpi(MPI_Allreduce(sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff, recvbuff, (int)count, mt, MPI_SUM,
                             comm->mc));
  });
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  size_t size;
  MPI_Datatype mt;
  if (!sum_type(datatype, &size, &mt) || op != ncclSum || count > (size_t)INT32_MAX || !comm || root < 0 ||
      root >= comm->size)
    return ncclInvalidArgument;
  return issue(comm, sendbuff, recvbuff, count * size, stream, "ncclReduce", [=]() {
    if (comm->clique) {
      /* Only the root's buffer is defined afterwards; the sends stay as
       * they were. */
      if (comm->rank == root && sendbuff != recvbuff) memcpy(recvbuff, sendbuff, count * size);
      return meet(comm, comm->rank == root ? recvbuff : (void *)sendbuff,
                  call_name("ncclReduce", count, datatype, root),
                  [datatype, count, root](std::vector<void *> &bufs) { sum_as(datatype, bufs[root], bufs, count); });
    }
    const bool in_place = comm->rank == root && sendbuff == recvbuff;
    return mpi(MPI_Reduce(in_place ? MPI_IN_PLACE : sendbuff, recvbuff, (int)count, mt, MPI_SUM, root, comm->mc));
  });
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  size_t size = datatype == ncclUint8 ? 1 : datatype == ncclFloat32 ? 4 : 0;
  if (!size || count > (size_t)INT32_MAX / size || !comm || root < 0 || root >= comm->size) return ncclInvalidArgument;
  const size_t bytes = count * size;
  return issue(comm, sendbuff, recvbuff, bytes, stream, "ncclBroadcast", [=]() {
    if (comm->rank == root && sendbuff != recvbuff) memcpy(recvbuff, sendbuff, bytes);
    if (comm->clique)
      return meet(comm, recvbuff, call_name("ncclBroadcast", count, datatype, root),
                  [bytes, root](std::vector<void *> &bufs) {
                    for (size_t k = 0; k < bufs.size(); k++)
                      if ((int)k != root) memcpy(bufs[k], bufs[root], bytes);
                  });
    return mpi(MPI_Bcast(recvbuff, (int)bytes, MPI_BYTE, root, comm->mc));
  });
}

/* Grouping changes nothing here: every collective runs at its call (or
 * its replay), and every rank calls them in the same order. */
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  *asyncError = ncclSuccess;
  return comm ? ncclSuccess : ncclInvalidArgument;
}

/* Aborting leaves the MPI communicator alone: its peers may be gone. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm && comm->clique) leave(comm);
  else delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (comm->clique) {
    leave(comm);
    return ncclSuccess;
  }
  MPI_Comm_free(&comm->mc);
  delete comm;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    default: return "unknown result code";
  }
}

}  // extern "C"

#endif
