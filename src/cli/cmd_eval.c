/* ctrain eval and ctrain predict. */
#include <dirent.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/metrics_json.h"
#include "ctrain/checkpoint.h"

static const char *EVAL_HELP =
    "usage: ctrain eval --model NAME|FILE --weights FILE.safetensors --data NAME[:PATH] [options]\n"
    "\n"
    "Evaluates saved weights on the test split: loss, accuracy, top-5.\n"
    "  --batch-size N (64)  --input CxHxW|F  --classes N  --resize N  --device D  --threads N  --workers N\n"
    "  --seed N  --metrics-json FILE\n"
    "  --precision fp32|bf16|fp16 (fp32)  --opt-level O1|O2|O3 (O1 with a low precision): run the forward\n"
    "  passes under mixed precision, as in training (docs/MIXED_PRECISION.md)\n"
    "  --memory-format auto|contiguous|channels-last (auto)  activation layout; --channels-last for short\n"
    "  --gpu-transforms        (CUDA) the loader hands over uint8 batches; resize/normalize run on the GPU\n"
    "  --data-on-gpu           (CUDA) the test split uploaded once as uint8; batches gathered and transformed on the GPU\n"
    CLI_DEVICE_SWITCHES_HELP;

static const char *PREDICT_HELP =
    "usage: ctrain predict --model NAME|FILE --weights FILE.safetensors (--data NAME[:PATH] | --images FILE|DIR)\n"
    "\n"
    "Prints one CSV line per sample: index, source, label, predicted class, its probability,\n"
    "then the probability of every class.\n"
    "  --batch-size N (64)  --input CxHxW|F  --classes N  --resize N  --device D  --threads N  --workers N\n"
    "  --precision fp32|bf16|fp16 (fp32)  --opt-level O1|O2|O3 (O1 with a low precision)\n"
    "  --memory-format auto|contiguous|channels-last (auto)  activation layout; --channels-last for short\n"
    "  --gpu-transforms        (CUDA) the loader hands over uint8 batches; resize/normalize run on the GPU\n"
    "  --data-on-gpu           (CUDA) the data (or images) uploaded once as uint8; batches gathered and transformed\n"
    "                          on the GPU\n"
    CLI_DEVICE_SWITCHES_HELP;

static int wants_help(int argc, char **argv, const char *help) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(help, stdout);
      return 1;
    }
  return 0;
}

static ct_status load_model(const cli_opts *o, const ct_dataset *ds, ct_device *dev, ct_model **m) {
  CT_TRY(cli_open_model(o, ds, m));
  CT_TRY(cli_check_splits(o, NULL, ds, *m));
  /* Before prepare: the precision decides every activation's dtype. */
  CT_TRY(cli_apply_precision(o, *m, NULL));
  CT_TRY(ct_weights_load(*m, o->weights, 1, NULL));
  cli_gpu_data_model(o, *m);
  return ct_model_prepare(*m, dev, o->batch_size, 0);
}

/* eval's and predict's flags: the GPU data flags and the device switches,
 * which cli_parse does not know, then the rest. */
static int parse_args(const char *cmd, const char *flags, int argc, char **argv, cli_opts *o, cli_device_switches *sw,
                      int *gpu_data_mode) {
  argc = cli_take_gpu_data_flags(argc, argv, gpu_data_mode);
  argc = cli_take_device_switches(argc, argv, sw);
  return cli_parse(argc, argv, cmd, flags, o);
}

int cmd_eval(int argc, char **argv) {
  if (wants_help(argc, argv, EVAL_HELP)) return 0;
  int gpu_data_mode;
  cli_device_switches sw;
  cli_opts o;
  int r = parse_args("eval", CLI_FLAGS_EVAL, argc, argv, &o, &sw, &gpu_data_mode);
  if (r) return r;
  if (!o.model || !o.weights || !o.data) {
    fprintf(stderr, "ctrain eval: --model, --weights and --data are required (see 'ctrain eval --help')\n");
    return CLI_EXIT_USAGE;
  }
  if ((r = cli_check_device_switches("eval", &sw))) return r;
  /* The loader's mode; ct_evaluate attaches the device side to it. */
  if ((r = cli_use_gpu_data("eval", gpu_data_mode, &o))) return r;
  if (o.threads) omp_set_num_threads(o.threads);
  ct_device *dev = NULL;
  ct_dataset *ds = NULL;
  ct_loader *l = NULL;
  ct_model *m = NULL;
  ct_eval_result er;
  ct_status s = cli_check_output("--metrics-json", o.metrics_json);
  /* The device (and its switches) first: a refused switch costs no data. */
  if (s == CT_OK) s = cli_open_device(o.device, &sw, &dev);
  if (s == CT_OK) s = cli_open_data(&o, 0, &ds, &l, 0, 0);
  if (s == CT_OK) s = load_model(&o, ds, dev, &m);
  if (s == CT_OK) s = ct_evaluate(m, dev, l, CT_LOSS_CROSS_ENTROPY, 0.0f, &er);
  if (s == CT_OK)
    printf("test_loss: %.4f - test_accuracy: %.4f - test_top5: %.4f - samples: %lld\n", er.loss, er.accuracy, er.top5,
           (long long)er.samples);
  if (s == CT_OK && o.metrics_json) {
    cli_metrics cm = {.model = ct_model_name(m), .dataset = ct_dataset_name(ds), .device = ct_device_name(dev),
                      .precision = ct_precision_name(ct_model_precision(m)), .seed = o.seed, .eval = &er};
    s = cli_write_metrics_json(o.metrics_json, &cm);
  }
  int code = s == CT_OK ? 0 : cli_fail(s);
  ct_model_destroy(m);
  ct_loader_destroy(l);
  ct_dataset_close(ds);
  ct_device_close(dev);
  return code;
}

typedef struct pred_ctx {
  char **sources; /* per sample, or NULL */
} pred_ctx;

static ct_status print_pred(void *vctx, int64_t index, const float *probs, int64_t k, int64_t label) {
  pred_ctx *c = vctx;
  int64_t best = 0;
  for (int64_t j = 1; j < k; j++)
    if (probs[j] > probs[best]) best = j;
  printf("%lld,%s,%lld,%lld,%.6f", (long long)index, c->sources ? c->sources[index] : "", (long long)label,
         (long long)best, probs[best]);
  for (int64_t j = 0; j < k; j++) printf(",%.6g", probs[j]);
  printf("\n");
  return CT_OK;
}

static int is_image_name(const char *n) {
  const char *e = strrchr(n, '.');
  return e && (!strcasecmp(e, ".png") || !strcasecmp(e, ".jpg") || !strcasecmp(e, ".jpeg"));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Decodes FILE or every image in DIR (sorted) into a dataset of the
 * model's channel count; all images must share one size. */
static ct_status images_dataset(const char *path, int want_c, ct_dataset **out, char ***sources, int64_t *count) {
  struct stat sb;
  if (stat(path, &sb) != 0) return ct_error(CT_ERR_NOT_FOUND, "%s: no such image file or directory", path);
  char **files = NULL;
  int64_t n = 0, cap = 0;
  if (S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return ct_error(CT_ERR_IO, "%s: cannot open directory", path);
    for (struct dirent *e; (e = readdir(d));) {
      if (!is_image_name(e->d_name)) continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 16;
        char **nf = realloc(files, (size_t)cap * sizeof *nf);
        if (!nf) break;
        files = nf;
      }
      if (asprintf(&files[n], "%s/%s", path, e->d_name) >= 0) n++;
    }
    closedir(d);
    if (!n) {
      free(files);
      return ct_error(CT_ERR_NOT_FOUND, "%s: no .png or .jpg files in this directory", path);
    }
    qsort(files, (size_t)n, sizeof *files, cmp_str);
  } else {
    files = malloc(sizeof *files);
    if (!files || !(files[0] = strdup(path))) return ct_error(CT_ERR_OUT_OF_MEMORY, "predict: out of memory");
    n = 1;
  }
  ct_status s = CT_OK;
  uint8_t *all = NULL;
  int64_t *labels = calloc((size_t)n, sizeof *labels);
  int H = 0, W = 0;
  for (int64_t i = 0; s == CT_OK && i < n; i++) {
    uint8_t *px;
    int h, w, c;
    s = ct_image_decode(files[i], &px, &h, &w, &c);
    if (s != CT_OK) break;
    if (!all) {
      H = h, W = w;
      all = malloc((size_t)n * (size_t)want_c * (size_t)h * (size_t)w);
      if (!all || !labels) s = ct_error(CT_ERR_OUT_OF_MEMORY, "predict: out of memory for %lld images", (long long)n);
    } else if (h != H || w != W) {
      s = ct_error(CT_ERR_SHAPE, "%s: image is %dx%d but %s is %dx%d; all images must have one size", files[i], w, h,
                   files[0], W, H);
    }
    if (s == CT_OK) { /* HWC -> CHW, converting gray <-> RGB to the model's channels */
      uint8_t *dst = all + (size_t)i * (size_t)want_c * (size_t)H * (size_t)W;
      for (int ch = 0; ch < want_c; ch++)
        for (int64_t p = 0; p < (int64_t)H * W; p++) {
          uint8_t v;
          if (c == want_c) v = px[p * c + ch];
          else if (c == 3) v = (uint8_t)((299 * px[p * 3] + 587 * px[p * 3 + 1] + 114 * px[p * 3 + 2] + 500) / 1000);
          else v = px[p * c];
          dst[(size_t)ch * H * W + p] = v;
        }
    }
    free(px);
  }
  if (s == CT_OK) s = ct_dataset_from_memory("images", n, want_c, H, W, 1, all, labels, out);
  free(all);
  free(labels);
  if (s != CT_OK) {
    for (int64_t i = 0; i < n; i++) free(files[i]);
    free(files);
    return s;
  }
  *sources = files;
  *count = n;
  return CT_OK;
}

int cmd_predict(int argc, char **argv) {
  if (wants_help(argc, argv, PREDICT_HELP)) return 0;
  int gpu_data_mode;
  cli_device_switches sw;
  cli_opts o;
  int r = parse_args("predict", CLI_FLAGS_PREDICT, argc, argv, &o, &sw, &gpu_data_mode);
  if (r) return r;
  if (!o.model || !o.weights || (!o.data == !o.images)) {
    fprintf(stderr, "ctrain predict: --model, --weights and exactly one of --data or --images are required\n");
    return CLI_EXIT_USAGE;
  }
  if ((r = cli_check_device_switches("predict", &sw))) return r;
  if ((r = cli_use_gpu_data("predict", gpu_data_mode, &o))) return r;
  if (o.threads) omp_set_num_threads(o.threads);
  ct_device *dev = NULL;
  ct_dataset *ds = NULL;
  ct_loader *l = NULL;
  ct_model *m = NULL;
  pred_ctx pc = {NULL};
  int64_t n_src = 0;
  ct_status s = cli_open_device(o.device, &sw, &dev);
  if (s == CT_OK && o.data) {
    s = cli_open_data(&o, 0, &ds, &l, 0, 0);
    if (s == CT_OK) s = load_model(&o, ds, dev, &m);
  } else if (s == CT_OK) {
    /* The model fixes the channels; images come in at their own size. */
    s = cli_open_model(&o, NULL, &m);
    if (s == CT_OK) s = cli_apply_precision(&o, m, NULL);
    int c = 1, h, w;
    if (s == CT_OK) ct_model_input_shape(m, &c, &h, &w);
    if (s == CT_OK) s = images_dataset(o.images, c, &ds, &pc.sources, &n_src);
    if (s == CT_OK) s = ct_weights_load(m, o.weights, 1, NULL);
    if (s == CT_OK) cli_gpu_data_model(&o, m);
    if (s == CT_OK) s = ct_model_prepare(m, dev, o.batch_size, 0);
    if (s == CT_OK) {
      ct_loader_options lo;
      ct_loader_options_default(&lo);
      lo.batch_size = o.batch_size;
      lo.workers = 0;
      lo.mode = o.loader_mode;
      int dc, dh, dw;
      ct_dataset_shape(ds, &dc, &dh, &dw);
      if (dh != h || dw != w) lo.transform.resize_h = h, lo.transform.resize_w = w;
      s = ct_loader_create(ds, &lo, &l);
    }
  }
  if (s == CT_OK) {
    printf("index,source,label,predicted,probability");
    for (int64_t j = 0; j < ct_model_output_size(m); j++) printf(",p%lld", (long long)j);
    printf("\n");
    s = ct_predict(m, dev, l, print_pred, &pc);
  }
  int code = s == CT_OK ? 0 : cli_fail(s);
  for (int64_t i = 0; i < n_src; i++) free(pc.sources[i]);
  free(pc.sources);
  ct_model_destroy(m);
  ct_loader_destroy(l);
  ct_dataset_close(ds);
  ct_device_close(dev);
  return code;
}
