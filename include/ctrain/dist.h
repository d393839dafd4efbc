/* Distributed data parallel: the communicator ranks train over, and what
 * ct_fit needs to train one model on many processes.
 *
 * A ct_comm joins the MPI job the process was started in (mpirun, srun; a
 * process started alone is a world of one). Every collective ctrain runs
 * over it is non-blocking underneath and waited for with a deadline
 * (ct_comm_set_timeout, 600 s by default as PyTorch's): a rank that died
 * or stopped answering turns into an error naming this rank and the
 * collective it was in, never a hang. After an error on one rank a
 * program calls ct_comm_abort, which ends every rank of the job at once
 * (the others would otherwise wait in their next collective until the
 * deadline). The library itself never aborts.
 *
 * ct_fit trains data parallel when ct_train_config.dist.comm is set (see
 * ct_dist_config): each rank holds a whole replica, reads its share of
 * every global batch through the loader's DistributedSampler options, and
 * the gradients are summed over ranks in buckets while the backward runs.
 */
#ifndef CTRAIN_DIST_H
#define CTRAIN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/dtype.h"
#include "ctrain/model.h"
#include "ctrain/status.h"
#include "ctrain/step.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_comm ct_comm;

/* Whether this build has MPI (CT_ERR_UNSUPPORTED from ct_comm_open_mpi
 * otherwise). */
int ct_comm_available(void);
/* Joins the MPI job (MPI_Init_thread the first time); errors of MPI are
 * returned, never fatal. */
ct_status ct_comm_open_mpi(ct_comm **out);
/* This rank, the world size, and this rank among those on its host. */
int ct_comm_rank(const ct_comm *c);
int ct_comm_size(const ct_comm *c);
int ct_comm_local_rank(const ct_comm *c);
int ct_comm_local_size(const ct_comm *c);
/* The longest any collective may wait (seconds, > 0). */
void ct_comm_set_timeout(ct_comm *c, double seconds);
double ct_comm_timeout(const ct_comm *c);
/* Every rank's copy of bytes bytes at `mine`, gathered into all
 * ([size x bytes], rank order). */
ct_status ct_comm_allgather(ct_comm *c, const void *mine, void *all, size_t bytes, const char *what);
/* Sums count values of buf (host memory, f32, f64, i32 or i64) over all
 * ranks, in place; and copies bytes bytes from root's buf to every
 * rank's. what names the call in errors and timeouts. */
ct_status ct_comm_allreduce(ct_comm *c, void *buf, size_t count, ct_dtype dt, const char *what);
ct_status ct_comm_bcast(ct_comm *c, void *buf, size_t bytes, int root, const char *what);
/* Ends every rank of the job with exit code `code` (MPI_Abort). */
void ct_comm_abort(ct_comm *c, int code);
/* Leaves the job (MPI_Finalize); c may be NULL. */
void ct_comm_close(ct_comm *c);

/* ct_train_config.dist: data parallel across the ranks of comm (DDP), or
 * across devices of this process (dp_devices, DataParallel). */
typedef struct ct_dist_config {
  ct_comm *comm;
  /* Gradient buckets (MB of f32 gradients): the first bucket (the last
   * layers, whose gradients are final first) first_bucket_mb, the others
   * bucket_mb. 0 takes PyTorch's defaults: 25 for bucket_mb, 1 for
   * first_bucket_mb, or bucket_mb where that is smaller. */
  double bucket_mb, first_bucket_mb;
  /* Every check_sync optimizer steps (0: never) a checksum of the
   * parameters is compared across ranks; a difference ends fit. */
  int64_t check_sync;
  /* 1: ZeRO stage 1. The optimizer state is sharded: rank r keeps and
   * updates only parameters [np r / N, np (r + 1) / N) of the flat buffer
   * (shards may be uneven), the gradient buckets are reduce-scattered
   * (each rank receives its shard's sums) and the updated parameters
   * all-gathered. Checkpoints still hold the whole, logical state.
   * 2: ZeRO stage 2, the same step with the gradients sharded too. On
   * a host model each bucket's gradient memory outside the rank's shard
   * is returned to the OS as soon as its reduce-scatter is done: between
   * steps a rank keeps its shard's gradients only. On a device see
   * ct_ddp_zero2_plan. */
  int zero;
  /* 1: SyncBatchNorm. Every batch norm of the model normalises a
   * training batch with the mean and variance of the global batch (the
   * replicas' counts, sums and squared deviations all-reduced; counts may
   * differ), its running statistics follow the global ones, and its
   * backward all-reduces the two gradient sums. Evaluation uses the
   * running statistics without communication. On GPUs the sums stay on
   * the device (NCCL). */
  int sync_bn;
  /* DataParallel inside this process (comm NULL): dp_count >= 2 devices,
   * all virtual host devices (cpu:N) or all distinct GPUs (cuda:N, their
   * gradients summed by NCCL). The model is prepared on
   * dp_devices[0] for ceil(batch / dp_count) samples; ct_fit makes a
   * replica on each other device and splits every loader batch (the
   * global batch) across them. */
  ct_device *const *dp_devices;
  int dp_count;
} ct_dist_config;

/* DistributedDataParallel as hooks of the one training step, for a loop
 * of one's own (ct_fit uses the same). Each rank holds a whole replica of
 * m (prepared for training). The flat gradient buffer
 * is cut into buckets, views of it in reverse state order (the order the
 * backward finishes them): the first first_bucket_mb, the others
 * bucket_mb. The grads_ready hook counts a bucket's gradients as the
 * backward makes them final and starts its all-reduce (a sum: each rank
 * gives its loss gradient its share of the global batch through
 * ct_step_pos.factor, and numbers its samples with sample_offset and
 * sample_stride) the moment the last one is; later hook calls drive the
 * started ones, and the sync hook waits for all, then copies rank 0's
 * buffers (running statistics) to every rank. The reduce hook sums the
 * metrics; the non-finite flag and the gradient norm need nothing, since
 * every rank holds the same summed gradients. A model resident on a CUDA
 * device (prepared there for training) communicates over NCCL instead:
 * each bucket's all-reduce is queued on the device's collective stream
 * behind the kernels that wrote it, and the update waits for them on the
 * device, not on the host. */
typedef struct ct_ddp ct_ddp;
ct_status ct_ddp_create(ct_comm *c, ct_model *m, const ct_dist_config *cfg, ct_ddp **out);
void ct_ddp_destroy(ct_ddp *d);
/* The step hooks (h->ctx is d): install with ct_step_set_hooks. */
void ct_ddp_hooks(ct_ddp *d, ct_step_hooks *h);
/* A device-resident model's collectives run on the device's collective
 * stream and the sync hook checks each step's one step later, with the
 * deadline; this waits for the last step's the same way. ct_fit calls it
 * before it reads an epoch's last results, so a peer that hangs in the
 * last step is an error, not a wait without end. CT_OK at once for host
 * models. */
ct_status ct_ddp_finish(ct_ddp *d);
/* Rank 0's parameters and buffers to every rank (the start of a run). */
ct_status ct_ddp_broadcast_state(ct_ddp *d);
/* Compares a hash of the parameters across ranks: CT_ERR_INTERNAL naming
 * the step when any rank differs from rank 0. */
ct_status ct_ddp_check_sync(ct_ddp *d, int64_t step);
int ct_ddp_bucket_count(const ct_ddp *d);
/* This rank's shard of the flat parameter buffer under ZeRO (the whole
 * buffer without it): the optimizer is created for hi - lo parameters
 * and ct_step_config.shard_lo/hi set to these. */
void ct_ddp_shard(const ct_ddp *d, size_t *lo, size_t *hi);
/* ZeRO-2 on a GPU (cfg->zero 2, its bucket sizes; m prepared or to be
 * prepared on a CUDA device as rank of size ranks). The model keeps no
 * whole gradient buffer: the backward writes each gradient bucket into
 * one of two bucket-sized slots (bucket k into slot k % 2),
 * reduce-scattered from there into the rank's shard, so it holds the
 * shard plus the two slots, *held bytes, instead of the whole buffer's
 * *whole. A slot holds whole parameters: where one large parameter or
 * large buckets make that no less, the gradients stay whole, as under
 * ZeRO-1, and *slots is 0. With *slots 1 the next
 * ct_model_prepare leaves the whole buffer out and counts *held in its
 * memory check; call this before it, or ct_ddp_create prepares the model
 * once more to drop the buffer. Accumulation (micro-steps) is refused
 * with slots: they hold one micro-batch's gradients. A host model's
 * prepare ignores the reservation (its ZeRO-2 returns pages instead). */
ct_status ct_ddp_zero2_plan(ct_model *m, const ct_dist_config *cfg, int rank, int size, int *slots, size_t *held,
                             size_t *whole);
/* ZeRO-2 with slots: the shard's reduced gradients (hi - lo values in
 * device memory), for ct_step_config.shard_grads; NULL otherwise. After
 * ct_ddp_destroy such a model has no gradients until prepared again. */
float *ct_ddp_shard_grads(const ct_ddp *d);
/* Gathers every rank's shard of opt (a sharded optimizer, hi - lo
 * parameters) into full (one of the whole buffer's size, same
 * configuration), on every rank: what a checkpoint saves. */
ct_status ct_ddp_gather_optimizer(ct_ddp *d, const ct_optimizer *opt, ct_optimizer *full);
/* Where the steps' communication time went, since create. */
typedef struct ct_ddp_stats {
  int64_t steps;        /* sync hooks run */
  double wait_seconds;  /* in the sync hook, waiting for buckets: communication the backward did not hide */
  double bytes;         /* gradient bytes all-reduced by this rank */
  double released_bytes; /* ZeRO-2: gradient bytes returned to the OS after their reduction */
} ct_ddp_stats;
void ct_ddp_get_stats(const ct_ddp *d, ct_ddp_stats *st);

/* One named value each rank contributes to a start-up comparison. */
typedef struct ct_dist_field {
  const char *name;  /* "batch size", "model", ... */
  uint64_t value;    /* the value, or a hash of it (ct_dist_hash) */
  int is_hash;       /* 1: value is a hash (the message then shows no numbers) */
} ct_dist_field;

/* FNV-1a of bytes, to put a string or a structure into a ct_dist_field. */
uint64_t ct_dist_hash(const void *p, size_t n, uint64_t h);
/* Compares fields[0..n) across ranks (the same names in the same order
 * on every rank): CT_ERR_INVALID_ARG naming the first field where a rank
 * differs from rank 0, with both values, on every rank. */
ct_status ct_dist_check_same(ct_comm *c, const ct_dist_field *fields, int n);

#ifdef __cplusplus
}
#endif
#endif
