/* Train the zoo's cnn with ct_fit, report the test accuracy and save the
 * weights: the README's C example, whole.
 *
 *   fit [DATASET [WEIGHTS]]   DATASET: fashion-mnist, mnist:DIR, synthetic:N
 *                             (default synthetic:2048); WEIGHTS: the
 *                             safetensors file to write (cnn.safetensors) */
#include <stdio.h>

#include <ctrain/ctrain.h>

#define TRY(call)                                         \
  do {                                                    \
    if ((call) != CT_OK) {                                \
      fprintf(stderr, "fit: %s\n", ct_last_error());      \
      return 1;                                           \
    }                                                     \
  } while (0)

int main(int argc, char **argv) {
  const char *data = argc > 1 ? argv[1] : "synthetic:2048", *out = argc > 2 ? argv[2] : "cnn.safetensors";
  ct_device *dev;
  ct_model *m;
  ct_dataset *train, *test;
  ct_loader *lt, *lv;
  TRY(ct_device_open("cpu", &dev));
  ct_model_options mo = {.in_channels = 1, .height = 28, .width = 28, .num_classes = 10};
  TRY(ct_model_create("cnn", &mo, &m));
  TRY(ct_model_prepare(m, dev, 128, 1)); /* plans and allocates the step's memory */
  TRY(ct_dataset_open(data, 1, NULL, &train));
  TRY(ct_dataset_open(data, 0, NULL, &test));
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = 128;
  lo.shuffle = 1;
  TRY(ct_loader_create(train, &lo, &lt));
  lo.shuffle = 0;
  TRY(ct_loader_create(test, &lo, &lv));

  ct_train_config cfg;
  ct_train_config_default(&cfg);
  cfg.epochs = 2;
  cfg.optim = ct_optim_config_default(CT_OPTIM_ADAM);
  cfg.optim.lr = 0.002;
  ct_fit_result res;
  TRY(ct_fit(m, dev, lt, lv, &cfg, &res));
  printf("%d epochs, %lld steps: test accuracy %.4f, loss %.4f\n", res.epochs_run, (long long)res.steps,
         res.val.accuracy, res.val.loss);
  TRY(ct_weights_save(m, out));
  printf("weights: %s\n", out);

  ct_fit_result_free(&res);
  ct_loader_destroy(lv);
  ct_loader_destroy(lt);
  ct_dataset_close(test);
  ct_dataset_close(train);
  ct_model_destroy(m);
  ct_device_close(dev);
  return 0;
}
