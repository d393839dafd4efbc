/* The layout choice of src/nn/layout.h for each backend capability, on
 * the CPU: ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, ...) is what a
 * cuda device gets, so its rules can be checked without a GPU.
 *  - C16 through the generic entry equals what the cpu device chose when
 *    the model was prepared (the cpu rules did not move);
 *  - every NHWC activation obeys the rules, checked here independently
 *    of layout.c (producer kind, 4-D, dtype, never the output, every
 *    reader a convolution or a same-layout keeper, a keeper's input NHWC,
 *    a folded ReLU like its producer);
 *  - on a hand-analysed model the exact NHWC set is the expected one (an
 *    8-channel conv and an average pool take NHWC where C16 takes
 *    nothing; batch norm and dropout readers keep their producers plain);
 *  - f16 activations may be NHWC but never C16;
 *  - PLAIN (the reference backend's capability) chooses nothing. */
#include <stdio.h>

#include "test_util.h"

#include "nn/fuse.h"
#include "nn/layout.h"
#include "nn/model_impl.h"

static int is_keeper(const ct_layer *l) {
  return l->cls == &ct_layer_maxpool2d || l->cls == &ct_layer_activation || l->cls == &ct_layer_avgpool2d;
}

/* Number of NHWC choices in lay[] that break the rules. */
static int nhwc_violations(const char *name, const ct_model *m, const int *lay) {
  int bad = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    if (lay[i] != CT_LAYOUT_PLAIN && lay[i] != CT_LAYOUT_NHWC) {
      printf("%s: layer %d has layout %d under NHWC\n", name, i, lay[i]);
      bad++;
      continue;
    }
    if (ct_layer_is_fused(l)) {
      if (lay[i] != lay[l->inputs[0]]) printf("%s: folded layer %d differs from its producer\n", name, i), bad++;
      continue;
    }
    if (lay[i] != CT_LAYOUT_NHWC) continue;
    ct_dtype dt = m->act_dt ? m->act_dt[i] : CT_F32;
    int ok = (l->cls == &ct_layer_conv2d || is_keeper(l)) && i != m->output && l->out_ndim == 3 &&
             (dt == CT_F32 || dt == CT_BF16 || dt == CT_F16);
    if (is_keeper(l) && (l->inputs[0] < 0 || lay[l->inputs[0]] != CT_LAYOUT_NHWC)) ok = 0;
    for (int k = 0; k < m->n_layers; k++)
      for (int j = 0; j < m->layers[k].n_inputs; j++)
        if (m->layers[k].inputs[j] == i && m->layers[k].cls != &ct_layer_conv2d &&
            !(is_keeper(&m->layers[k]) && lay[k] == CT_LAYOUT_NHWC))
          ok = 0;
    if (!ok) printf("%s: layer %d (%s) is NHWC against the rules\n", name, i, l->cls->torch_name), bad++;
  }
  return bad;
}

static int count(const ct_model *m, const int *lay, int want) {
  int n = 0;
  for (int i = 0; i < m->n_layers; i++) n += lay[i] == want && !ct_layer_is_fused(&m->layers[i]);
  return n;
}

static ct_model *prepared(ct_device *dev, const char *name, int c, int h, int w) {
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create(name, &opt, &m));
  if (m) CHECK_OK(ct_model_prepare(m, dev, 2, 1));
  return m;
}

/* C16 through the generic entry = the cpu device's own choice; NHWC
 * obeys the rules and keeps at least `min_nhwc` activations. */
static void zoo_model(ct_device *dev, const char *name, int c, int h, int w, int min_nhwc) {
  ct_model *m = prepared(dev, name, c, h, w);
  if (!m) return;
  int L = m->n_layers;
  int *lay = calloc((size_t)L, sizeof *lay);
  ct_model_choose_layouts_for(m, CT_LAYOUT_C16, lay);
  int same = 1;
  for (int i = 0; i < L; i++) same &= lay[i] == (int)m->layers[i].y.layout;
  CHECK_MSG(same, "%s: C16 choice differs from the cpu device's", name);
  int c16 = count(m, lay, CT_LAYOUT_C16);
  ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, lay);
  int nhwc = count(m, lay, CT_LAYOUT_NHWC);
  CHECK_MSG(nhwc_violations(name, m, lay) == 0, "%s: NHWC rules broken", name);
  CHECK_MSG(nhwc >= min_nhwc, "%s: %d NHWC activations, expected at least %d", name, nhwc, min_nhwc);
  /* NHWC's rules are wider than C16's except for batch norm and residual
   * adds, which only the cpu backend keeps blocked. */
  int bn_or_add = 0;
  for (int i = 0; i < L; i++)
    bn_or_add |= m->layers[i].cls == &ct_layer_batchnorm || m->layers[i].cls == &ct_layer_add;
  if (!bn_or_add) CHECK_MSG(nhwc >= c16, "%s: NHWC (%d) keeps fewer activations than C16 (%d)", name, nhwc, c16);
  ct_model_choose_layouts_for(m, CT_LAYOUT_PLAIN, lay);
  CHECK_MSG(count(m, lay, CT_LAYOUT_NHWC) == 0 && count(m, lay, CT_LAYOUT_C16) == 0,
            "%s: PLAIN capability chose a layout", name);
  printf("%-10s C16 %d, NHWC %d activations\n", name, c16, nhwc);
  free(lay);
  ct_model_destroy(m);
}

/* Hand-analysed: see the expected set below. */
static const char *model_text =
    "input 3x20x20\n"
    "conv2d 3 8 3 padding=1\n"    /* 0: NHWC (8 channels: never C16) */
    "leakyrelu 0.1\n"             /* 1: NHWC, a keeper of 0 */
    "avgpool2d 2\n"               /* 2: NHWC (keeper under NHWC only) */
    "conv2d 8 24 3\n"             /* 3: plain, batch norm reads it */
    "batchnorm2d 24\n"            /* 4: plain */
    "relu\n"                      /* 5: plain, its input is plain */
    "conv2d 24 16 1\n"            /* 6: plain, the pool after it is */
    "maxpool2d 2\n"               /* 7: plain, dropout reads it */
    "dropout 0.2\n"               /* 8 */
    "conv2d 16 4 1\n"             /* 9: NHWC, a conv reads it */
    "conv2d 4 4 1\n"              /* 10: plain, flatten reads it */
    "flatten\n"
    "linear 64 10\n";

int main(void) {
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  zoo_model(dev, "cnn", 1, 28, 28, 2);
  zoo_model(dev, "alexnet", 3, 64, 64, 6); /* folded ReLUs not counted */
  zoo_model(dev, "resnet18", 3, 32, 32, 0);

  char path[] = "/tmp/ctrain_layout_choice_XXXXXX.txt";
  int fd = mkstemps(path, 4);
  CHECK(fd >= 0);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f) fputs(model_text, f), fclose(f);
  ct_model *m = prepared(dev, path, 3, 20, 20);
  remove(path);
  if (m) {
    int L = m->n_layers;
    int *lay = calloc((size_t)L, sizeof *lay);
    for (int i = 0; i < L; i++) printf("  layer %d %s%s\n", i, m->layers[i].cls->torch_name,
                                       ct_layer_is_fused(&m->layers[i]) ? " (folded)" : "");
    ct_model_choose_layouts_for(m, CT_LAYOUT_C16, lay);
    CHECK_MSG(count(m, lay, CT_LAYOUT_C16) == 0, "text model: %d C16 activations, expected none",
              count(m, lay, CT_LAYOUT_C16));
    ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, lay);
    CHECK(nhwc_violations("text model", m, lay) == 0);
    const int expect[] = {1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0};
    for (int i = 0; i < 11 && i < L; i++)
      CHECK_MSG((lay[i] == CT_LAYOUT_NHWC) == expect[i], "text model: layer %d (%s) NHWC %d, expected %d", i,
                m->layers[i].cls->torch_name, lay[i] == CT_LAYOUT_NHWC, expect[i]);
    /* f16 activations: NHWC keeps them, C16 may not. */
    if (m->act_dt) {
      for (int i = 0; i < L; i++) m->act_dt[i] = CT_F16;
      ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, lay);
      CHECK_MSG(lay[0] == CT_LAYOUT_NHWC && lay[9] == CT_LAYOUT_NHWC, "f16: NHWC dropped");
      CHECK(nhwc_violations("text model f16", m, lay) == 0);
    }
    free(lay);
    ct_model_destroy(m);
  }
  /* A conv that is the model's output stays plain. */
  char path2[] = "/tmp/ctrain_layout_choice2_XXXXXX.txt";
  fd = mkstemps(path2, 4);
  CHECK(fd >= 0);
  f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f) fputs("input 3x8x8\nconv2d 3 4 3\nrelu\nconv2d 4 4 3\n", f), fclose(f);
  m = prepared(dev, path2, 3, 8, 8);
  remove(path2);
  if (m) {
    int lay[8] = {0};
    ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, lay);
    CHECK_MSG(lay[m->output] == CT_LAYOUT_PLAIN, "the model output is NHWC");
    CHECK_MSG(lay[0] == CT_LAYOUT_NHWC, "the first conv (read by relu then a conv) is not NHWC");
    CHECK(nhwc_violations("output model", m, lay) == 0);
    ct_model_destroy(m);
  }
  ct_device_close(dev);

  /* The reference backend asks for nothing. */
  CHECK_OK(ct_device_open("ref", &dev));
  m = prepared(dev, "cnn", 1, 28, 28);
  if (m) {
    int *lay = calloc((size_t)m->n_layers, sizeof *lay);
    ct_model_choose_layouts(m, lay);
    CHECK_MSG(count(m, lay, CT_LAYOUT_NHWC) == 0 && count(m, lay, CT_LAYOUT_C16) == 0, "ref device chose a layout");
    free(lay);
    ct_model_destroy(m);
  }
  ct_device_close(dev);
  return test_summary("layout_choice");
}
