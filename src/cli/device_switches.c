/* --cudnn-benchmark, --deterministic and --tf32, shared by train, eval and
 * predict: PyTorch's torch.backends flags are process-wide, so a model
 * evaluated on its own runs under the switches its training ran under. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int cli_take_device_switches(int argc, char **argv, cli_device_switches *sw) {
  memset(sw, 0, sizeof *sw);
  int n = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--cudnn-benchmark")) sw->cudnn_benchmark = 1;
    else if (!strcmp(argv[i], "--deterministic")) sw->deterministic = 1;
    else if (!strcmp(argv[i], "--tf32")) sw->tf32 = 1;
    else argv[n++] = argv[i];
  }
  if (n < argc) argv[n] = NULL;
  return n;
}

int cli_check_device_switches(const char *cmd, const cli_device_switches *sw) {
  if (sw->cudnn_benchmark && sw->deterministic) {
    fprintf(stderr, "ctrain %s: --deterministic and --cudnn-benchmark exclude each other: the benchmark picks "
                    "algorithms by measured time, which can differ from run to run\n", cmd);
    return CLI_EXIT_USAGE;
  }
  return 0;
}

/* Turns on a switch the command line names by its flag; the library's
 * refusal (a device without it) with the flag in front. */
static ct_status turn_on(ct_status (*set)(ct_device *, int), ct_device *dev, const char *flag) {
  ct_status s = set(dev, 1);
  if (s != CT_OK) {
    char why[256];
    snprintf(why, sizeof why, "%s", ct_last_error());
    s = ct_error(s, "%s: %s (use --device cuda)", flag, why);
  }
  return s;
}

ct_status cli_open_device(const char *name, const cli_device_switches *sw, ct_device **dev) {
  ct_status s = ct_device_open(name, dev);
  if (s == CT_OK && sw->cudnn_benchmark) s = turn_on(ct_device_set_cudnn_benchmark, *dev, "--cudnn-benchmark");
  if (s == CT_OK && sw->tf32) s = turn_on(ct_device_set_tf32, *dev, "--tf32");
  /* Accepted everywhere: the cpu and ref devices are deterministic. */
  if (s == CT_OK && sw->deterministic) s = ct_device_set_deterministic(*dev, 1);
  return s;
}
