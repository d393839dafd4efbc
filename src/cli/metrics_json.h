/* --metrics-json: the run's final numbers as one JSON object. */
#ifndef CTRAIN_CLI_METRICS_JSON_H
#define CTRAIN_CLI_METRICS_JSON_H

#include "ctrain/trainer.h"

typedef struct cli_metrics {
  const char *model, *dataset, *device, *precision;
  uint64_t seed;
  const ct_fit_result *res;        /* train: everything; NULL for eval */
  const ct_eval_result *eval;      /* eval only */
  const char *opt_level;           /* train only; NULL leaves it out */
  size_t gradient_bytes;           /* train on a GPU: the device bytes of the gradients (0 leaves it out) */
} cli_metrics;

/* Written atomically; fields listed in docs/CLI.md. */
ct_status cli_write_metrics_json(const char *path, const cli_metrics *m);

#endif
