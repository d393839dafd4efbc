/* The emulator's NCCL (tests only): the calls src/backend/cuda/cuda_coll.c
 * makes, over MPI, between processes that each emulate one GPU (mpirun -np
 * N, every rank a process of its own, as NCCL wants one GPU per rank).
 *
 * A communicator is an MPI communicator split from MPI_COMM_WORLD by the
 * unique id, ranks ordered as NCCL's. A collective first runs everything
 * its stream has queued (with what that stream waits for through events),
 * then communicates at once, before returning. Running it at the call
 * rather than when the stream is next drained keeps every rank's MPI
 * calls in host program order, so the emulated collectives and the host's
 * own MPI collectives (ct_comm) never wait on each other. What this checks:
 * that the backend ordered a collective after the kernels that wrote its
 * buffer (without the event the stream would not run them, and stale
 * gradients would be summed), device pointers, dtypes and the calls'
 * order across ranks. What it cannot: that later compute waits for the
 * collective (it is always complete already), or real overlap. */
#ifdef CTRAIN_CUDA_NCCL_LINKED

/* The C API only: OpenMPI's C++ bindings would need libmpi_cxx. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <unistd.h>

#include "emu.h"

struct ncclComm {
  MPI_Comm mc;
  int rank, size;
};

namespace {

/* The collective as it would fail on NCCL: a host pointer, a captured
 * stream, a dtype or op the backend does not use. */
ncclResult_t start(ncclComm_t comm, const void *buf, size_t bytes, cudaStream_t stream, const char *who) {
  if (!comm) return ncclInvalidArgument;
  if (!ct_emu::check_device_range(buf, bytes, who, "buffer")) return ncclInvalidArgument;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
    fprintf(stderr, "ct_emu: %s inside a stream capture is not emulated\n", who);
    return ncclInvalidUsage;
  }
  /* The buffer's writers: whatever the stream was told to wait for. */
  if (cudaStreamSynchronize(stream) != cudaSuccess) return ncclUnhandledCudaError;
  ct_emu::trace(stream, "%s %zu bytes", who, bytes);
  return ncclSuccess;
}

ncclResult_t mpi(int e) { return e == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  snprintf(id->internal, sizeof id->internal, "emu %d %ld %ld", (int)getpid(), (long)t.tv_sec, (long)t.tv_nsec);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  /* Ranks holding the same id form one communicator. */
  unsigned h = 2166136261u;
  for (size_t i = 0; i < sizeof id.internal; i++) h = (h ^ (unsigned char)id.internal[i]) * 16777619u;
  ncclComm *c = new ncclComm();
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
  if (datatype != ncclFloat32 || op != ncclSum || count > (size_t)INT32_MAX) return ncclInvalidArgument;
  ncclResult_t r = start(comm, recvbuff, count * sizeof(float), stream, "ncclAllReduce");
  if (r != ncclSuccess) return r;
  return mpi(MPI_Allreduce(sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff, recvbuff, (int)count, MPI_FLOAT, MPI_SUM,
                           comm->mc));
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  if (datatype != ncclUint8 || count > (size_t)INT32_MAX || !comm || root < 0 || root >= comm->size)
    return ncclInvalidArgument;
  ncclResult_t r = start(comm, recvbuff, count, stream, "ncclBroadcast");
  if (r != ncclSuccess) return r;
  if (comm->rank == root && sendbuff != recvbuff) memcpy(recvbuff, sendbuff, count);
  return mpi(MPI_Bcast(recvbuff, (int)count, MPI_BYTE, root, comm->mc));
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  *asyncError = ncclSuccess;
  return comm ? ncclSuccess : ncclInvalidArgument;
}

/* Aborting leaves the MPI communicator alone: its peers may be gone. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
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
