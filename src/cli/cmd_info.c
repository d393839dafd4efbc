/* ctrain summary, ctrain devices. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *SUMMARY_HELP =
    "usage: ctrain summary --model NAME|FILE [--input CxHxW|F] [--classes N] [--batch-size N]\n"
    "                      [--precision fp32|bf16|fp16] [--opt-level O0|O1|O2|O3] [--recompute[=auto|N|cheap|norm|selective]]\n"
    "                      [--device D] [--memory] [--optimizer sgd|adam|adamw [--momentum F]]\n"
    "                      [--strategy ddp --nproc N [--zero 1|2] [--bucket-mb F]]\n"
    "\n"
    "Prints a torchsummary-style table: layers, output shapes, parameters, totals, and the\n"
    "activation memory of one training step from the static memory plan. With a low\n"
    "precision, each layer's dtype and autocast rule (docs/MIXED_PRECISION.md); with\n"
    "--recompute, the plan with activation recompute next to the plan without; with\n"
    "--memory, what the plan holds at its peak: the buffers alive then by kind, and the\n"
    "10 largest with their layers. With --optimizer, the optimizer's state; with\n"
    "--strategy ddp --nproc N --zero 1 too, what each of the N ranks keeps of it (--zero 2:\n"
    "of the gradients too, on the CPU and on a GPU, whose two bucket slots --bucket-mb sizes).\n";

/* The optimizer's state, whole and (ZeRO over n ranks) per rank: the
 * largest shard, as ct_ddp cuts the flat buffer (np r / n boundaries);
 * under ZeRO-2 the gradients' shard too, and on a GPU its bucket slots. */
static void optimizer_lines(const cli_opts *o, const cli_dist *d, ct_model *m) {
  ct_optim_kind k = !strcmp(o->optimizer, "adam") ? CT_OPTIM_ADAM : !strcmp(o->optimizer, "adamw") ? CT_OPTIM_ADAMW : CT_OPTIM_SGD;
  ct_optim_config oc = ct_optim_config_default(k);
  if (o->have_momentum) oc.momentum = o->momentum;
  size_t np;
  ct_model_params(m, &np);
  int nb = ct_optim_state_buffers(&oc);
  double whole = (double)np * sizeof(float) * nb / 1e6;
  printf("Optimizer state (MB): %.2f  (%s: %d buffer%s of the %zu-value flat parameter buffer)\n", whole, o->optimizer,
         nb, nb == 1 ? "" : "s", np);
  if (!d->zero) return;
  size_t largest = np - np * (size_t)(d->nproc - 1) / (size_t)d->nproc;
  double shard = (double)largest * sizeof(float) * nb / 1e6;
  printf("ZeRO-%d over %d ranks: %.2f MB of optimizer state per rank (the largest shard), %.2f MB saved per rank\n",
         d->zero, d->nproc, shard, whole - shard);
  if (d->zero < 2) return;
  double gw = (double)np * sizeof(float) / 1e6, gs = (double)largest * sizeof(float) / 1e6;
  printf("ZeRO-2 gradients on the CPU: %.2f of %.2f MB per rank between steps (%.2f MB saved; during the backward "
         "also the buckets not yet reduced)\n", gs, gw, gw - gs);
  ct_dist_config zc = {.bucket_mb = d->bucket_mb, .zero = d->zero};
  int slots;
  size_t held, all;
  if (ct_ddp_zero2_plan(m, &zc, d->nproc - 1, d->nproc, &slots, &held, &all) != CT_OK) return;
  if (slots)
    printf("ZeRO-2 gradients on a GPU: %.2f of %.2f MB per rank throughout (the largest shard and two bucket slots), "
           "%.2f MB saved\n", held / 1e6, all / 1e6, (all - held) / 1e6);
  else
    printf("ZeRO-2 gradients on a GPU: whole, %.2f MB per rank (the shard and two bucket slots would hold no less)\n",
           all / 1e6);
}

int cmd_summary(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(SUMMARY_HELP, stdout);
      return 0;
    }
  cli_dist d;
  argc = cli_take_dist_flags("summary", argc, argv, &d);
  if (argc < 0) return CLI_EXIT_USAGE;
  if (d.dp || d.sync_bn || (d.ddp && !d.nproc) || (d.zero && !d.ddp)) {
    fprintf(stderr, "ctrain summary: of the data-parallel flags it takes --strategy ddp --nproc N and --zero 1|2\n");
    return CLI_EXIT_USAGE;
  }
  cli_opts o;
  int given_optimizer = 0;
  for (int i = 0; i < argc; i++) given_optimizer |= !strcmp(argv[i], "--optimizer");
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
    if (s == CT_OK && (given_optimizer || d.zero)) optimizer_lines(&o, &d, m);
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
