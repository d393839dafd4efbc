/* Classification metrics over a batch of scores [N, K]. */
#include "train/metrics.h"

void ct_batch_correct(const float *scores, const int64_t *labels, int64_t n, int64_t k, int64_t *top1, int64_t *top5) {
  int64_t c1 = 0, c5 = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *s = scores + i * k;
    int64_t y = labels[i];
    float sy = (y >= 0 && y < k) ? s[y] : -INFINITY;
    /* Rank of the true class: how many classes score strictly higher (ties
     * broken toward the lower index, as torch.topk/argmax do). */
    int64_t rank = sy != sy ? k : 0; /* a NaN score never ranks: the row is wrong */
    for (int64_t j = 0; j < k; j++)
      if (s[j] > sy || (s[j] == sy && j < y) || s[j] != s[j]) rank++;
    c1 += rank < 1;
    c5 += rank < 5;
  }
  *top1 += c1;
  *top5 += c5;
}
