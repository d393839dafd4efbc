/* A training loop of one's own over the public step (ct_step): what
 * ct_fit does inside, with the optimizer, the schedule and the batches in
 * the caller's hands. Each batch is one optimizer step; results come back
 * at once (the step's lag 0).
 *
 *   own_loop [DATASET [EPOCHS]]   (default synthetic:2048, 2) */
#include <stdio.h>
#include <stdlib.h>

#include <ctrain/ctrain.h>

#define TRY(call)                                          \
  do {                                                     \
    if ((call) != CT_OK) {                                 \
      fprintf(stderr, "own_loop: %s\n", ct_last_error());  \
      return 1;                                            \
    }                                                      \
  } while (0)

int main(int argc, char **argv) {
  const char *data = argc > 1 ? argv[1] : "synthetic:2048";
  int epochs = argc > 2 ? atoi(argv[2]) : 2;
  ct_device *dev;
  ct_model *m;
  ct_dataset *ds;
  ct_loader *ld;
  TRY(ct_device_open("cpu", &dev));
  ct_model_options mo = {.in_channels = 1, .height = 28, .width = 28, .num_classes = 10};
  TRY(ct_model_create("mlp", &mo, &m));
  TRY(ct_model_prepare(m, dev, 64, 1));
  TRY(ct_dataset_open(data, 1, NULL, &ds));
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = 64;
  lo.shuffle = 1;
  TRY(ct_loader_create(ds, &lo, &ld));

  size_t n;
  ct_model_params(m, &n);
  ct_optim_config oc = ct_optim_config_default(CT_OPTIM_SGD);
  oc.lr = 0.05;
  oc.momentum = 0.9;
  ct_optimizer *opt;
  TRY(ct_optimizer_create(&oc, n, &opt));
  ct_step_config sc;
  ct_step_config_default(&sc); /* cross entropy; lag 0 */
  ct_step *step;
  TRY(ct_step_create(m, dev, opt, &sc, &step));

  int64_t k = 0;
  for (int e = 0; e < epochs; e++) {
    TRY(ct_loader_start_epoch(ld, e, 0));
    double loss = 0;
    int64_t seen = 0, hits = 0;
    ct_batch *b;
    while (1) {
      TRY(ct_loader_next(ld, &b));
      if (!b) break;
      ct_step_pos pos = ct_step_pos_single(k++);
      ct_step_result r;
      int have;
      TRY(ct_step_train(step, b, &pos, &r, &have)); /* forward, loss, backward, clip, update */
      if (have) {
        loss += r.loss * (double)r.n, seen += r.n, hits += r.top1;
        ct_loader_release(ld, r.batch);
      }
    }
    printf("epoch %d: loss %.4f, accuracy %.4f over %lld samples\n", e + 1, loss / (double)seen,
           (double)hits / (double)seen, (long long)seen);
  }

  ct_step_destroy(step);
  ct_optimizer_destroy(opt);
  ct_loader_destroy(ld);
  ct_dataset_close(ds);
  ct_model_destroy(m);
  ct_device_close(dev);
  return 0;
}
