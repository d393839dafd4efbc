/* Gradient accumulation bookkeeping (see accumulate.h). */
#include "train/accumulate.h"

ct_accum_pos ct_accum_position(int accumulate, int64_t batch, int64_t n, int64_t batches, int64_t order_n,
                               int64_t batch_size) {
  ct_accum_pos p = {0, 1, 1, n, 1.0};
  if (accumulate <= 1) return p;
  int64_t g0 = batch / accumulate * accumulate, g1 = g0 + accumulate;
  if (g1 > batches) g1 = batches;
  p.index = (int)(batch - g0);
  p.first = batch == g0;
  p.last = batch + 1 >= g1;
  /* The group's size has to be known at its first batch (its loss
   * gradient is scaled before the later batches exist): batch k holds
   * order[k*B ...], at most B and at most what is left of the order. */
  int64_t total = 0;
  for (int64_t k = g0; k < g1; k++) {
    int64_t left = order_n - k * batch_size;
    total += left < batch_size ? (left > 0 ? left : 0) : batch_size;
  }
  p.group_n = total > 0 ? total : n;
  p.factor = (double)n / (double)p.group_n;
  return p;
}

int64_t ct_accum_steps_per_epoch(int accumulate, int64_t batches) {
  if (accumulate <= 1) return batches;
  return (batches + accumulate - 1) / accumulate;
}
