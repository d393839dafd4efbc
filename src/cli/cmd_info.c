/* ctrain summary, ctrain devices. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "backend/device_impl.h"

static const char *SUMMARY_HELP =
    "usage: ctrain summary --model NAME|FILE [--input CxHxW|F] [--classes N] [--batch-size N]\n"
    "                      [--precision fp32|bf16|fp16] [--opt-level O0|O1|O2|O3] [--recompute[=auto|N|cheap|norm|selective]]\n"
    "                      [--device D] [--memory]\n"
    "\n"
    "Prints a torchsummary-style table: layers, output shapes, parameters, totals, and the\n"
    "activation memory of one training step from the static memory plan. With a low\n"
    "precision, each layer's dtype and autocast rule (docs/MIXED_PRECISION.md); with\n"
    "--recompute, the plan with activation recompute next to the plan without; with\n"
    "--memory, what the plan holds at its peak: the buffers alive then by kind, and the\n"
    "10 largest with their layers.\n";

int cmd_summary(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(SUMMARY_HELP, stdout);
      return 0;
    }
  cli_opts o;
  int r = cli_parse(argc, argv, "summary", CLI_FLAGS_SUMMARY, &o);
  if (r) return r;
  if (!o.model) {
    fprintf(stderr, "ctrain summary: --model is required (see 'ctrain summary --help')\n");
    return CLI_EXIT_USAGE;
  }
  ct_device *dev = NULL;
  ct_model *m = NULL;
  ct_status s = ct_device_open(o.device, &dev);
  if (s == CT_OK) s = cli_open_model(&o, NULL, &m);
  if (s == CT_OK) s = cli_apply_precision(&o, m, NULL);
  if (s == CT_OK) s = ct_model_prepare(m, dev, o.batch_size, 1);
  if (s == CT_OK) {
    int c, h, w;
    ct_model_input_shape(m, &c, &h, &w);
    if (ct_model_input_ndim(m) == 3) printf("%s, input %dx%dx%d\n", ct_model_name(m), c, h, w);
    else printf("%s, input %d\n", ct_model_name(m), c);
    s = ct_model_summary(m, o.batch_size, stdout);
    if (s == CT_OK && o.memory_report) s = ct_model_memory_report(m, 10, stdout);
  }
  int code = s == CT_OK ? 0 : cli_fail(s);
  ct_model_destroy(m);
  ct_device_close(dev);
  return code;
}

int cmd_devices(int argc, char **argv) {
  if (argc > 0 && strcmp(argv[0], "--help") && strcmp(argv[0], "-h")) {
    fprintf(stderr, "ctrain devices: takes no arguments\n");
    return CLI_EXIT_USAGE;
  }
  if (argc > 0) {
    printf("usage: ctrain devices\n\nLists the devices this build can use.\n");
    return 0;
  }
  printf("cpu      %s, %d threads\n", ct_cpu_backend_kernels(), omp_get_max_threads_wrapper());
  printf("cpu:N    virtual CPU device N (own worker thread and memory accounting)\n");
  printf("ref      portable C reference kernels (slow; for testing)\n");
  char buf[4096];
  if (ct_cuda_list_devices(buf, sizeof buf) < 0)
    printf("cuda     not available: %s\n", buf);
  else
    fputs(buf, stdout);
  return 0;
}
