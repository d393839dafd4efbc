/* Accuracy bookkeeping shared by fit and evaluate. */
#ifndef CTRAIN_TRAIN_METRICS_H
#define CTRAIN_TRAIN_METRICS_H

#include <math.h>
#include <stdint.h>

/* Adds to *top1 / *top5 the number of samples whose label is the top-1 /
 * within the top-5 scores. A NaN score ranks above every number (as
 * torch.argmax takes it); a NaN score of the true class is always wrong. */
void ct_batch_correct(const float *scores, const int64_t *labels, int64_t n, int64_t k, int64_t *top1, int64_t *top5);

#endif
