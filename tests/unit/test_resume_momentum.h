/* The check of test_resume_momentum.c and test_gpu_resume_momentum.c on a
 * named device. */
#ifndef CTRAIN_TEST_RESUME_MOMENTUM_H
#define CTRAIN_TEST_RESUME_MOMENTUM_H

#include <dirent.h>
#include <unistd.h>

#include "test_util.h"

#include "ctrain/trainer.h"

static const char *RM_MODEL = "input 1x8x8\nconv2d 1 4 3 padding=1\nrelu\nmaxpool2d 2\nflatten\nlinear 64 10\n";

/* Trains a fresh model (seed 7) on ds for 2 epochs of 4 batches, or stops
 * after max_steps, with checkpoints in dir (resume: from there); returns
 * the weights (malloc'd) or NULL. */
static float *rm_train(const char *device, const char *model, ct_dataset *ds, const char *dir, int64_t max_steps,
                       int resume, size_t *np) {
  ct_device *dev = NULL;
  ct_model *m = NULL;
  ct_loader *l = NULL;
  float *w = NULL;
  CHECK_OK(ct_device_open(device, &dev));
  ct_model_options mo = {0};
  mo.seed = 7;
  if (dev) CHECK_OK(ct_model_create(model, &mo, &m));
  if (m) CHECK_OK(ct_model_prepare(m, dev, 16, 1));
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = 16;
  CHECK_OK(ct_loader_create(ds, &lo, &l));
  ct_train_config cfg;
  ct_train_config_default(&cfg);
  cfg.epochs = 2;
  cfg.max_steps = max_steps;
  cfg.seed = 3;
  cfg.optim = ct_optim_config_default(CT_OPTIM_SGD);
  cfg.optim.lr = 0.05; /* momentum 0: OneCycle turns it on */
  cfg.use_scheduler = 1;
  cfg.sched = ct_sched_config_default(CT_SCHED_ONECYCLE);
  cfg.sched.max_lr = cfg.optim.lr;
  cfg.sched.total_steps = 8;
  cfg.sched.cycle_momentum = 1;
  cfg.sched_per_step = 1;
  cfg.checkpoint_dir = dir;
  cfg.resume = resume;
  ct_fit_result res;
  memset(&res, 0, sizeof res);
  if (m && l) {
    ct_status s = ct_fit(m, dev, l, NULL, &cfg, &res);
    CHECK_MSG(s == CT_OK, "%s: ct_fit (max_steps %lld, resume %d): %s", device, (long long)max_steps, resume,
              ct_last_error());
    if (s == CT_OK) {
      const float *p = ct_model_params(m, np);
      w = malloc(*np * sizeof *w);
      memcpy(w, p, *np * sizeof *w);
    }
  }
  ct_fit_result_free(&res);
  ct_loader_destroy(l);
  ct_model_destroy(m);
  ct_device_close(dev);
  return w;
}

/* Removes a checkpoint directory's files (no subdirectories) and itself. */
static void rm_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
  closedir(d);
  rmdir(dir);
}

static void resume_momentum_check(const char *device) {
  char model[512], dir_a[512], dir_b[512];
  snprintf(model, sizeof model, "%s/rm_model_%d.txt", test_tmpdir(), (int)getpid());
  snprintf(dir_a, sizeof dir_a, "%s/rm_a_%s_%d", test_tmpdir(), device, (int)getpid());
  snprintf(dir_b, sizeof dir_b, "%s/rm_b_%s_%d", test_tmpdir(), device, (int)getpid());
  FILE *f = fopen(model, "w");
  if (f) fputs(RM_MODEL, f), fclose(f);
  uint64_t rs = 0x9e3779b97f4a7c15ull;
  uint8_t px[64 * 64];
  int64_t y[64];
  for (int i = 0; i < 64; i++) {
    y[i] = (int64_t)(test_xorshift(&rs) % 10);
    for (int j = 0; j < 64; j++) px[i * 64 + j] = (uint8_t)(test_xorshift(&rs) >> 56);
  }
  ct_dataset *ds = NULL;
  CHECK_OK(ct_dataset_from_memory("rm", 64, 1, 8, 8, 10, px, y, &ds));
  size_t na = 0, nb = 0;
  float *a = ds ? rm_train(device, model, ds, dir_a, 0, 0, &na) : NULL;
  float *b1 = ds ? rm_train(device, model, ds, dir_b, 6, 0, &nb) : NULL; /* stops in epoch 2 */
  float *b = b1 ? rm_train(device, model, ds, dir_b, 0, 1, &nb) : NULL;
  if (a && b) {
    CHECK_MSG(na == nb && !memcmp(a, b, na * sizeof *a), "%s: resumed weights differ from the uninterrupted run's",
              device);
    CHECK_MSG(memcmp(a, b1, na * sizeof *a) != 0, "%s: the interrupted run already had the final weights", device);
  }
  free(a), free(b1), free(b);
  ct_dataset_close(ds);
  unlink(model);
  rm_remove_dir(dir_a);
  rm_remove_dir(dir_b);
}

#endif
