/* The CLI fuzz target's body (fuzz/fuzz_cli.c) over a deterministic corpus:
 * valid command lines of every subcommand, mutated. Every line must be
 * accepted with its values in range or refused as a usage error; a hang
 * (as `ctrain train --` once did) runs into ctest's timeout. A few lines
 * are also checked directly: the seeds are accepted, and the inputs that
 * used to hang are refused. Set CT_MUTATE_ITERS to run longer. */
#define CT_FUZZ_BODY_ONLY
#include "../../fuzz/fuzz_cli.c"

#include <fcntl.h>
#include <unistd.h>

#include "mutate_util.h"
#include "test_util.h"

/* Seed = subcommand byte + NUL-separated arguments (sizeof - 1 drops the
 * literal's own terminator; the last argument ends at the input's end). */
#define SEED(s) {(const uint8_t *)(s), sizeof(s) - 1}
static const mutate_seed seeds[] = {
    SEED("\x00--model\0cnn\0--data\0fashion-mnist\0--epochs=3\0--batch-size\000128\0--lr\0" "0.01\0--optimizer\0"
         "adamw\0--scheduler=plateau\0--lr-patience\0" "2\0--recompute\0--precision\0bf16\0--resume\0"
         "--checkpoint-dir\0/tmp/ck\0--input\0" "3x32x32\0--gpu-transforms\0--device\0cuda:0"),
    SEED("\x00--model=alexnet\0--data\0cifar10:/d\0--accumulate\0" "4\0--recompute=12\0--loss-scale-init\0"
         "65536\0--memory-format\0channels-last\0--seed\0" "7\0--weight-decay\0" "5e-4\0--clip-grad-norm=1\0"
         "--augment\0crop-flip\0--monitor\0val_accuracy\0--restore-best\0--data-on-gpu"),
    SEED("\x01--model\0m.txt\0--weights\0w.safetensors\0--data\0mnist\0--input\0" "784\0--threads\0" "2\0"
         "--metrics-json\0out.json\0--channels-last"),
    SEED("\x02--model\0cnn\0--images\0a.png\0--classes=10\0--resize\0" "227\0--opt-level\0O2"),
    SEED("\x03--model\0resnet50\0--input\0" "3x224x224\0--batch-size=256\0--recompute\0cheap\0--precision\0fp16"),
};

static int parse_line(int c, const char *const *args, int n) {
  static const char *const cmds[4] = {"train", "eval", "predict", "summary"};
  static const char *const flags[4] = {CLI_FLAGS_TRAIN, CLI_FLAGS_EVAL, CLI_FLAGS_PREDICT, CLI_FLAGS_SUMMARY};
  char *argv[FUZZ_CLI_MAX_ARGS];
  for (int i = 0; i < n; i++) argv[i] = (char *)args[i];
  int mode;
  n = cli_take_gpu_data_flags(n, argv, &mode);
  cli_opts o;
  return cli_parse(n, argv, cmds[c], flags[c], &o);
}

int main(void) {
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
    /* Each seed parses as a whole (its arguments end at its last byte). */
    char *args[FUZZ_CLI_MAX_ARGS];
    char buf[512];
    size_t n = seeds[i].n - 1;
    memcpy(buf, seeds[i].data + 1, n);
    buf[n] = 0;
    int argc = 0;
    for (size_t at = 0; at < n; at += strlen(buf + at) + 1) args[argc++] = buf + at;
    CHECK_MSG(parse_line(seeds[i].data[0], (const char *const *)args, argc) == 0, "seed %zu refused", i);
  }
  /* Once an endless loop: an empty flag name matched every word at once. */
  const char *dash[] = {"--model", "cnn", "--"};
  CHECK(parse_line(0, dash, 3) == CLI_EXIT_USAGE);
  const char *eq[] = {"--=3"};
  CHECK(parse_line(1, eq, 1) == CLI_EXIT_USAGE);
  const char *two[] = {"--model weights", "x"}; /* two listed words with their space */
  CHECK(parse_line(1, two, 2) == CLI_EXIT_USAGE);

  mutate_spec sp = {.seeds = seeds,
                    .n_seeds = (int)(sizeof seeds / sizeof seeds[0]),
                    .hot = 512,
                    .sig = "-=x.eE0123456789 ",
                    .cap = 1024,
                    .iters = 200000,
                    .one = fuzz_cli_one};
  /* The NUL that separates arguments is the most significant byte of all;
   * sig cannot hold it, so the edge values (which include 0) supply it.
   * cli_parse reports usage errors on stderr: thousands of lines here. */
  fflush(stderr);
  int saved = dup(2), devnull = open("/dev/null", O_WRONLY);
  if (devnull >= 0) dup2(devnull, 2);
  int bad = mutate_run("test_cli_mutate", &sp);
  fflush(stderr);
  if (saved >= 0) dup2(saved, 2);
  if (devnull >= 0) close(devnull);
  CHECK_MSG(bad == 0, "%d inconsistent command lines", bad);
  return test_summary("test_cli_mutate");
}
