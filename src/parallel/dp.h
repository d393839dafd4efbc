/* DataParallel: one process, a persistent replica of the model on each of
 * R devices, each global batch split across them.
 *
 * Replica 0 is the caller's model; the others are ct_model_replicate
 * copies prepared on their own devices, each with its own step and its
 * own optimizer (started as a copy of replica 0's), so each replica
 * updates itself and nothing is copied again per step. A global batch of
 * n samples is cut into R consecutive slices (sizes differing by at most
 * one); replica r's loss gradient carries its slice's share n_r / n and
 * its samples keep their numbers in the global batch (dropout), and the
 * replicas run their phases at once, each on its device's thread. The
 * sync hook sums the gradients in shared memory (each replica adds one
 * chunk over all replicas, in replica order, so every replica holds the
 * same bits) and copies replica 0's buffers (running statistics) to the
 * others; the reduce hook sums the metrics. A slice can be empty only in
 * a last batch smaller than R: that replica then runs the batch's first
 * sample with a loss share of 0 and its metrics left out.
 *
 * The devices are all virtual host devices (cpu:N, ref:N), whose sum reads
 * every replica's memory, or all GPUs (cuda:N, distinct), whose replicas
 * join one communicator of the backend's collectives (NCCL's, a rank per
 * device in this process). There each bucket of gradients (DDP's,
 * parallel/buckets.h) is all-reduced on the device's collective stream as
 * soon as the backward has queued its last gradient, and the sync hook
 * queues the rest and rank 0's buffers: the update waits on the device,
 * and the host checks the previous step's within DP_TIMEOUT_S. Each device gets a thread of its own
 * (ct_device_start_worker) to drive its replica.
 */
#ifndef CTRAIN_PARALLEL_DP_H
#define CTRAIN_PARALLEL_DP_H

#include "ctrain/data.h"
#include "ctrain/dist.h"
#include "ctrain/step.h"

typedef struct ct_dp ct_dp;

/* R = dist->dp_count replicas: step0's model, optimizer and configuration
 * on dist->dp_devices[0], and new replicas on the others prepared for
 * max_batch (ceil(global batch / R)), their optimizers (of configuration
 * oc, step0's) copied from step0's. GPUs take dist's bucket sizes. */
ct_status ct_dp_create(ct_step *step0, const ct_step_config *sc, const ct_optim_config *oc, const ct_dist_config *dist,
                       int64_t max_batch, ct_dp **out);
void ct_dp_destroy(ct_dp *dp);
/* One global batch through every replica (ct_step_train's contract);
 * the result is replica 0's with the metrics summed, batch = b. */
ct_status ct_dp_train(ct_dp *dp, ct_batch *b, const ct_step_pos *pos, ct_step_result *done, int *have);
/* ct_step_drain on every replica at once (their lagged read-backs sum
 * metrics across replicas); the result is replica 0's. */
ct_status ct_dp_drain(ct_dp *dp, ct_step_result *done, int *have);
/* An eval-mode forward of b split over the replicas: the sums of loss x
 * n, top-1 and top-5 hits added to sums[0..2]. */
ct_status ct_dp_eval(ct_dp *dp, const ct_batch *b, ct_loss_kind loss, float label_smoothing, double sums[3]);
/* Waits (within the timeout) for the GPU replicas' last collectives: at
 * the end of an epoch, before anything reads the weights. CT_OK at once
 * on host devices. */
ct_status ct_dp_finish(ct_dp *dp);
int ct_dp_replicas(const ct_dp *dp);
/* Replica r's model, and the handle ct_dp_norm_sum takes for it. */
ct_model *ct_dp_model(ct_dp *dp, int r);
void *ct_dp_replica(ct_dp *dp, int r);
/* SyncBatchNorm's sum over the replicas (called by each replica's batch
 * norms during its passes, replica the handle above): vals[0..n) summed
 * in replica order, in place (ct_norm_sync.sum; on GPUs by their
 * collectives). */
ct_status ct_dp_norm_sum(void *replica, double *vals, int n);
/* Whether the replica holds no samples of this step (ct_norm_sync.excluded). */
int ct_dp_norm_excluded(void *replica);

#endif
