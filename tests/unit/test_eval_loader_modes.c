/* ct_evaluate and ct_predict on the CPU (runs everywhere; the cuda side is
 * test_gpu_eval_modes):
 *  - loaders in the GPU data modes (CT_LOADER_RAW_U8, CT_LOADER_INDICES)
 *    are refused on the cpu device with CT_ERR_UNSUPPORTED and a message
 *    naming the device and --device cuda, before predict's callback sees
 *    any sample, and a refused loader can be asked again (nothing stays
 *    attached to it);
 *  - on a float loader the two passes agree with each other: the mean of
 *    -log p[label] over predict's probabilities is evaluate's loss, the
 *    share of argmax == label its accuracy (random uint8 images, a partial
 *    last batch). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "ctrain/trainer.h"
#include "test_util.h"

enum { N = 77, C = 1, H = 28, W = 28, CLASSES = 10, BATCH = 16 };

typedef struct acc {
  int64_t count, hits;
  double nll;
} acc;

static ct_status add_sample(void *ctx, int64_t index, const float *p, int64_t k, int64_t label) {
  acc *a = ctx;
  if (index != a->count || k != CLASSES || label < 0 || label >= k)
    return ct_error(CT_ERR_INTERNAL, "predict callback: index %lld, %lld classes, label %lld", (long long)index,
                    (long long)k, (long long)label);
  int64_t best = 0;
  for (int64_t j = 1; j < k; j++)
    if (p[j] > p[best]) best = j;
  a->hits += best == label;
  a->nll -= log((double)p[label]);
  a->count++;
  return CT_OK;
}

static ct_loader *loader(const ct_dataset *ds, int mode) {
  ct_loader_options o;
  ct_loader_options_default(&o);
  o.batch_size = BATCH, o.mode = mode, o.workers = 1;
  o.transform.normalize = 1, o.transform.mean[0] = 0.3f, o.transform.std[0] = 0.25f;
  ct_loader *l = NULL;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  return l;
}

int main(void) {
  ct_rng g;
  ct_rng_init(&g, 1234, CT_RNG_TEST, 0, 0);
  uint8_t *px = malloc((size_t)N * C * H * W);
  int64_t labels[N];
  for (size_t i = 0; i < (size_t)N * C * H * W; i++) px[i] = (uint8_t)ct_rng_u32(&g);
  for (int i = 0; i < N; i++) labels[i] = (int64_t)ct_rng_below(&g, CLASSES);
  ct_dataset *ds = NULL;
  ct_device *cpu = NULL;
  ct_model *m = NULL;
  ct_model_options mo = {C, H, W, CLASSES, 5};
  CHECK_OK(ct_dataset_from_memory("rand", N, C, H, W, CLASSES, px, labels, &ds));
  CHECK_OK(ct_device_open("cpu", &cpu));
  CHECK_OK(ct_model_create("cnn", &mo, &m));
  if (m) CHECK_OK(ct_model_prepare(m, cpu, BATCH, 0));
  if (!ds || !cpu || !m) return test_summary("eval_loader_modes");

  const int modes[2] = {CT_LOADER_RAW_U8, CT_LOADER_INDICES};
  for (int i = 0; i < 2; i++) {
    ct_loader *l = loader(ds, modes[i]);
    for (int round = 0; round < 2; round++) {
      ct_eval_result er;
      ct_status s = ct_evaluate(m, cpu, l, CT_LOSS_CROSS_ENTROPY, 0.0f, &er);
      CHECK_MSG(s == CT_ERR_UNSUPPORTED, "evaluate, mode %d: %s", modes[i], ct_status_name(s));
      CHECK_MSG(strstr(ct_last_error(), "cpu") && strstr(ct_last_error(), "--device cuda"),
                "evaluate, mode %d: message should name the device and --device cuda: %s", modes[i], ct_last_error());
      acc a = {0, 0, 0};
      s = ct_predict(m, cpu, l, add_sample, &a);
      CHECK_MSG(s == CT_ERR_UNSUPPORTED, "predict, mode %d: %s", modes[i], ct_status_name(s));
      CHECK_MSG(a.count == 0, "predict, mode %d: %lld samples reached the callback", modes[i], (long long)a.count);
    }
    ct_loader_destroy(l);
  }

  ct_loader *l = loader(ds, CT_LOADER_FLOAT);
  ct_eval_result er;
  acc a = {0, 0, 0};
  CHECK_OK(ct_evaluate(m, cpu, l, CT_LOSS_CROSS_ENTROPY, 0.0f, &er));
  CHECK_OK(ct_predict(m, cpu, l, add_sample, &a));
  CHECK(er.samples == N && a.count == N);
  double loss = a.nll / (double)N, accuracy = (double)a.hits / (double)N;
  printf("evaluate: loss %.7f acc %.4f; from predict: loss %.7f acc %.4f\n", er.loss, er.accuracy, loss, accuracy);
  CHECK_MSG(fabs(er.loss - loss) <= 1e-5 * fmax(1.0, fabs(loss)), "loss %.9g vs %.9g from predict", er.loss, loss);
  CHECK_MSG(fabs(er.accuracy - accuracy) < 1e-12, "accuracy %.6f vs %.6f from predict", er.accuracy, accuracy);
  CHECK(er.loss > 0.1); /* random weights on random data: not a trivial zero */
  ct_loader_destroy(l);

  ct_model_destroy(m);
  ct_device_close(cpu);
  ct_dataset_close(ds);
  free(px);
  return test_summary("eval_loader_modes");
}
