/* The model-file fuzz target's body (fuzz/fuzz_model_text.c) over a
 * deterministic corpus: valid model texts that between them use every
 * keyword, option and input form of docs/MODEL_FORMAT.md (nested residual
 * blocks, comments, tabs, CRLF, upper case, a last line without '\n'),
 * damaged by tests/mutate_util.h's loop with the grammar's significant
 * characters, plus, one input in eight, a keyword written over the start
 * of a line or a number turned into nines. Every input, written to a file
 * and parsed by ct_model_parse_file, must be rejected with a message naming
 * the file and a line it has (or the whole file), or accepted as a model
 * whose state entries, counts and bytes agree, under 256 MiB of parameters,
 * that (when small) prepares on the reference device with a matching
 * summary and (when cheap) trains a step; crashes, hangs and out-of-bounds
 * accesses (ASan/valgrind) fail it too. Set CT_MUTATE_ITERS to run
 * longer. */
#define CT_FUZZ_BODY_ONLY
#include "../../fuzz/fuzz_model_text.c"

#include "mutate_util.h"
#include "test_util.h"

static const char *const seed_text[] = {
    /* Every image layer kind and option, nested blocks, a shortcut. */
    "# every image layer kind of the format\n"
    "input 3x12x12\n"
    "Conv2d 3 8 3 padding=1 stride=1 dilation=1 groups=1 bias=true   # 8x12x12\n"
    "batchnorm2d 8 eps=0.001 momentum=0.2 affine=1\n"
    "RELU\n"
    "maxpool2d 3 stride=2 padding=1 ceil_mode=true   # 8x7x7\n"
    "residual\n"
    "  conv2d 8 8 3 padding=1 groups=4 bias=false\n"
    "  batchnorm2d 8 affine=false\n"
    "  gelu\n"
    "  residual\n"
    "    conv2d 8 8 1\n"
    "    silu\n"
    "  end\n"
    "end\n"
    "residual\n"
    "  conv2d 8 16 3 stride=2 padding=2 dilation=2   # 16x4x4\n"
    "  tanh\n"
    "shortcut\n"
    "  conv2d 8 16 1 stride=2\n"
    "  batchnorm2d 16\n"
    "end\n"
    "avgpool2d 2 stride=1 padding=1 ceil_mode=false count_include_pad=false   # 16x5x5\n"
    "dropout2d 0.25\n"
    "adaptiveavgpool2d 3 2\n"
    "adaptivemaxpool2d 2\n"
    "sigmoid\n"
    "flatten\n"
    "linear 64 10 bias=false\n",
    /* A vector model: flat input, tabs, a residual with a shortcut. */
    "input 20\n"
    "linear 20 16\n"
    "batchnorm1d 16 momentum=0.01 eps=1e-4\n"
    "leakyrelu 0.2\n"
    "dropout 0.1\n"
    "residual\n"
    "\tlinear 16 16\n"
    "\tidentity\n"
    "shortcut\n"
    "\tidentity\n"
    "end\n"
    "LeakyReLU\n"
    "linear 16 5 bias=0\n"
    "softmax\n",
    /* CRLF lines, blocks three deep, default arguments. */
    "input 2x6x6\r\n"
    "residual\r\n"
    " residual\r\n"
    "  residual\r\n"
    "   conv2d 2 2 3 padding=1\r\n"
    "  end\r\n"
    "  relu\r\n"
    " end\r\n"
    "end\r\n"
    "dropout\r\n"
    "conv2d 2 4 2 stride=2\r\n"
    "avgpool2d 3 padding=1\r\n"
    "adaptivemaxpool2d 1\r\n"
    "flatten\r\n"
    "linear 4 3\r\n"
    "logsoftmax\r\n",
    /* tests/data/models/cnn.txt, comments with numbers included. */
    "# torchkeras' MNIST CnnModel\n"
    "input 1x28x28\n"
    "conv2d 1 32 3          # 0\n"
    "maxpool2d 2 stride=2   # 1\n"
    "conv2d 32 64 5         # 2\n"
    "maxpool2d 2 stride=2   # 3\n"
    "dropout2d 0.1          # 4\n"
    "adaptivemaxpool2d 1    # 5\n"
    "flatten                # 6\n"
    "linear 64 32           # 7\n"
    "relu                   # 8\n"
    "linear 32 10           # 9\n",
    /* The shortest kind: no comment, no final newline. */
    "input 4x5x5\nidentity\nbatchnorm2d 4\nflatten\nlinear 100 2",
};
enum { N_SEEDS = (int)(sizeof seed_text / sizeof seed_text[0]) };

/* Lines the grammar treats specially, and sizes near its limits. */
static const char *const words[] = {"residual", "shortcut", "end", "input 8x5x5", "input 9", "input 1048576x1x1",
                                    "flatten", "identity", "relu", "conv2d 8 8 3", "linear 16 16", "batchnorm2d 8",
                                    "batchnorm1d 16", "maxpool2d 2", "adaptiveavgpool2d 1", "dropout 1", "# ",
                                    "1048576", "1024", "2147483648", "x=1=", "stride=0"};

/* The format's own damage, in place: a keyword written over the start of
 * a line, or every digit of a number made a 9 (the largest value of its
 * length, to probe the size limits). */
static void mt_extra(ct_rng *rng, uint8_t *buf, size_t n) {
  if (!n) return;
  size_t pos = ct_rng_below(rng, (uint32_t)n);
  if (ct_rng_below(rng, 2)) {
    while (pos > 0 && buf[pos - 1] != '\n') pos--;
    const char *w = words[ct_rng_below(rng, sizeof words / sizeof words[0])];
    for (size_t k = 0; w[k] && pos < n; k++) buf[pos++] = (uint8_t)w[k];
    if (pos < n && buf[pos] != '\n') buf[pos] = ' ';
  } else {
    while (pos < n && (buf[pos] < '0' || buf[pos] > '9')) pos++;
    while (pos < n && buf[pos] >= '0' && buf[pos] <= '9') buf[pos++] = '9';
  }
}

int main(void) {
  mutate_seed seeds[N_SEEDS];
  ct_model_options opt = {0};
  char path[700];
  for (int i = 0; i < N_SEEDS; i++) {
    seeds[i].data = (const uint8_t *)seed_text[i];
    seeds[i].n = strlen(seed_text[i]);
    /* A seed the parser refuses would leave the loop only damaging
     * rejects: each must be a model. */
    ct_model *m = NULL;
    const char *p = fuzz_scratch_file("seed.txt", seeds[i].data, seeds[i].n, path, sizeof path);
    CHECK(p != NULL);
    if (!p) continue;
    ct_status s = ct_model_parse_file(p, &opt, &m);
    CHECK_MSG(s == CT_OK && m, "seed %d refused: %s", i, ct_last_error());
    ct_model_destroy(m);
  }
  mutate_spec sp = {
      .seeds = seeds,
      .n_seeds = N_SEEDS,
      .hot = 0, /* a damaged line anywhere stops the parse there: damage spreads evenly */
      .sig = "0123456789xX=#.-+e \t\r\n",
      .cap = 4096,
      .iters = 60000,
      .extra = mt_extra,
      .one = ct_fuzz_model_text_one,
  };
  int failures = mutate_run("test_model_text_mutate", &sp);
  CHECK_MSG(failures == 0, "%d inconsistent inputs", failures);
  printf("test_model_text_mutate: %ld accepted (%ld ran a training step), %ld rejected\n", fuzz_mt_accepted,
         fuzz_mt_stepped, fuzz_mt_rejected);
  /* Both outcomes must be reached, or the loop tests one side only (the
   * seeds alone, CT_MUTATE_ITERS=0, are all accepted). */
  const char *env = getenv("CT_MUTATE_ITERS");
  CHECK(fuzz_mt_accepted > 0 && fuzz_mt_stepped > 0);
  if (!env || atol(env) >= 1000) CHECK(fuzz_mt_rejected > 0);
  ct_fuzz_model_text_done();
  fuzz_scratch_clear();
  return test_summary("test_model_text_mutate");
}
