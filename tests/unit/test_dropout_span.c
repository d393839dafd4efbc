/* Dropout's masks by sample number (ct_dropout_key's sample span): a
 * batch split over R ranks (rank r holds samples r, r + R, ...) or into
 * micro-batches (consecutive runs) draws, sample by sample, exactly the
 * masks of the whole batch, forward and backward, on ref and cpu, for
 * elementwise dropout and Dropout2d. This is what makes data parallel and
 * accumulation train a dropout model as one device does. */
#include "backend/backend.h"
#include "test_util.h"

enum { N = 6, C = 4, HW = 5, PER = C * HW };

static void run(ct_device *d, float p, int64_t group, ct_dropout_key k, const float *x, float *y, int64_t n, int bwd) {
  const ct_backend *be = ct_device_backend(d);
  int64_t shape[2] = {n, PER};
  ct_tensor tx = ct_tensor_view((void *)x, CT_F32, 2, shape), ty = ct_tensor_view(y, CT_F32, 2, shape);
  tx.device = ty.device = d;
  CHECK_OK(bwd ? be->dropout_bwd(d, p, group, k, &tx, &ty) : be->dropout_fwd(d, p, group, k, &tx, &ty));
}

static void split(ct_device *d, int64_t group, int bwd) {
  float x[N * PER], whole[N * PER], part[N * PER], px[N * PER];
  for (int i = 0; i < N * PER; i++) x[i] = 1.0f + (float)i;
  const float p = 0.5f;
  ct_dropout_key k = {77, 2, 9, 0, 0, PER / group};
  run(d, p, group, k, x, whole, N, bwd);
  int dropped = 0;
  for (int i = 0; i < N * PER; i++) dropped += whole[i] == 0;
  CHECK_MSG(dropped > 0 && dropped < N * PER, "%s: %d of %d dropped", ct_device_name(d), dropped, N * PER);
  /* R strided shares, and (stride 1) R consecutive micro-batches. */
  for (int R = 2; R <= 3; R++)
    for (int strided = 0; strided < 2; strided++)
      for (int r = 0; r < R; r++) {
        int n = 0, first = strided ? r : r * (N / R);
        for (int i = 0; i < N / R; i++) {
          int s = strided ? r + i * R : first + i;
          memcpy(px + n * PER, x + s * PER, sizeof(float) * PER);
          n++;
        }
        ct_dropout_key kr = k;
        kr.sample_offset = (uint64_t)first, kr.sample_stride = strided ? (uint64_t)R : 1;
        run(d, p, group, kr, px, part, n, bwd);
        for (int i = 0; i < n; i++) {
          int s = strided ? r + i * R : first + i;
          CHECK_MSG(!memcmp(part + i * PER, whole + s * PER, sizeof(float) * PER),
                    "%s group %lld %s: %s share %d of %d, sample %d: masks differ from the whole batch's",
                    ct_device_name(d), (long long)group, bwd ? "backward" : "forward", strided ? "strided" : "micro",
                    r, R, s);
        }
      }
}

int main(void) {
  const char *names[] = {"ref", "cpu"};
  for (int i = 0; i < 2; i++) {
    ct_device *d;
    CHECK_OK(ct_device_open(names[i], &d));
    if (!d) continue;
    for (int bwd = 0; bwd < 2; bwd++) {
      split(d, 1, bwd);
      split(d, HW, bwd);
    }
    ct_device_close(d);
  }
  return test_summary("test_dropout_span");
}
