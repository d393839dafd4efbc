/* ct_model_memory_report (src/exec/memory_report.c): refused before
 * prepare; on prepared models it names an owner (layer and role) for every
 * buffer alive at the plan's peak, its kinds add up to the live bytes,
 * live bytes plus gaps are the arena (ct_model_plan_bytes), and the
 * largest-buffer list is sorted and as long as asked. Run over plans that
 * hold every kind of buffer: plain training (lenet5, alexnet), autocast
 * cast copies (alexnet fp16), recompute buffers (resnet18 in segments and
 * in the cheap mode), the loss's fp32 copies (mlp with 1000 classes), and
 * an inference plan. Which time is the peak and
 * what lives then is the planner's (test_plan, test_recompute); this test
 * checks the report's bookkeeping. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#include "nn/model_impl.h"

typedef struct report {
  double arena, hold, gaps, kinds_sum;
  int n_live, kinds_count, n_listed, sorted, unowned, training;
  char text[1 << 16];
} report;

/* "  <kind name> <MB> MB  (<count>)": the figures are read from the end,
 * since a kind's name may hold digits ("fp32 output copies ..."). */
static int kind_line(const char *line, double *mb, int *cnt) {
  const char *u = strstr(line, " MB  (");
  if (!u || sscanf(u, " MB  (%d)", cnt) != 1) return 0;
  const char *v = u;
  while (v > line && (isdigit((unsigned char)v[-1]) || v[-1] == '.')) v--;
  return v < u && sscanf(v, "%lf", mb) == 1;
}

static int parse(ct_model *m, int top, report *r) {
  memset(r, 0, sizeof *r);
  FILE *f = tmpfile();
  if (!f) return -1;
  ct_status s = ct_model_memory_report(m, top, f);
  size_t n = 0;
  if (s == CT_OK) {
    rewind(f);
    n = fread(r->text, 1, sizeof r->text - 1, f);
  }
  fclose(f);
  if (s != CT_OK) return -1;
  r->text[n] = 0;
  r->sorted = 1;
  double prev = -1;
  for (char *line = strtok(r->text, "\n"); line; line = strtok(NULL, "\n")) {
    double mb;
    int cnt;
    if (sscanf(line, "Memory plan of a training step: arena %lf", &r->arena) == 1) r->training = 1;
    else if (sscanf(line, "Memory plan of an inference step: arena %lf", &r->arena) == 1) r->training = 0;
    else if (sscanf(line, "%d buffers hold %lf MB (the arena's gaps: %lf", &cnt, &mb, &r->gaps) == 3)
      r->n_live = cnt, r->hold = mb; /* (sscanf writes what it matched before failing: temporaries) */
    else if (strncmp(line, "   ", 3) == 0 && sscanf(line, " %lf MB", &mb) == 1) {
      /* a listed buffer: "<MB> MB  <role> of layer ..." or, unowned, "buffer <id>" */
      r->n_listed++;
      if (prev >= 0 && mb > prev) r->sorted = 0;
      prev = mb;
      if (strstr(line, "MB  buffer ")) r->unowned++;
    } else if (strncmp(line, "  ", 2) == 0 && kind_line(line, &mb, &cnt)) {
      r->kinds_sum += mb;
      r->kinds_count += cnt;
      if (!strncmp(line + 2, "other ", 6)) r->unowned += cnt;
    }
  }
  return 0;
}

static void check_model(ct_device *dev, const char *name, int c, int h, int w, int classes, int64_t N,
                        ct_precision prec, int recompute, int training) {
  ct_model_options opt = {c, h, w, classes, 5};
  ct_model *m = NULL;
  ct_status s = ct_model_create(name, &opt, &m);
  if (s == CT_OK && prec != CT_PRECISION_FP32) s = ct_model_set_precision(m, prec, CT_OPT_O1);
  if (s == CT_OK && recompute) s = ct_model_set_recompute(m, recompute);
  if (s == CT_OK) s = ct_model_prepare(m, dev, N, training);
  CHECK_MSG(s == CT_OK, "%s: %s", name, ct_last_error());
  static report r;
  if (s == CT_OK && parse(m, 1000, &r) == 0) {
    const double mb = 1024.0 * 1024.0, arena = ct_model_plan_bytes(m) / mb;
    CHECK_MSG(r.training == training, "%s: report says %s step", name, r.training ? "training" : "inference");
    CHECK_MSG(r.arena > 0 && r.arena - arena < 0.006 && arena - r.arena < 0.006, "%s: arena %.2f MB, plan %.2f MB",
              name, r.arena, arena);
    CHECK_MSG(r.hold + r.gaps - r.arena < 0.015 && r.arena - r.hold - r.gaps < 0.015,
              "%s: %.2f MB live + %.2f MB gaps != arena %.2f MB", name, r.hold, r.gaps, r.arena);
    CHECK_MSG(r.kinds_count == r.n_live && r.kinds_sum - r.hold < 0.06 && r.hold - r.kinds_sum < 0.06,
              "%s: kinds %d buffers / %.2f MB, live %d / %.2f MB", name, r.kinds_count, r.kinds_sum, r.n_live, r.hold);
    CHECK_MSG(r.unowned == 0, "%s: %d live buffers without an owner", name, r.unowned);
    CHECK_MSG(r.n_listed == r.n_live && r.sorted, "%s: %d listed of %d live (sorted %d)", name, r.n_listed, r.n_live,
              r.sorted);
    printf("%-9s %-4s recompute %-5d %s: arena %8.2f MB, %3d live buffers %8.2f MB\n", name, ct_precision_name(prec),
           recompute, training ? "training " : "inference", r.arena, r.n_live, r.hold);
    /* top bounds the list */
    if (parse(m, 3, &r) == 0)
      CHECK_MSG(r.n_listed == (r.n_live < 3 ? r.n_live : 3), "%s: top 3 listed %d", name, r.n_listed);
  }
  ct_model_destroy(m);
}

int main(void) {
  ct_device *cpu;
  CHECK_OK(ct_device_open("cpu", &cpu));
  ct_model_options opt = {1, 28, 28, 10, 5};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create("lenet5", &opt, &m));
  FILE *f = tmpfile();
  CHECK(f != NULL);
  if (f) {
    CHECK(ct_model_memory_report(m, 10, f) == CT_ERR_INVALID_ARG);
    CHECK(ftell(f) == 0);
    fclose(f);
  }
  ct_model_destroy(m);

  check_model(cpu, "lenet5", 1, 28, 28, 10, 16, CT_PRECISION_FP32, 0, 1);
  check_model(cpu, "alexnet", 3, 64, 64, 10, 4, CT_PRECISION_FP32, 0, 1);
  check_model(cpu, "alexnet", 3, 64, 64, 10, 4, CT_PRECISION_FP16, 0, 1);
  check_model(cpu, "resnet18", 3, 32, 32, 10, 4, CT_PRECISION_BF16, 2, 1);
  check_model(cpu, "resnet18", 3, 32, 32, 10, 4, CT_PRECISION_FP32, CT_RECOMPUTE_CHEAP, 1);
  check_model(cpu, "convnet", 1, 28, 28, 10, 8, CT_PRECISION_BF16, CT_RECOMPUTE_AUTO, 1);
  check_model(cpu, "resnet18", 3, 32, 32, 10, 4, CT_PRECISION_FP32, 0, 0);
  /* the loss's fp32 copies of a wide output live at the peak ("fp32 ..."
   * is a kind name with digits) */
  check_model(cpu, "mlp", 1, 28, 28, 1000, 64, CT_PRECISION_FP16, 0, 1);
  ct_device_close(cpu);
  return test_summary("memory_report");
}
