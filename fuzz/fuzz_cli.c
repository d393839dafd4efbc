/* libFuzzer target for the command line (see fuzz/README.md): the input's
 * first byte picks the subcommand (train, eval, predict, summary), the rest
 * split at NUL bytes is its argv, which goes through what main does before
 * any file is touched: train's and summary's data-parallel flags
 * (cli_take_dist_flags), cli_take_gpu_data_flags, then cli_parse with the
 * subcommand's real flag list. The parse must return 0 or the usage exit
 * code; an accepted line must leave every number inside the range its
 * flag documents and every string either a default or a piece of argv.
 *
 * The body is shared with tests/unit/test_cli_mutate.c (CT_FUZZ_BODY_ONLY),
 * which drives it with the deterministic mutation loop. Usage errors print
 * to stderr: run the fuzzer with -close_fd_mask=2. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "fuzz_entry.h"

enum { FUZZ_CLI_MAX_ARGS = 64 };

/* Whether s is NULL, one of the defaults cli_parse sets, or points into
 * the argument bytes [lo, hi). */
static int fuzz_cli_str_ok(const char *s, const char *lo, const char *hi) {
  static const char *const defaults[] = {"cpu", "sgd", "none", "cross_entropy", "val_loss", "channels-last"};
  if (!s || (s >= lo && s < hi)) return 1;
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
    if (!strcmp(s, defaults[i])) return 1;
  return 0;
}

static int fuzz_cli_one(const uint8_t *data, size_t size) {
  static const char *const cmds[4] = {"train", "eval", "predict", "summary"};
  static const char *const flags[4] = {CLI_FLAGS_TRAIN, CLI_FLAGS_EVAL, CLI_FLAGS_PREDICT, CLI_FLAGS_SUMMARY};
  if (size == 0) return 0;
  int c = data[0] % 4;
  /* The arguments as C strings: a copy with a terminating NUL. */
  char *buf = malloc(size);
  if (!buf) return 0;
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = 0;
  char *argv[FUZZ_CLI_MAX_ARGS + 1];
  int argc = 0;
  for (size_t at = 0; at < size - 1 && argc < FUZZ_CLI_MAX_ARGS; at += strlen(buf + at) + 1) argv[argc++] = buf + at;
  argv[argc] = NULL;

  int mode = -1, rc = 0;
  if (c == 0 || c == 3) {
    cli_dist d;
    int k = cli_take_dist_flags(cmds[c], argc, argv, &d);
    if (k > argc) rc = -1;
    if (k >= 0 && (d.zero < 0 || d.zero > 2 || d.nproc < 0 || d.nproc > 4096 || d.check_sync < 0 ||
                   (d.bucket_mb != 0 && (d.bucket_mb < 1e-6 || d.bucket_mb > 1e6)) || d.timeout < 0.001 ||
                   d.timeout > 1e7 || (d.ddp && d.dp) || !fuzz_cli_str_ok(d.devices, buf, buf + size)))
      rc = -1;
    argc = k < 0 ? 0 : k;
  }
  int n = rc ? 0 : cli_take_gpu_data_flags(argc, argv, &mode);
  if (n < 0 || n > argc || (mode != CT_LOADER_FLOAT && mode != CT_LOADER_RAW_U8 && mode != CT_LOADER_INDICES)) rc = -1;
  for (int i = 0; rc == 0 && i < n; i++)
    if (!strcmp(argv[i], "--gpu-transforms") || !strcmp(argv[i], "--data-on-gpu")) rc = -1;
  cli_opts o;
  int r = rc ? 0 : cli_parse(n, argv, cmds[c], flags[c], &o);
  if (r != 0 && r != CLI_EXIT_USAGE) rc = -1;
  if (rc == 0 && r == 0) {
    const char *lo = buf, *hi = buf + size;
    const char *strs[] = {o.model, o.data, o.device, o.init, o.save, o.weights, o.checkpoint_dir, o.log_dir,
                          o.metrics_json, o.images, o.optimizer, o.scheduler, o.augment, o.monitor, o.loss,
                          o.precision, o.opt_level, o.loss_scale, o.memory_format};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
      if (!fuzz_cli_str_ok(strs[i], lo, hi)) rc = -1;
    /* The ranges options.c documents in its messages. */
    if (o.epochs < 1 || o.epochs > 100000 || o.batch_size < 1 || o.batch_size > (1 << 20)) rc = -1;
    if (o.accumulate < 0 || o.accumulate > 1024 || o.threads < 0 || o.threads > 1024) rc = -1;
    if (o.workers < 0 || o.workers > 64 || o.keep_last < 1 || o.top < 1 || o.top > 1000) rc = -1;
    if (o.recompute < 0 && o.recompute != CT_RECOMPUTE_AUTO && o.recompute != CT_RECOMPUTE_CHEAP &&
        o.recompute != CT_RECOMPUTE_NORM && o.recompute != CT_RECOMPUTE_SELECTIVE && o.recompute != CLI_RECOMPUTE_DEFAULT)
      rc = -1;
    if (o.recompute > CT_RECOMPUTE_MAX) rc = -1;
    if (o.max_steps < 0 || o.classes < 0 || o.classes > (1 << 20) || o.resize < 0 || o.resize > 8192) rc = -1;
    if (o.in_c < 0 || o.in_h < 0 || o.in_w < 0 || (o.in_h == 0) != (o.in_w == 0)) rc = -1;
    const double nums[] = {o.lr, o.momentum, o.weight_decay, o.clip, o.label_smoothing, o.min_delta, o.warmup,
                           o.lr_factor};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
      if (!(nums[i] >= 0 && nums[i] <= 1e12)) rc = -1;
    if (o.have_loss_scale_init && !(o.loss_scale_init > 0 && o.loss_scale_init <= 3.4e38)) rc = -1;
  }
  free(buf);
  return rc;
}

CT_FUZZ_ENTRY(fuzz_cli_one)
