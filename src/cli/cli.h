/* The ctrain command: shared option parsing and the subcommands. */
#ifndef CTRAIN_CLI_H
#define CTRAIN_CLI_H

#include <limits.h>

#include "ctrain/ctrain.h"
#include "ctrain/trainer.h"

/* Exit codes (docs/CLI.md). */
enum {
  CLI_EXIT_OK = 0,
  CLI_EXIT_ERROR = 1,       /* a runtime failure not listed below */
  CLI_EXIT_USAGE = 2,       /* unknown or malformed flags, inconsistent flags */
  CLI_EXIT_IO = 3,          /* a file could not be read or written, or is missing */
  CLI_EXIT_BAD_INPUT = 4,   /* a file's content is malformed (dataset, model, weights) */
  CLI_EXIT_NO_MEMORY = 5,   /* out of memory */
  CLI_EXIT_NO_DEVICE = 6,   /* the requested device does not exist or is unsupported */
  CLI_EXIT_SHAPE = 7        /* model and data shapes do not agree */
};

typedef struct cli_opts {
  const char *model, *data, *device, *init, *save, *weights, *checkpoint_dir, *log_dir, *metrics_json, *images;
  const char *optimizer, *scheduler, *augment, *input, *monitor, *loss;
  int epochs, threads, workers, resume, no_shuffle, classes, resize, patience, keep_last, restore_best, top;
  int skip_nonfinite; /* --on-nonfinite skip */
  int lr_patience, step_size; /* 0 = the scheduler's default */
  double lr_factor;          /* 0 = the scheduler's default */
  int64_t batch_size, max_steps;
  int accumulate;           /* --accumulate N: micro-batches per optimizer step (0 = not given) */
  uint64_t seed;
  double lr, momentum, weight_decay, clip, label_smoothing, min_delta, warmup;
  int have_lr, have_momentum, have_wd;
  int in_c, in_h, in_w;
  /* --memory-format (--channels-last sets "channels-last"); NULL = auto. */
  const char *memory_format;
  /* --recompute[=auto|cheap|norm|selective|off|N]: activation recompute for
   * ct_model_set_recompute (0 = off; a bare flag = CT_RECOMPUTE_AUTO);
   * CLI_RECOMPUTE_DEFAULT when not given (cli_recompute). */
  int recompute;
  int memory_report; /* summary --memory: ct_model_memory_report after the table */
  /* Mixed precision: --precision, --opt-level, --loss-scale, --loss-scale-init. */
  const char *precision, *opt_level, *loss_scale;
  double loss_scale_init;
  int have_loss_scale_init;
  /* Batch buffer hooks for the loaders cli_open_data creates (pinned host
   * staging for a CUDA device, set by cmd_train); NULL = plain memory. */
  void *(*stage_alloc)(void *ctx, size_t bytes);
  void (*stage_free)(void *ctx, void *p);
  void *stage_ctx;
  /* ct_loader_mode for the loaders cli_open_data creates (cmd_train's
   * --gpu-transforms / --data-on-gpu); 0 = transformed f32 batches. */
  int loader_mode;
  /* Data parallel: this rank's share of the data (dist_size 0 or 1: all). */
  int dist_rank, dist_size;
} cli_opts;

/* Applies --precision/--opt-level to a model (before prepare) and fills
 * the trainer's loss scaler from --loss-scale/--loss-scale-init; scaler
 * may be NULL (summary, eval). Usage errors come back as
 * CT_ERR_INVALID_ARG with the flag named. */
ct_status cli_apply_precision(const cli_opts *o, ct_model *m, ct_grad_scaler *scaler);

/* SIGINT, SIGTERM, SIGHUP (src/cli/signals.c). cli_watch_signals, first
 * thing, before any thread starts: blocks them and starts the thread that
 * takes them (until armed, a signal exits at once). cli_stop_on_signals
 * arms it and returns the flag it then sets (the signal number) for
 * ct_train_config.stop_request. A run stopped so exits with 128 + that
 * number after writing what it would have. */
void cli_watch_signals(void);
volatile sig_atomic_t *cli_stop_on_signals(void);

/* Before any work: neither split empty (CT_ERR_PARSE), every label
 * below the model's outputs and the two splits' images of one shape
 * (CT_ERR_SHAPE); test may be NULL. Scans the labels once. */
ct_status cli_check_splits(const cli_opts *o, const ct_dataset *train, const ct_dataset *test, const ct_model *m);

int cli_exit_code(ct_status s);
/* Prints "ctrain: error: <message>" to stderr and returns the exit code. */
int cli_fail(ct_status s);
/* The long flags each subcommand accepts (cli_parse's `allowed`); here so
 * the CLI fuzz target (fuzz/fuzz_cli.c) parses exactly what ctrain does. */
#define CLI_FLAGS_TRAIN                                                                                              \
  "model data epochs batch-size accumulate max-steps optimizer lr momentum weight-decay scheduler lr-factor "        \
  "lr-patience step-size clip-grad-norm label-smoothing input classes resize augment device threads workers seed "   \
  "no-shuffle init save checkpoint-dir keep-last resume monitor patience min-delta restore-best log-dir metrics-json " \
  "precision opt-level loss-scale loss-scale-init memory-format channels-last recompute on-nonfinite"
#define CLI_FLAGS_EVAL                                                                                   \
  "model weights data batch-size input classes resize device threads workers seed metrics-json precision " \
  "opt-level memory-format channels-last"
#define CLI_FLAGS_PREDICT                                                                                       \
  "model weights data images batch-size input classes resize device threads workers seed precision opt-level " \
  "memory-format channels-last"
#define CLI_FLAGS_SUMMARY "model input classes batch-size device precision opt-level recompute memory optimizer momentum"

/* --recompute when not given: CT_RECOMPUTE_SELECTIVE on a cuda device
 * (batch norm outputs rebuilt from their saved statistics, one
 * elementwise pass each, and the outputs of convolutions of at most 128
 * multiply-adds per output element run again: device memory is what runs
 * out there), off elsewhere. */
#define CLI_RECOMPUTE_DEFAULT INT_MIN
int cli_recompute(const cli_opts *o);

/* Parses argv for a subcommand: allowed is a space-separated list of long
 * flag names accepted. Returns 0 or prints the error and returns 2. */
int cli_parse(int argc, char **argv, const char *cmd, const char *allowed, cli_opts *o);

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_summary(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int omp_get_max_threads_wrapper(void);

/* The GPU data flags (--gpu-transforms, --data-on-gpu) of train, eval and
 * predict, which cli_parse does not know: removes them from argv in place
 * (order of the rest kept) and returns the new argc; *mode gets the
 * ct_loader_mode they ask for (CT_LOADER_INDICES when --data-on-gpu is
 * among them, CT_LOADER_RAW_U8 for --gpu-transforms alone, else
 * CT_LOADER_FLOAT). */
int cli_take_gpu_data_flags(int argc, char **argv, int *mode);
/* After cli_parse: refuses a GPU data mode on a device other than cuda
 * (one line on stderr naming the command, the flag and the device; returns
 * CLI_EXIT_USAGE, before any data is read), else sets o->loader_mode so
 * cli_open_data makes loaders of that mode, and returns 0. */
int cli_use_gpu_data(const char *cmd, int mode, cli_opts *o);

/* The device switches of train, eval and predict (--cudnn-benchmark,
 * --deterministic, --tf32): their --help lines, the switches, and
 * cli_take_device_switches, which removes them from argv in place (cli_parse
 * does not know them; order of the rest kept) and returns the new argc. */
#define CLI_DEVICE_SWITCHES_HELP                                                                                      \
  "  --cudnn-benchmark       time cuDNN's convolution algorithms once per shape, use the fastest that runs (CUDA)\n"  \
  "  --deterministic         repeatable runs, bit for bit: deterministic cuDNN algorithms only (the cpu always is)\n" \
  "  --tf32                  f32 convolutions and matmuls may use TF32 tensor cores (CUDA; PyTorch's allow_tf32)\n"
typedef struct cli_device_switches {
  int cudnn_benchmark, deterministic, tf32;
} cli_device_switches;
int cli_take_device_switches(int argc, char **argv, cli_device_switches *sw);
/* --deterministic with --cudnn-benchmark: one line on stderr naming both,
 * CLI_EXIT_USAGE; else 0. */
int cli_check_device_switches(const char *cmd, const cli_device_switches *sw);
/* Opens the device and turns the switches on, before anything is planned
 * (the plan caches key on them). A switch the device lacks (benchmark or
 * TF32 off cuda) fails with CT_ERR_INVALID_ARG, the flag named in front of
 * the library's message; --deterministic is accepted on every device. */
ct_status cli_open_device(const char *name, const cli_device_switches *sw, ct_device **dev);

/* Before ct_model_prepare, for o's GPU data modes (every batch of the
 * command comes through the transform on the compute stream): one x
 * staging buffer (ct_model_share_stage_x) and the input in the dtype and
 * layout the first layers cast it to (ct_model_narrow_input). Nothing
 * for the float loader. */
void cli_gpu_data_model(const cli_opts *o, ct_model *m);

/* ctrain train's data parallel flags (src/cli/dist.c). */
#define CLI_DP_MAX 64
typedef struct cli_dist {
  int ddp;            /* --strategy ddp */
  int dp;             /* --strategy dp */
  const char *devices; /* --devices LIST (dp) */
  ct_device *devs[CLI_DP_MAX]; /* cli_dp_open's; devs[0] is the model's device */
  int ndev;
  int nproc;          /* --nproc N (0: not given) */
  double bucket_mb;   /* --bucket-mb (0: 25) */
  double timeout;     /* --dist-timeout seconds (600) */
  int64_t check_sync; /* --check-sync N */
  int zero;           /* --zero N */
  int sync_bn;        /* --sync-bn */
  int given;          /* any of them given */
  ct_comm *comm;      /* cli_dist_open's */
} cli_dist;
#define CLI_DIST_HELP                                                                                       \
  "  --strategy single|dp|ddp (single)  ddp: data parallel over MPI ranks (mpirun -np N ctrain train ...,\n" \
  "                          srun, or --nproc N); --batch-size is per rank; only rank 0 writes files.\n"   \
  "                          dp: one process, a replica per device of --devices; --batch-size is global\n" \
  "  --devices LIST          dp's devices: virtual CPU devices (cpu:0,cpu:1) or GPUs (cuda:0,cuda:1)\n"      \
  "  --nproc N               start N ranks on this machine through mpirun\n"                              \
  "  --bucket-mb F (25)      gradient bucket size (the first 1 MB, or F if smaller); ddp, dp on GPUs\n"     \
  "  --dist-timeout S (600)  longest wait in a collective before every rank exits naming it\n"            \
  "  --check-sync N (0)      every N steps compare a checksum of the weights across ranks\n"                   \
  "  --zero 0|1|2 (0)        1: shard the optimizer state over the ranks (ZeRO-1); 2: the gradients too (CPU)\n" \
  "  --sync-bn               (dp, ddp) batch norm with the global batch's statistics (SyncBatchNorm)\n"
/* Removes the flags from argv in place (order of the rest kept) and
 * returns the new argc, or -1 after a usage error on stderr naming cmd. */
int cli_take_dist_flags(const char *cmd, int argc, char **argv, cli_dist *d);
/* --nproc N outside a launched job: runs `mpirun -np N <ctrain> train
 * <argv>` in place of this process (returns only on failure, with the
 * exit code); otherwise returns 0. */
int cli_dist_launch(const cli_dist *d, int argc, char **argv);
/* --strategy ddp: joins the MPI job (d->comm), sets the timeout and,
 * unless --threads or OMP_NUM_THREADS says otherwise, gives each rank
 * its share of the host's cores. */
ct_status cli_dist_open(cli_dist *d, int threads_given);
/* --resume on another number of ranks than the checkpoint's: sets
 * o->accumulate so that ranks x accumulate, the batches of a step, stays
 * the same (refused when this world size does not divide it); a note on
 * stdout when lead. Nothing when the numbers agree or the file cannot be
 * read (the restore reports that). */
ct_status cli_dist_resume(const cli_dist *d, cli_opts *o, int lead);
/* --strategy dp: opens every device of --devices (with the device
 * switches) into d->devs and gives each threads (0: the host's cores
 * shared among them, or OMP_NUM_THREADS when set). */
ct_status cli_dp_open(cli_dist *d, const cli_device_switches *sw, int threads);
/* Opens the command's device: under ddp a bare "cuda" is this rank's GPU,
 * cuda:LOCAL_RANK (NCCL takes one GPU per rank). */
ct_status cli_dist_device(const cli_dist *d, const char *name, const cli_device_switches *sw, ct_device **dev);
/* Closes the devices cli_dp_open opened but the first (the command's own). */
void cli_dp_close(cli_dist *d);
/* cli_fail, and with more than one rank the message names this rank and
 * every rank of the job is ended (ct_comm_abort). */
int cli_dist_fail(cli_dist *d, ct_status s);

/* Shared setup: data spec -> dataset + loader for a split. */
ct_status cli_open_data(const cli_opts *o, int train, ct_dataset **ds, ct_loader **ld, int shuffle, int augment);
ct_status cli_open_model(const cli_opts *o, const ct_dataset *ds, ct_model **m);
/* Checks before a long run that an output file (--save, --metrics-json) can
 * be created: its folder exists and is writable and the path is not a
 * folder. CT_OK for a NULL path. */
ct_status cli_check_output(const char *flag, const char *path);

#endif
