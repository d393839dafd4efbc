/* ctrain train: fit a model and report test metrics. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctrain/checkpoint.h"
#include "cli/metrics_json.h"
#include "ctrain/history.h"

static const char *HELP =
    "usage: ctrain train --model NAME|FILE --data NAME[:PATH] [options]\n"
    "\n"
    "Trains a model, evaluating on the test split after every epoch.\n"
    "\n"
    "  --model NAME|FILE       zoo model (linreg mlp cnn lenet5 alexnet vgg11_bn resnet18 resnet50 resnet9)\n"
    "                          or a model file (docs/MODEL_FORMAT.md)\n"
    "  --data NAME[:PATH]      fashion-mnist, mnist:PATH, cifar10:PATH, cifar100:PATH, folder:PATH, synthetic[:N]\n"
    "  --epochs N              (1)         --batch-size N (64)       --max-steps N (stop after N steps)\n"
    "  --accumulate N (1)      gradient accumulation: one optimizer step per N batches of --batch-size\n"
    "                          (effective batch N x batch size; steps, --max-steps and schedules count optimizer steps)\n"
    "  --optimizer sgd|adam|adamw (sgd)    --lr F (sgd 0.01, adam/adamw 0.001)\n"
    "  --momentum F (0)        --weight-decay F (sgd/adam 0, adamw 0.01)\n"
    "  --scheduler none|plateau|step|cosine|onecycle (none): plateau steps on --monitor each epoch,\n"
    "                          step every --step-size epochs (epochs/3), cosine over --epochs, onecycle per step\n"
    "  --lr-factor F (0.1)     plateau/step decay factor   --lr-patience N (plateau patience, 10)\n"
    "  --clip-grad-norm F      --label-smoothing F\n"
    "  --input CxHxW|F         model input / synthetic data shape   --classes N (synthetic classes)\n"
    "  --resize N              resize images to NxN                 --augment none|flip|crop-flip\n"
    "  --device cpu|cpu:N|ref|cuda|cuda:N (cpu)   --threads N   --workers N (loader threads, 1)\n"
    CLI_DEVICE_SWITCHES_HELP
    "  --gpu-transforms        (CUDA) the loader hands over uint8 batches; resize/crop/flip/normalize run on the GPU\n"
    "  --data-on-gpu           (CUDA) both splits uploaded once as uint8; batches gathered and transformed on the GPU\n"
    "  --cuda-graph            capture the training step as a CUDA graph after 2 warm-up steps and replay it (CUDA)\n"
    "  --memory-format auto|contiguous|channels-last (auto: nChw16c on an AVX-512 cpu, nChw8c on other\n"
    "                          x86 cpus, NHWC on cuda)\n"
    "                          activation layout between layers, PyTorch's memory_format; --channels-last for short\n"
    "  --recompute[=auto|N|cheap|norm|selective|off] (selective on cuda, else off; bare = auto)\n"
    "                          activation recompute:\n"
    "                          keep the activations at the ends of N segments, run each segment's forward again\n"
    "                          before its backward; auto = the mode with the smallest step memory plan\n"
    "                          (none if it saves under 1/16 of the plain plan);\n"
    "                          cheap = drop only batch norm/activation/add/dropout outputs (little extra time);\n"
    "                          norm = drop only batch norm outputs, rebuilt from saved statistics (less);\n"
    "                          selective = norm, and run again the convolutions of <= 128 multiply-adds per\n"
    "                          output element (ResNet-50's 1x1 convolutions over <= 128 channels: +3.5% FLOPs, plan -29% from norm)\n"
    "  --seed N (0)            --no-shuffle (file order, contiguous batches)\n"
    "  --init FILE.safetensors initial weights   --save FILE.safetensors final weights\n"
    "  --checkpoint-dir DIR    per-epoch checkpoints, last, best     --keep-last N (3)   --resume\n"
    "  --monitor val_loss|val_accuracy|loss|accuracy (val_loss)  --patience N (early stopping, 0 = off)\n"
    "  --min-delta F           --restore-best\n"
    "  --on-nonfinite stop|skip (stop) a step whose loss or gradients are NaN/inf (no loss scaler) is never\n"
    "                          applied; stop ends the run naming it (exit 2), skip passes over it\n"
    "  --log-dir DIR           TensorBoard events, history.csv, history.json\n"
    "  --metrics-json FILE     final metrics as JSON\n"
    "  --precision fp32|bf16|fp16 (fp32)   --opt-level O0|O1|O2|O3 (O1 with a low precision)\n"
    "  --loss-scale dynamic|none|VALUE (dynamic for fp16 O1/O2, else none)   --loss-scale-init F (65536)\n"
    "                          VALUE and F in [1e-30, 3.4e38]; docs/MIXED_PRECISION.md\n"
    CLI_DIST_HELP;


static void settings_text(const cli_opts *o, char *buf, size_t n, int with_epochs) {
  snprintf(buf, n,
           "model=%s data=%s batch_size=%lld optimizer=%s lr=%g momentum=%g weight_decay=%g scheduler=%s "
           "input=%dx%dx%d classes=%d resize=%d augment=%s seed=%llu shuffle=%d clip=%g label_smoothing=%g",
           o->model, o->data, (long long)o->batch_size, o->optimizer, o->lr, o->momentum, o->weight_decay,
           o->scheduler, o->in_c, o->in_h, o->in_w, o->classes, o->resize, o->augment, (unsigned long long)o->seed,
           !o->no_shuffle, o->clip, o->label_smoothing);
  if (o->lr_factor > 0 || o->lr_patience || o->step_size) {
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, " lr_factor=%g lr_patience=%d step_size=%d", o->lr_factor, o->lr_patience, o->step_size);
  }
  /* Only when on, so runs without it keep their text (and resume from
   * checkpoints made before the flag existed). */
  if (o->accumulate > 1) {
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, " accumulate=%d", o->accumulate);
  }
  /* Precision settings only when given, so fp32 runs keep their text. */
  if (o->precision || o->opt_level || o->loss_scale || o->have_loss_scale_init) {
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, " precision=%s opt_level=%s loss_scale=%s loss_scale_init=%g",
             o->precision ? o->precision : "fp32", o->opt_level ? o->opt_level : "default",
             o->loss_scale ? o->loss_scale : "default", o->have_loss_scale_init ? o->loss_scale_init : 0.0);
  }
  if (with_epochs) {
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, " epochs=%d device=%s", o->epochs, o->device);
  }
}

/* The per-epoch table printed after training (Keras' History, as text). */
static void print_history(const ct_history *h) {
  if (!h || !ct_history_num_rows(h)) return;
  size_t nc = ct_history_num_columns(h);
  printf("\n%5s", "epoch");
  for (size_t c = 0; c < nc; c++) printf(" %12s", ct_history_column_name(h, c));
  printf("\n");
  for (size_t r = 0; r < ct_history_num_rows(h); r++) {
    int64_t e = ct_history_row_epoch(h, r);
    printf("%5lld", (long long)e);
    for (size_t c = 0; c < nc; c++) {
      double v;
      if (ct_history_get(h, e, ct_history_column_name(h, c), &v) == CT_OK) printf(" %12.6g", v);
      else printf(" %12s", "-");
    }
    printf("\n");
  }
}

/* Loader batch buffers in pinned memory of the device (ctx), so the
 * host->device copy of each batch is a DMA the copy stream overlaps. */
static void *pinned_alloc(void *ctx, size_t bytes) { return ct_device_host_alloc(ctx, bytes); }
static void pinned_free(void *ctx, void *p) { ct_device_host_free(ctx, p); }

int cmd_train(int argc_in, char **argv_in) {
  for (int i = 0; i < argc_in; i++)
    if (!strcmp(argv_in[i], "--help") || !strcmp(argv_in[i], "-h")) {
      fputs(HELP, stdout);
      return 0;
    }
  cli_watch_signals(); /* before any thread starts, so all inherit the mask */
  /* --nproc N restarts the command as given under mpirun. */
  char *orig[256];
  int argc_orig = argc_in < 255 ? argc_in : 255;
  memcpy(orig, argv_in, (size_t)argc_orig * sizeof *orig);
  /* The GPU data flags, the device switches, the data parallel flags and
   * --cuda-graph are taken out before the shared option parser sees the
   * arguments. */
  char *argv_buf[256];
  int gpu_data_mode;
  cli_device_switches sw;
  cli_dist dist;
  argc_in = cli_take_dist_flags("train", argc_in, argv_in, &dist);
  if (argc_in < 0) return CLI_EXIT_USAGE;
  int r = cli_dist_launch(&dist, argc_orig, orig);
  if (r) return r;
  argc_in = cli_take_gpu_data_flags(argc_in, argv_in, &gpu_data_mode);
  argc_in = cli_take_device_switches(argc_in, argv_in, &sw);
  int argc = 0, cuda_graph = 0;
  for (int i = 0; i < argc_in && argc < 255; i++) {
    if (!strcmp(argv_in[i], "--cuda-graph")) cuda_graph = 1;
    else argv_buf[argc++] = argv_in[i];
  }
  argv_buf[argc] = NULL;
  char **argv = argv_buf;
  cli_opts o;
  r = cli_parse(argc, argv, "train", CLI_FLAGS_TRAIN, &o);
  if (r) return r;
  if (!o.model || !o.data) {
    fprintf(stderr, "ctrain train: --model and --data are required (see 'ctrain train --help')\n");
    return CLI_EXIT_USAGE;
  }
  if ((r = cli_check_device_switches("train", &sw))) return r;
  if (o.resume && !o.checkpoint_dir) {
    fprintf(stderr, "ctrain train: --resume needs --checkpoint-dir DIR (where the checkpoints are)\n");
    return CLI_EXIT_USAGE;
  }
  if (o.restore_best && o.patience == 0 && o.epochs == 1) { /* harmless; keep going */
  }
  if ((r = cli_use_gpu_data("train", gpu_data_mode, &o))) return r;
  if (o.threads) omp_set_num_threads(o.threads);
  ct_device *dev = NULL;
  ct_dataset *dtr = NULL, *dte = NULL;
  ct_loader *ltr = NULL, *lte = NULL;
  ct_gpu_data *gtr = NULL, *gte = NULL;
  ct_model *m = NULL;
  ct_fit_result res = {0};
  ct_status s = cli_dist_open(&dist, o.threads != 0);
  /* Rank 0 alone prints the progress and writes the outputs. */
  int lead = ct_comm_rank(dist.comm) == 0;
  o.dist_rank = ct_comm_rank(dist.comm), o.dist_size = ct_comm_size(dist.comm);
  if (s == CT_OK && o.resume) s = cli_dist_resume(&dist, &o, lead);
  if (s == CT_OK && lead) s = cli_check_output("--save", o.save);
  if (s == CT_OK && lead) s = cli_check_output("--metrics-json", o.metrics_json);
  if (s == CT_OK && dist.dp) s = cli_dp_open(&dist, &sw, o.threads);
  if (dist.dp && dist.ndev) dev = dist.devs[0];
  else if (s == CT_OK) s = cli_dist_device(&dist, o.device, &sw, &dev);
  if (s == CT_OK && cuda_graph && !ct_device_can_capture_graphs(dev))
    s = ct_error(CT_ERR_INVALID_ARG, "--cuda-graph: device '%s' cannot capture CUDA graphs (use --device cuda)", o.device);
  if (s == CT_OK && ct_device_get_type(dev) == CT_DEVICE_CUDA) {
    o.stage_alloc = pinned_alloc;
    o.stage_free = pinned_free;
    o.stage_ctx = dev;
  }
  if (s == CT_OK) s = cli_open_data(&o, 1, &dtr, &ltr, !o.no_shuffle, 1);
  if (s == CT_OK) s = cli_open_data(&o, 0, &dte, &lte, 0, 0);
  if (s == CT_OK) s = cli_open_model(&o, dtr, &m);
  if (s == CT_OK) s = cli_check_splits(&o, dtr, dte, m);
  if (s == CT_OK && o.init) s = ct_weights_load(m, o.init, 1, NULL);
  ct_train_config cfg;
  ct_train_config_default(&cfg);
  if (s == CT_OK) s = cli_apply_precision(&o, m, &cfg.scaler);
  if (s == CT_OK) {
    /* The memory check at prepare counts the optimizer state too. */
    ct_optim_kind k0 = !strcmp(o.optimizer, "adam") ? CT_OPTIM_ADAM : !strcmp(o.optimizer, "adamw") ? CT_OPTIM_ADAMW : CT_OPTIM_SGD;
    ct_optim_config oc = ct_optim_config_default(k0);
    if (o.have_momentum) oc.momentum = o.momentum;
    /* Under ZeRO this rank's shard only. */
    size_t np, r = dist.comm ? (size_t)ct_comm_rank(dist.comm) : 0, n = dist.comm ? (size_t)ct_comm_size(dist.comm) : 1;
    ct_model_params(m, &np);
    if (dist.comm && dist.zero)
      ct_model_reserve_optimizer_shard(m, ct_optim_state_buffers(&oc), np * (r + 1) / n - np * r / n);
    else
      ct_model_reserve_optimizer_state(m, ct_optim_state_buffers(&oc));
  }
  if (s == CT_OK) cli_gpu_data_model(&o, m);
  /* DataParallel: each replica holds its slice of the global batch. */
  int64_t plan_batch = dist.dp ? (o.batch_size + dist.ndev - 1) / dist.ndev : o.batch_size;
  /* ZeRO-2 on a GPU: the prepare leaves the whole gradient buffer out
   * where the bucket slots and the shard hold less. */
  int zero2_slots = 0;
  size_t zero2_held = 0, zero2_whole = 0;
  if (s == CT_OK && dist.comm && dist.zero >= 2 && ct_device_get_type(dev) == CT_DEVICE_CUDA) {
    ct_dist_config zc = {.comm = dist.comm, .bucket_mb = dist.bucket_mb, .zero = dist.zero};
    s = ct_ddp_zero2_plan(m, &zc, ct_comm_rank(dist.comm), ct_comm_size(dist.comm), &zero2_slots, &zero2_held,
                          &zero2_whole);
  }
  if (s == CT_OK) s = ct_model_prepare(m, dev, plan_batch, 1);
  /* After the model's block, so the fit check sees what is left. */
  if (s == CT_OK && o.loader_mode != CT_LOADER_FLOAT) s = ct_gpu_data_create(dev, ltr, "train", &gtr);
  if (s == CT_OK && o.loader_mode != CT_LOADER_FLOAT) s = ct_gpu_data_create(dev, lte, "test", &gte);
  char settings[1024], config_id[1024];
  if (s == CT_OK) {
    ct_optim_kind kind = !strcmp(o.optimizer, "adam") ? CT_OPTIM_ADAM : !strcmp(o.optimizer, "adamw") ? CT_OPTIM_ADAMW : CT_OPTIM_SGD;
    cfg.optim = ct_optim_config_default(kind);
    if (o.have_lr) cfg.optim.lr = o.lr;
    if (o.have_momentum) cfg.optim.momentum = o.momentum;
    if (o.have_wd) cfg.optim.weight_decay = o.weight_decay;
    o.lr = cfg.optim.lr, o.momentum = cfg.optim.momentum, o.weight_decay = cfg.optim.weight_decay;
    cfg.epochs = o.epochs;
    cfg.max_steps = o.max_steps;
    cfg.stop_request = cli_stop_on_signals();
    cfg.accumulate = o.accumulate;
    cfg.seed = o.seed;
    cfg.clip_grad_norm = o.clip;
    cfg.label_smoothing = (float)o.label_smoothing;
    if (ct_loss_parse(o.loss, &cfg.loss)) s = ct_error(CT_ERR_INVALID_ARG, "--loss: expected cross_entropy or nll");
    cfg.monitor = o.monitor;
    cfg.patience = o.patience;
    cfg.min_delta = o.min_delta;
    cfg.restore_best = o.restore_best;
    cfg.checkpoint_dir = o.checkpoint_dir;
    cfg.keep_last = o.keep_last;
    cfg.on_nonfinite = o.skip_nonfinite ? CT_NONFINITE_SKIP : CT_NONFINITE_STOP;
    cfg.resume = o.resume;
    cfg.log_dir = o.log_dir;
    cfg.progress = lead ? stdout : NULL;
    cfg.progress_tty = isatty(STDOUT_FILENO);
    cfg.dist.comm = dist.comm;
    cfg.dist.bucket_mb = dist.bucket_mb;
    cfg.dist.check_sync = dist.check_sync;
    cfg.dist.zero = dist.zero;
    cfg.dist.sync_bn = dist.sync_bn;
    cfg.dist.dp_devices = dist.devs;
    cfg.dist.dp_count = dist.dp ? dist.ndev : 0;
    cfg.cuda_graph = cuda_graph;
    int64_t bpe = ct_loader_batches_per_epoch(ltr);
    if (strcmp(o.scheduler, "none")) {
      cfg.use_scheduler = 1;
      if (!strcmp(o.scheduler, "plateau")) {
        cfg.sched = ct_sched_config_default(CT_SCHED_PLATEAU);
        if (strstr(o.monitor, "accuracy")) cfg.sched.mode = CT_PLATEAU_MAX;
        if (o.lr_patience) cfg.sched.patience = o.lr_patience < 0 ? 0 : o.lr_patience;
        if (o.lr_factor > 0) cfg.sched.factor = o.lr_factor;
      } else if (!strcmp(o.scheduler, "step")) {
        cfg.sched = ct_sched_config_default(CT_SCHED_STEP);
        cfg.sched.step_size = o.step_size ? o.step_size : o.epochs >= 3 ? o.epochs / 3 : 1;
        if (o.lr_factor > 0) cfg.sched.gamma = o.lr_factor;
      } else if (!strcmp(o.scheduler, "cosine")) {
        cfg.sched = ct_sched_config_default(CT_SCHED_COSINE);
        cfg.sched.t_max = o.epochs;
      } else {
        cfg.sched = ct_sched_config_default(CT_SCHED_ONECYCLE);
        cfg.sched.max_lr = cfg.optim.lr;
        /* The schedule spans --epochs; --max-steps only interrupts it, so a
         * run stopped by --max-steps and resumed follows the same curve. */
        cfg.sched.total_steps = (int64_t)o.epochs * ct_accum_steps_per_epoch(o.accumulate, bpe);
        cfg.sched.cycle_momentum = kind != CT_OPTIM_SGD || cfg.optim.momentum > 0;
        cfg.sched_per_step = 1;
      }
    }
    settings_text(&o, config_id, sizeof config_id, 0);
    settings_text(&o, settings, sizeof settings, 1);
    if (dist.comm) {
      size_t len = strlen(settings);
      snprintf(settings + len, sizeof settings - len, " strategy=ddp world_size=%d", o.dist_size);
    }
    cfg.config_id = config_id;
    cfg.settings_text = settings;
  }
  if (s == CT_OK && lead) {
    int c, h, w;
    ct_model_input_shape(m, &c, &h, &w);
    ct_layout il;
    ct_dtype idt = ct_model_input_dtype(m, &il);
    char narrow[48] = "";
    if (idt != CT_F32)
      snprintf(narrow, sizeof narrow, " (%s%s batch)", ct_dtype_name(idt), il == CT_LAYOUT_NHWC ? " channels-last" : "");
    printf("ctrain: %s on %s (%lld train / %lld test), input %dx%dx%d%s, %lld parameters, device %s, step memory plan %.1f MB",
           ct_model_name(m), ct_dataset_name(dtr), (long long)ct_dataset_size(dtr), (long long)ct_dataset_size(dte), c, h,
           w, narrow, (long long)ct_model_param_count(m), ct_device_name(dev), (double)ct_model_plan_bytes(m) / 1e6);
    char how[32];
    if (ct_model_recompute_layers(m))
      printf(" (recompute: %s, %d layers run forward twice)",
             ct_recompute_mode_str(ct_model_recompute_mode(m), how, sizeof how), ct_model_recompute_layers(m));
    else if (o.recompute != CLI_RECOMPUTE_DEFAULT && o.recompute)
      printf(" (recompute: off, it would save too little of this model's plan)");
    if (dist.comm)
      printf(", data parallel over %d ranks (global batch %lld)", o.dist_size, (long long)o.batch_size * o.dist_size);
    if (dist.comm && dist.zero) {
      size_t np;
      ct_model_params(m, &np);
      double mb = (double)np * sizeof(float) * ct_optim_state_buffers(&cfg.optim) / 1e6;
      printf(", ZeRO-%d: optimizer state %.2f of %.2f MB per rank", dist.zero, mb / o.dist_size, mb);
      if (dist.zero == 2 && zero2_slots)
        printf(", gradients %.2f of %.2f MB (the shard and two bucket slots)", zero2_held / 1e6, zero2_whole / 1e6);
      else if (dist.zero == 2 && zero2_whole)
        printf(", gradients whole (%.2f MB: the shard and two bucket slots would hold no less)",
               zero2_whole / 1e6);
      else if (dist.zero == 2)
        printf(", gradients %.2f of %.2f MB between steps", (double)np * 4 / 1e6 / o.dist_size, (double)np * 4 / 1e6);
    }
    if (dist.dp) printf(", DataParallel over %s (global batch %lld)", dist.devices, (long long)o.batch_size);
    printf("\n");
    fflush(stdout);
  }
  if (s == CT_OK) s = ct_fit(m, dev, ltr, lte, &cfg, &res);
  if (res.log_warning[0]) fprintf(stderr, "ctrain: warning: %s; logging stopped, training went on\n", res.log_warning);
  if (s == CT_OK && lead) {
    print_history(res.history);
    if (res.already_done)
      printf("nothing to train: the checkpoint in %s finished epoch %d of %d; its final weights evaluated again\n",
             o.checkpoint_dir, res.resumed_from_epoch, o.epochs);
    else if (res.resumed_from_epoch >= 0)
      printf("resumed from epoch %d\n", res.resumed_from_epoch);
    if (res.stopped_by)
      printf("stopped by signal %d (%s) at step %lld%s%s; no test evaluation\n", res.stopped_by,
             strsignal(res.stopped_by), (long long)res.steps, o.checkpoint_dir ? ", resumable from " : "",
             o.checkpoint_dir ? o.checkpoint_dir : "");
    else
      printf("test_loss: %.4f - test_accuracy: %.4f - train_loss: %.4f - %.0f img/s\n", res.val.loss,
             res.val.accuracy, res.train_loss, res.images_per_second);
    if (o.save) s = ct_weights_save(m, o.save);
  }
  if (s == CT_OK && o.metrics_json && lead) {
    cli_metrics out = {0};
    out.model = ct_model_name(m);
    out.dataset = ct_dataset_name(dtr);
    out.device = ct_device_name(dev);
    out.precision = ct_precision_name(ct_model_precision(m));
    out.opt_level = ct_opt_level_name(ct_model_opt_level(m));
    out.seed = o.seed;
    out.res = &res;
    if (ct_device_get_type(dev) == CT_DEVICE_CUDA) {
      size_t np;
      ct_model_params(m, &np);
      out.gradient_bytes = zero2_slots ? zero2_held : np * sizeof(float);
    }
    s = cli_write_metrics_json(o.metrics_json, &out);
  }
  int code = s != CT_OK ? cli_dist_fail(&dist, s) : res.stopped_by ? 128 + res.stopped_by : 0;
  ct_fit_result_free(&res);
  ct_model_destroy(m);
  ct_loader_destroy(ltr);
  ct_loader_destroy(lte);
  ct_gpu_data_destroy(gtr);
  ct_gpu_data_destroy(gte);
  ct_dataset_close(dtr);
  ct_dataset_close(dte);
  ct_device_close(dev);
  cli_dp_close(&dist);
  ct_comm_close(dist.comm);
  return code;
}
