/* The data-parallel flags of ctrain train (and summary's share of them):
 * --strategy, --devices (dp), --nproc,
 * --bucket-mb, --dist-timeout, --check-sync, --zero (ddp), --sync-bn.
 * --nproc N on a process that no launcher started runs the same command
 * under `mpirun -np N` instead. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static int bad(const char *cmd, const char *flag, const char *v, const char *want) {
  fprintf(stderr, "ctrain %s: %s expects %s, got '%s' (see 'ctrain %s --help')\n", cmd, flag, want, v ? v : "", cmd);
  return -1;
}

/* A number in [lo, hi] (a whole one when whole). */
static int num(const char *cmd, const char *flag, const char *v, double lo, double hi, int whole, const char *want,
               double *out) {
  char *end;
  errno = 0;
  double x = v ? strtod(v, &end) : 0;
  if (!v || !*v || *end || errno || !(x >= lo && x <= hi) || (whole && x != (double)(int64_t)x))
    return bad(cmd, flag, v, want);
  *out = x;
  return 0;
}

int cli_take_dist_flags(const char *cmd, int argc, char **argv, cli_dist *d) {
  memset(d, 0, sizeof *d);
  d->timeout = 600;
  int n = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    double x = 0;
    int r = 0;
    if (!strcmp(a, "--sync-bn")) {
      d->sync_bn = 1;
      continue;
    }
    if (!strcmp(a, "--strategy")) {
      d->ddp = d->dp = 0;
      if (v && !strcmp(v, "ddp")) d->ddp = 1;
      else if (v && !strcmp(v, "dp")) d->dp = 1;
      else if (!v || strcmp(v, "single")) return bad(cmd, a, v, "single, dp or ddp");
      i++;
      continue;
    } else if (!strcmp(a, "--devices")) {
      d->devices = v;
      if (!v || !*v) r = bad(cmd, a, v, "a comma-separated device list such as cpu:0,cpu:1");
    } else if (!strcmp(a, "--nproc")) {
      r = num(cmd, a, v, 1, 4096, 1, "an integer in [1, 4096]", &x);
      d->nproc = (int)x;
    } else if (!strcmp(a, "--bucket-mb")) {
      r = num(cmd, a, v, 1e-6, 1e6, 0, "a number of MB in (0, 1e6]", &d->bucket_mb);
    } else if (!strcmp(a, "--dist-timeout")) {
      r = num(cmd, a, v, 0.001, 1e7, 0, "seconds in [0.001, 1e7]", &d->timeout);
    } else if (!strcmp(a, "--zero")) {
      r = num(cmd, a, v, 0, 2, 1, "0, 1 or 2", &x);
      d->zero = (int)x;
    } else if (!strcmp(a, "--check-sync")) {
      r = num(cmd, a, v, 0, 1e12, 1, "a whole number of steps (0 = off)", &x);
      d->check_sync = (int64_t)x;
    } else {
      argv[n++] = argv[i];
      continue;
    }
    if (r) return -1;
    if (strcmp(a, "--devices") && strcmp(a, "--bucket-mb")) d->given = 1;
    i++;
  }
  if (n < argc) argv[n] = NULL;
  if (d->given && !d->ddp) {
    fprintf(stderr, "ctrain %s: --nproc, --dist-timeout, --check-sync and --zero need --strategy ddp\n", cmd);
    return -1;
  }
  if (d->bucket_mb > 0 && !d->ddp && !d->dp) {
    fprintf(stderr, "ctrain %s: --bucket-mb needs --strategy ddp, or dp over GPUs\n", cmd);
    return -1;
  }
  if (d->sync_bn && !d->ddp && !d->dp) {
    fprintf(stderr, "ctrain %s: --sync-bn needs --strategy dp or ddp (one device's batch norm is already the whole batch's)\n",
            cmd);
    return -1;
  }
  if (d->dp != (d->devices != NULL)) {
    fprintf(stderr, "ctrain %s: --strategy dp and --devices LIST go together (--devices cpu:0,cpu:1)\n", cmd);
    return -1;
  }
  return n;
}

/* Whether a launcher (mpirun, srun) started this process. */
static int launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("SLURM_PROCID");
}

int cli_dist_launch(const cli_dist *d, int argc, char **argv) {
  if (!d->ddp || d->nproc <= 0 || launched()) return 0;
  /* mpirun -np N [root flags] <this ctrain> train <the arguments as given> */
  char **a = calloc((size_t)argc + 12, sizeof *a);
  if (!a) return CLI_EXIT_NO_MEMORY;
  char np[16], exe[4096];
  snprintf(np, sizeof np, "%d", d->nproc);
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) {
    free(a);
    fprintf(stderr, "ctrain train: --nproc: cannot find this program's path to start it under mpirun\n");
    return CLI_EXIT_ERROR;
  }
  exe[len] = 0;
  int k = 0;
  a[k++] = "mpirun";
  a[k++] = "-np";
  a[k++] = np;
  /* Root may run it here (containers), and ranks may outnumber cores. */
  if (geteuid() == 0) a[k++] = "--allow-run-as-root";
  a[k++] = "--oversubscribe";
  a[k++] = exe;
  a[k++] = "train";
  for (int i = 0; i < argc; i++) a[k++] = argv[i];
  a[k] = NULL;
  fflush(stdout);
  execvp("mpirun", a);
  fprintf(stderr, "ctrain train: --nproc %d: cannot run mpirun (%s); install openmpi-bin, or start the ranks with "
                  "your launcher (mpirun -np N ctrain train --strategy ddp ...)\n", d->nproc, strerror(errno));
  free(a);
  return CLI_EXIT_ERROR;
}

ct_status cli_dist_open(cli_dist *d, int threads_given) {
  if (!d->ddp) return CT_OK;
  ct_status s = ct_comm_open_mpi(&d->comm);
  if (s != CT_OK) return ct_error_wrap(s, "--strategy ddp");
  ct_comm_set_timeout(d->comm, d->timeout);
  if (d->nproc > 0 && d->nproc != ct_comm_size(d->comm))
    return ct_error(CT_ERR_INVALID_ARG, "--nproc %d: this job has %d ranks", d->nproc, ct_comm_size(d->comm));
  /* The ranks on a host share its cores, unless told otherwise. */
  if (!threads_given && !getenv("OMP_NUM_THREADS")) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long t = cores / ct_comm_local_size(d->comm);
    omp_set_num_threads(t > 0 ? (int)t : 1);
  }
  return CT_OK;
}

ct_status cli_dist_resume(const cli_dist *d, cli_opts *o, int lead) {
  char path[4096];
  snprintf(path, sizeof path, "%s/last.safetensors", o->checkpoint_dir);
  ct_safetensors *st;
  if (ct_safetensors_open(path, &st) != CT_OK) return CT_OK; /* fit reports it */
  const char *w = ct_safetensors_metadata(st, "world_size"), *a = ct_safetensors_metadata(st, "accumulate");
  long ck_world = w ? strtol(w, NULL, 10) : 1, ck_acc = a ? strtol(a, NULL, 10) : 1;
  ct_safetensors_close(st);
  int world = ct_comm_size(d->comm);
  if (ck_world < 1 || ck_acc < 1 || ck_world == world) return CT_OK; /* fit checks the rest */
  long batches = ck_world * ck_acc;
  if (batches % world)
    return ct_error(CT_ERR_INVALID_ARG,
                    "--resume: %s was trained by %ld rank(s) with --accumulate %ld, %ld batches of --batch-size a "
                    "step; %d rank(s) cannot keep that global batch (use a number of ranks that divides %ld)",
                    path, ck_world, ck_acc, batches, world, batches);
  int acc = (int)(batches / world);
  if (lead)
    printf("ctrain: resuming a %ld-rank run on %d rank(s): --accumulate %d keeps its global batch of %lld\n",
           ck_world, world, acc, (long long)batches * o->batch_size);
  o->accumulate = acc > 1 ? acc : 0;
  return CT_OK;
}

ct_status cli_dp_open(cli_dist *d, const cli_device_switches *sw, int threads) {
  char list[1024];
  snprintf(list, sizeof list, "%s", d->devices);
  ct_status s = CT_OK;
  for (char *save = NULL, *t = strtok_r(list, ",", &save); t && s == CT_OK; t = strtok_r(NULL, ",", &save)) {
    if (d->ndev == CLI_DP_MAX) return ct_error(CT_ERR_INVALID_ARG, "--devices: more than %d devices", CLI_DP_MAX);
    for (int k = 0; k < d->ndev; k++)
      if (!strcmp(ct_device_name(d->devs[k]), t))
        return ct_error(CT_ERR_INVALID_ARG, "--devices: %s is listed twice", t);
    s = cli_open_device(t, sw, &d->devs[d->ndev]);
    if (s == CT_OK) d->ndev++;
  }
  if (s == CT_OK && d->ndev < 2)
    s = ct_error(CT_ERR_INVALID_ARG, "--devices %s: DataParallel needs 2 or more devices", d->devices);
  /* The host's cores are shared among the replicas, unless told otherwise. */
  int t = threads;
  if (!t) t = getenv("OMP_NUM_THREADS") ? omp_get_max_threads() : (int)(sysconf(_SC_NPROCESSORS_ONLN) / (d->ndev ? d->ndev : 1));
  for (int k = 0; k < d->ndev; k++) ct_device_set_threads(d->devs[k], t > 0 ? t : 1);
  return s;
}

void cli_dp_close(cli_dist *d) {
  for (int k = 1; k < d->ndev; k++) ct_device_close(d->devs[k]);
  d->ndev = 0;
}

int cli_dist_fail(cli_dist *d, ct_status s) {
  if (!d->comm || ct_comm_size(d->comm) == 1) return cli_fail(s);
  fprintf(stderr, "ctrain: error: [rank %d/%d] %s\n", ct_comm_rank(d->comm), ct_comm_size(d->comm), ct_last_error());
  fflush(stderr);
  fflush(stdout);
  /* The other ranks would wait in their next collective until the
   * timeout: end the whole job now, with this rank's code. */
  ct_comm_abort(d->comm, cli_exit_code(s));
  return cli_exit_code(s);
}

ct_status cli_dist_device(const cli_dist *d, const char *name, const cli_device_switches *sw, ct_device **dev) {
  if (!d->ddp || strcmp(name, "cuda")) return cli_open_device(name, sw, dev);
  char own[32];
  int local = ct_comm_local_rank(d->comm);
  snprintf(own, sizeof own, "cuda:%d", local);
  ct_status s = cli_open_device(own, sw, dev);
  if (s != CT_OK)
    return ct_error_wrap(s, "--strategy ddp: rank %d takes %s, its local rank's GPU (one GPU per rank, %d rank(s) on "
                         "this host)", ct_comm_rank(d->comm), own, ct_comm_local_size(d->comm));
  return CT_OK;
}
