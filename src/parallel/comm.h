/* The collectives ctrain runs over a ct_comm (include/ctrain/dist.h).
 *
 * Sums are in place. Every call names what it is for (`what`, e.g.
 * "all-reduce of gradient bucket 2 of 5, step 12"): the text an error or
 * a timeout reports. A started collective is a slot index, finished by
 * ct_comm_wait (the buffer must stay untouched until then); ct_comm_test
 * drives it without waiting, which is how a bucket's all-reduce makes
 * progress while the backward computes on the same thread. Every rank
 * must start the same collectives in the same order.
 */
#ifndef CTRAIN_PARALLEL_COMM_H
#define CTRAIN_PARALLEL_COMM_H

#include <stddef.h>

#include "ctrain/dist.h"
#include "ctrain/dtype.h"

ct_status ct_comm_allreduce_start(ct_comm *c, void *buf, size_t count, ct_dtype dt, const char *what, int *req);
/* Rank r's part of buf (counts[r] values, after the parts of the ranks
 * before it; buf holds them all on every rank) summed over ranks: when
 * the collective is done that part holds the sum and the rest of buf is
 * zero (ZeRO's reduce-scatter of gradients, whose gaps must stay zero). */
ct_status ct_comm_reduce_scatter_start(ct_comm *c, void *buf, const size_t *counts, ct_dtype dt, const char *what,
                                       int *req);
/* Every rank's part of buf (laid out as above) to every rank (ZeRO's
 * all-gather of the updated parameters); blocking. */
ct_status ct_comm_allgatherv(ct_comm *c, void *buf, const size_t *counts, ct_dtype dt, const char *what);
ct_status ct_comm_test(ct_comm *c, int req, int *done);
ct_status ct_comm_wait(ct_comm *c, int req);

#endif
