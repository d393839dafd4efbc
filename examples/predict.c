/* Load weights into a model and predict: the class of every test sample
 * of a dataset, from weights ctrain (or `fit`) saved.
 *
 *   predict WEIGHTS [DATASET [MODEL]]   (default synthetic:2048, cnn) */
#include <stdio.h>

#include <ctrain/ctrain.h>

#define TRY(call)                                         \
  do {                                                    \
    if ((call) != CT_OK) {                                \
      fprintf(stderr, "predict: %s\n", ct_last_error());  \
      return 1;                                           \
    }                                                     \
  } while (0)

typedef struct tally {
  int64_t n, right;
} tally;

static ct_status one(void *ctx, int64_t index, const float *probs, int64_t classes, int64_t label) {
  tally *t = ctx;
  int64_t best = 0;
  for (int64_t c = 1; c < classes; c++)
    if (probs[c] > probs[best]) best = c;
  if (t->n < 5) printf("sample %lld: class %lld (p %.3f), label %lld\n", (long long)index, (long long)best,
                       probs[best], (long long)label);
  t->n++, t->right += best == label;
  return CT_OK;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: predict WEIGHTS [DATASET [MODEL]]\n");
    return 2;
  }
  const char *data = argc > 2 ? argv[2] : "synthetic:2048", *model = argc > 3 ? argv[3] : "cnn";
  ct_device *dev;
  ct_model *m;
  ct_dataset *ds;
  ct_loader *ld;
  TRY(ct_device_open("cpu", &dev));
  ct_model_options mo = {.in_channels = 1, .height = 28, .width = 28, .num_classes = 10};
  TRY(ct_model_create(model, &mo, &m));
  TRY(ct_weights_load(m, argv[1], 1, NULL)); /* strict: every tensor, by name and shape */
  TRY(ct_model_prepare(m, dev, 256, 0));      /* inference: no gradients, no optimizer */
  TRY(ct_dataset_open(data, 0, NULL, &ds));
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = 256;
  TRY(ct_loader_create(ds, &lo, &ld));
  tally t = {0, 0};
  TRY(ct_predict(m, dev, ld, one, &t));
  printf("%lld samples, %lld predicted right (%.4f)\n", (long long)t.n, (long long)t.right,
         (double)t.right / (double)(t.n ? t.n : 1));
  ct_loader_destroy(ld);
  ct_dataset_close(ds);
  ct_model_destroy(m);
  ct_device_close(dev);
  return 0;
}
