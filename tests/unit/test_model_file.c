/* Bad model files: every one is refused with a status and a message that
 * names the file and the line (and, for shape errors, what was expected
 * and what was found); none crashes. Also: the example files in
 * tests/data/models/ load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static char g_path[1024];

/* tests/data/models/<name> of the source tree, found from this file's own
 * path (CMake compiles it by absolute path). */
static const char *data_model(const char *name, char *buf, size_t n) {
  const char *src = __FILE__;
  const char *cut = strstr(src, "tests/unit/");
  snprintf(buf, n, "%.*stests/data/models/%s", cut ? (int)(cut - src) : 0, src, name);
  return buf;
}

static const char *write_file(const char *name, const void *data, size_t n) {
  snprintf(g_path, sizeof g_path, "%s/model_file_%s.txt", test_tmpdir(), name);
  FILE *f = fopen(g_path, "wb");
  if (!f) return NULL;
  fwrite(data, 1, n, f);
  fclose(f);
  return g_path;
}

/* Creates a model from text; expects status want and a message holding
 * the file name, "<file>:<line>" when line > 0, and each of the extra
 * substrings. */
static void expect_error(const char *name, const char *text, ct_status want, int line, const char *sub1,
                         const char *sub2) {
  const char *path = write_file(name, text, strlen(text));
  CHECK_MSG(path != NULL, "cannot write %s", name);
  if (!path) return;
  ct_model *m = NULL;
  ct_model_options o = {0};
  ct_status s = ct_model_create(path, &o, &m);
  const char *msg = ct_last_error();
  if (getenv("TEST_VERBOSE")) printf("%-18s %-18s %s\n", name, ct_status_name(s), msg);
  CHECK_MSG(s == want, "%s: got %s (%s), expected %s", name, ct_status_name(s), msg, ct_status_name(want));
  CHECK_MSG(m == NULL, "%s: model returned with an error", name);
  CHECK_MSG(strstr(msg, path) != NULL, "%s: message does not name the file: %s", name, msg);
  if (line > 0) {
    char at[1100];
    snprintf(at, sizeof at, "%s:%d", path, line);
    CHECK_MSG(strstr(msg, at) != NULL, "%s: message does not name line %d: %s", name, line, msg);
  }
  if (sub1) CHECK_MSG(strstr(msg, sub1) != NULL, "%s: message lacks '%s': %s", name, sub1, msg);
  if (sub2) CHECK_MSG(strstr(msg, sub2) != NULL, "%s: message lacks '%s': %s", name, sub2, msg);
  if (s == CT_OK) ct_model_destroy(m);
}

int main(void) {
  /* Syntax. */
  expect_error("unknown_layer", "input 1x8x8\nconv2d 1 4 3\nconvolution 4 4 3\n", CT_ERR_PARSE, 3, "convolution",
               "expected");
  expect_error("missing_arg", "input 1x8x8\n\nconv2d 1 4\n", CT_ERR_PARSE, 3, "kernel_size", NULL);
  expect_error("non_integer", "input 1x8x8\nconv2d 1 four 3\n", CT_ERR_PARSE, 2, "out_channels", "four");
  expect_error("float_channels", "input 1x8x8\nconv2d 1 4.5 3\n", CT_ERR_PARSE, 2, "integer", NULL);
  expect_error("huge_channels", "input 1x8x8\nconv2d 1 1000000000 3\n", CT_ERR_PARSE, 2, "out_channels", NULL);
  expect_error("huge_kernel", "input 1x8x8\n# comment\nconv2d 1 4 5000\n", CT_ERR_PARSE, 3, "kernel_size", NULL);
  expect_error("overflow_int", "input 1x8x8\nlinear 99999999999999999999 3\n", CT_ERR_PARSE, 2, "in_features", NULL);
  expect_error("negative", "input 1x8x8\nmaxpool2d -2\n", CT_ERR_PARSE, 2, "kernel_size", NULL);
  expect_error("unknown_option", "input 1x8x8\nconv2d 1 4 3 strides=2\n", CT_ERR_PARSE, 2, "strides=2", NULL);
  expect_error("bad_bool", "input 1x8x8\nconv2d 1 4 3 bias=maybe\n", CT_ERR_PARSE, 2, "bias", "maybe");
  expect_error("too_many_args", "input 1x8x8\nrelu 3\n", CT_ERR_PARSE, 2, "too many", NULL);
  expect_error("bad_dropout", "input 4\ndropout 1.5\n", CT_ERR_PARSE, 2, "p", NULL);
  expect_error("bad_input", "input 1x0x8\nrelu\n", CT_ERR_PARSE, 1, "input", NULL);
  expect_error("bad_input2", "input 1x8\nrelu\n", CT_ERR_PARSE, 1, "input", NULL);
  expect_error("late_input", "input 1x8x8\nrelu\ninput 1x8x8\n", CT_ERR_PARSE, 3, "input", NULL);

  /* Shapes: expected vs actual, and the line of the offending layer. */
  expect_error("in_channels", "input 3x8x8\nconv2d 3 8 3\nrelu\nconv2d 4 8 3\n", CT_ERR_SHAPE, 4, "4", "got [N, 8, 6, 6]");
  expect_error("linear_in", "input 1x4x4\nflatten\nlinear 10 2\n", CT_ERR_SHAPE, 3, "[N, 10]", "got [N, 16]");
  expect_error("linear_no_flatten", "input 1x4x4\nlinear 16 2\n", CT_ERR_SHAPE, 2, "flatten", NULL);
  expect_error("bn_features", "input 3x8x8\nbatchnorm2d 4\n", CT_ERR_SHAPE, 2, "expected 4", "got 3");
  expect_error("kernel_too_big", "input 1x4x4\nconv2d 1 2 7\n", CT_ERR_SHAPE, 2, "4x4", "7x7");
  expect_error("residual_shape", "input 2x8x8\nresidual\nconv2d 2 4 3 padding=1\nend\n", CT_ERR_SHAPE, 4,
               "residual", "shape");

  /* Blocks. */
  expect_error("no_end", "input 2x8x8\nresidual\nconv2d 2 2 3 padding=1\n", CT_ERR_PARSE, 0, "line 2", "end");
  expect_error("shortcut_outside", "input 2x8x8\nrelu\nshortcut\nrelu\n", CT_ERR_PARSE, 3, "shortcut", NULL);
  expect_error("stray_end", "input 2x8x8\nrelu\nend\n", CT_ERR_PARSE, 3, "end", NULL);
  expect_error("empty_residual", "input 2x8x8\nresidual\nend\n", CT_ERR_PARSE, 3, "empty", NULL);

  /* Found by fuzz/fuzz_model_text.c. A layer refused by a check after its
   * setup had set the output shape (conv2d's parameter limit) was blamed
   * on the next layer's line, or on none. Sizes the model refuses are the
   * file's content: CT_ERR_PARSE (exit 4), as syntax errors are. */
  expect_error("conv_params_line", "input 1024x8x8\nconv2d 1024 1048576 3\nrelu\n", CT_ERR_PARSE, 2,
               "parameters in one layer", NULL);
  expect_error("conv_params_last", "input 1024x8x8\nconv2d 1024 1048576 3\n", CT_ERR_PARSE, 2, "parameters",
               NULL);
  /* Sizes no device holds, refused before anything is allocated: 2^60
   * elements per sample (at batch 4 the planner's byte count wrapped to a
   * small arena, which the forward pass overran), an input of as many, and
   * 2^31 + 2^16 + 2^14 parameters over two layers (16 GiB with their
   * gradients, which were allocated and written). */
  expect_error("huge_activation", "input 1048576x1x1\nadaptiveavgpool2d 1048576\nadaptiveavgpool2d 1\n", CT_ERR_SHAPE,
               2, "per sample", "1048576, 1048576, 1048576");
  expect_error("huge_input", "input 1048576x1048576x1048576\nrelu\n", CT_ERR_PARSE, 1, "elements per sample", NULL);
  expect_error("total_params", "input 65536\nlinear 65536 16384\nrelu\nlinear 16384 65536\n", CT_ERR_PARSE, 4,
               "in all", NULL);
  {
    /* 4097 layers: a megabyte of 'relu' lines took the planner tens of
     * minutes. */
    char *t = malloc(16 + 5 * 4097), *e = t + sprintf(t, "input 4\n");
    for (int i = 0; i < 4097; i++) e += sprintf(e, "relu\n");
    expect_error("too_many_layers", t, CT_ERR_PARSE, 4098, "4096 layers", NULL);
    /* A residual block's add counts too: 4094 relus, then a block of one
     * relu and its add make 4096 (accepted), a second relu in it 4097. */
    e = t + sprintf(t, "input 4\n");
    for (int i = 0; i < 4094; i++) e += sprintf(e, "relu\n");
    sprintf(e, "residual\nrelu\nend\n");
    ct_model *m = NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/layers_4096.txt", test_tmpdir());
    FILE *f = fopen(path, "w");
    if (f) fputs(t, f), fclose(f);
    ct_model_options o = {0};
    CHECK_OK(ct_model_create(path, &o, &m));
    ct_model_destroy(m);
    remove(path);
    sprintf(e, "residual\nrelu\nrelu\nend\n");
    expect_error("too_many_with_add", t, CT_ERR_PARSE, 4099, "4096 layers", NULL);
    free(t);
  }
  /* Bytes that were skipped unseen: a word starting with 0x01 (the
   * parser's old mark for a used option), and the rest of a line after a
   * NUL, which also shifted the line numbers of later messages. */
  expect_error("control_byte", "input 4\nrelu \x01junk\n", CT_ERR_PARSE, 2, "unexpected", NULL);
  {
    static const char nul[] = "input 4\nrelu\0 junk\nrelu\n";
    const char *path = write_file("nul_byte", nul, sizeof nul - 1);
    ct_model *m = NULL;
    ct_model_options o = {0};
    ct_status s = ct_model_create(path, &o, &m);
    char at[1100];
    snprintf(at, sizeof at, "%s:2:", path);
    CHECK_MSG(s == CT_ERR_PARSE && strstr(ct_last_error(), at) && strstr(ct_last_error(), "NUL"), "nul_byte: %s (%s)",
              ct_status_name(s), ct_last_error());
    CHECK(m == NULL);
    ct_model_destroy(m);
  }
  expect_error("trailing_x", "input 4x4x4x\nrelu\n", CT_ERR_PARSE, 1, "CxHxW", NULL);
  expect_error("trailing_x_flat", "input 8x\nrelu\n", CT_ERR_PARSE, 1, "CxHxW", NULL);

  /* Whole-file problems. */
  expect_error("empty", "", CT_ERR_PARSE, 0, "no layers", NULL);
  expect_error("only_comments", "# nothing here\n\n   \n", CT_ERR_PARSE, 0, "no layers", NULL);
  expect_error("no_input", "conv2d 1 4 3\nrelu\n", CT_ERR_PARSE, 0, "input", NULL);
  {
    /* Binary garbage: deterministic bytes with NULs and high bits. */
    unsigned char g[4096];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof g; i++) x = x * 1103515245u + 12345u, g[i] = (unsigned char)(x >> 16);
    const char *path = write_file("garbage", g, sizeof g);
    ct_model *m = NULL;
    ct_model_options o = {0};
    ct_status s = ct_model_create(path, &o, &m);
    CHECK_MSG(s == CT_ERR_PARSE, "garbage: %s (%s)", ct_status_name(s), ct_last_error());
    CHECK_MSG(strstr(ct_last_error(), path) != NULL && strstr(ct_last_error(), ":1:"), "garbage: %s", ct_last_error());
    CHECK(m == NULL);
  }
  {
    /* A 10,000-character line. */
    size_t n = 10000;
    char *t = malloc(n + 64);
    strcpy(t, "input 1x8x8\nrelu ");
    size_t k = strlen(t);
    memset(t + k, 'x', n);
    strcpy(t + k + n, "\nrelu\n");
    expect_error("long_line", t, CT_ERR_PARSE, 2, "longer than", NULL);
    free(t);
  }
  {
    ct_model *m = NULL;
    ct_model_options o = {0};
    const char *path = "/nonexistent/dir/model.txt";
    ct_status s = ct_model_create(path, &o, &m);
    CHECK_MSG(s == CT_ERR_IO || s == CT_ERR_NOT_FOUND, "nonexistent: %s", ct_status_name(s));
    CHECK_MSG(strstr(ct_last_error(), path) != NULL, "nonexistent: %s", ct_last_error());
    CHECK(m == NULL);
  }
  {
    /* Unknown zoo names list the zoo. */
    ct_model *m = NULL;
    ct_model_options o = {0};
    ct_status s = ct_model_create("resnet1000", &o, &m);
    CHECK(s == CT_ERR_NOT_FOUND && strstr(ct_last_error(), "resnet18") != NULL);
  }

  /* The example files load, with the keys docs/MODEL_FORMAT.md promises. */
  {
    char path[1024];
    data_model("parity.txt", path, sizeof path);
    ct_model *m = NULL;
    ct_model_options o = {0};
    CHECK_OK(ct_model_create(path, &o, &m));
    if (m) {
      CHECK(ct_model_state_find(m, "4.body.1.running_var") >= 0);
      CHECK(ct_model_state_find(m, "6.shortcut.0.weight") >= 0);
      CHECK(ct_model_state_find(m, "6.shortcut.0.bias") < 0); /* bias=false */
      CHECK(ct_model_state_find(m, "17.bias") >= 0);
      ct_model_destroy(m);
    }
    data_model("cnn.txt", path, sizeof path);
    CHECK_OK(ct_model_create(path, &o, &m));
    if (m) {
      CHECK(ct_model_param_count(m) == 53994);
      CHECK(ct_model_state_find(m, "0.weight") == 0);
      ct_model_destroy(m);
    }
  }
  return test_summary("test_model_file");
}
