#include "cli/metrics_json.h"

#include <math.h>
#include <stdio.h>

#include "ctrain/atomic_file.h"

static void num(FILE *f, const char *key, double v, int comma) {
  if (isfinite(v)) fprintf(f, "  \"%s\": %.17g%s\n", key, v, comma ? "," : "");
  else fprintf(f, "  \"%s\": null%s\n", key, comma ? "," : "");
}

ct_status cli_write_metrics_json(const char *path, const cli_metrics *m) {
  ct_atomic_file *af;
  CT_TRY(ct_atomic_file_open(path, &af));
  FILE *f = ct_atomic_file_stream(af);
  fprintf(f, "{\n  \"model\": \"%s\",\n  \"dataset\": \"%s\",\n  \"device\": \"%s\",\n  \"precision\": \"%s\",\n", m->model,
          m->dataset, m->device, m->precision);
  fprintf(f, "  \"seed\": %llu,\n", (unsigned long long)m->seed);
  if (m->res) {
    const ct_fit_result *r = m->res;
    fprintf(f, "  \"epochs\": %d,\n  \"steps\": %lld,\n", r->epochs_run, (long long)r->steps);
    num(f, "train_loss", r->train_loss, 1);
    num(f, "train_accuracy", r->train_accuracy, 1);
    num(f, "test_loss", r->val.loss, 1);
    num(f, "test_accuracy", r->val.accuracy, 1);
    num(f, "test_top5", r->val.top5, 1);
    num(f, "images_per_second", r->images_per_second, 1);
    fprintf(f, "  \"epoch_seconds\": [");
    for (int i = 0; i < r->epochs_run; i++) fprintf(f, "%s%.6f", i ? ", " : "", r->epoch_seconds[i]);
    fprintf(f, "],\n  \"stopped_early\": %s,\n", r->stopped_early ? "true" : "false");
    fprintf(f, "  \"stopped_by_signal\": %d,\n  \"already_done\": %s,\n", r->stopped_by,
            r->already_done ? "true" : "false");
    fprintf(f, "  \"resumed_from_epoch\": %d,\n", r->resumed_from_epoch);
    if (m->opt_level) fprintf(f, "  \"opt_level\": \"%s\",\n", m->opt_level);
    fprintf(f, "  \"skipped_steps\": %lld,\n", (long long)r->skipped_steps);
    if (m->gradient_bytes) fprintf(f, "  \"gradient_bytes\": %zu,\n", m->gradient_bytes);
    num(f, "loss_scale", r->loss_scale, 1);
    fprintf(f, "  \"peak_memory_bytes\": %zu,\n", r->peak_memory_bytes);
    fprintf(f, "  \"device_peak_bytes\": %zu\n}\n", r->device_peak_bytes);
  } else if (m->eval) {
    num(f, "test_loss", m->eval->loss, 1);
    num(f, "test_accuracy", m->eval->accuracy, 1);
    num(f, "test_top5", m->eval->top5, 1);
    fprintf(f, "  \"samples\": %lld\n}\n", (long long)m->eval->samples);
  }
  if (ferror(f)) {
    ct_atomic_file_abort(af);
    return ct_error(CT_ERR_IO, "%s: write failed", path);
  }
  return ct_atomic_file_commit(af);
}
