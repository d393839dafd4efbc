/* The layout choice of src/plan/layout.h for each backend capability, on
 * the CPU: ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, cuda's dtypes,
 * ...) is what a cuda device gets, so its rules can be checked without a
 * GPU.
 *  - the cpu's own layout (C16, or C8 without AVX-512) through the generic
 *    entry equals what the cpu device chose when the model was prepared
 *    (the cpu rules did not move), and C8 keeps every C16 activation;
 *  - every NHWC activation obeys the rules, checked here independently
 *    of layout.c (producer kind, 4-D, dtype, never the output, every
 *    reader a convolution or a same-layout keeper, a keeper's inputs NHWC,
 *    a folded ReLU like its producer), and NHWC keeps at least as many
 *    activations as C16 (its rules only drop the multiple-of-16 one);
 *  - on a hand-analysed model the exact NHWC set is the expected one (an
 *    8-channel conv and an average pool take NHWC where C16 takes
 *    nothing; batch norm keeps it; a dropout reader and an average pool
 *    counting padding under ceil_mode keep their producers plain), and
 *    with the AVX2 cpu's max pooling into plain (maxpool_to_plain) the
 *    conv in front of a max pool that dropout reads keeps C8;
 *  - f16 activations may be NHWC where the backend's dtypes allow (cuda),
 *    never on the cpu's;
 *  - the memory format picks the layout at prepare: contiguous none,
 *    channels-last NHWC on the cpu device, refused on the reference;
 *  - PLAIN (the reference backend's capability) chooses nothing. */
#include <stdio.h>

#include "test_util.h"

#include "backend/backend.h"
#include "plan/fuse.h"
#include "plan/layout.h"
#include "nn/model_impl.h"

#define CUDA_DTYPES (1u << CT_F32 | 1u << CT_BF16 | 1u << CT_F16)
#define CPU_DTYPES (1u << CT_F32 | 1u << CT_BF16)
/* The AVX2 cpu's maxpool_to_plain. */
#define CPU_C8_POOL (1u << CT_LAYOUT_C8)

static int is_keeper(const ct_layer *l) {
  if (l->cls == &ct_layer_avgpool2d) return !(l->ip[6] && l->ip[7]); /* ceil_mode with count_include_pad */
  return l->cls == &ct_layer_maxpool2d || l->cls == &ct_layer_activation || l->cls == &ct_layer_batchnorm ||
         l->cls == &ct_layer_add;
}

/* A convolution, or an adaptive pool to one pixel (its plain output is
 * every layout's bytes). */
static int any_input_layout(const ct_layer *l) {
  int global = l->out_ndim == 3 && l->out_shape[1] == 1 && l->out_shape[2] == 1;
  return l->cls == &ct_layer_conv2d ||
         (global && (l->cls == &ct_layer_adaptive_avgpool2d || l->cls == &ct_layer_adaptive_maxpool2d));
}

/* Number of NHWC choices in lay[] that break the rules for dtypes. */
static int nhwc_violations(const char *name, const ct_model *m, const int *lay, unsigned dtypes) {
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
             (dtypes >> dt & 1u);
    for (int j = 0; is_keeper(l) && j < l->n_inputs; j++)
      if (l->inputs[j] < 0 || lay[l->inputs[j]] != CT_LAYOUT_NHWC) ok = 0;
    for (int k = 0; k < m->n_layers; k++)
      for (int j = 0; j < m->layers[k].n_inputs; j++)
        if (m->layers[k].inputs[j] == i && !any_input_layout(&m->layers[k]) &&
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

/* The generic entry with the cpu backend's layout and dtypes = the cpu
 * device's own choice (C16 with AVX-512, C8 below it); C8 keeps at least
 * the C16 activations; NHWC obeys the rules and keeps at least `min_nhwc`
 * activations, and at least as many as C16. */
static void zoo_model(ct_device *dev, const char *name, int c, int h, int w, int min_nhwc) {
  ct_model *m = prepared(dev, name, c, h, w);
  if (!m) return;
  int L = m->n_layers;
  int *lay = calloc((size_t)L, sizeof *lay);
  const ct_backend *be = ct_device_backend(dev);
  ct_model_choose_layouts_for(m, be->act_layout, be->act_layout_dtypes, be->maxpool_to_plain, lay);
  int same = 1;
  for (int i = 0; i < L; i++) same &= lay[i] == (int)m->layers[i].y.layout;
  CHECK_MSG(same, "%s: the generic choice differs from the cpu device's", name);
  ct_model_choose_layouts_for(m, CT_LAYOUT_C16, CPU_DTYPES, 0, lay);
  int c16 = count(m, lay, CT_LAYOUT_C16);
  int *lay16 = malloc(sizeof *lay16 * (size_t)L);
  memcpy(lay16, lay, sizeof *lay16 * (size_t)L);
  ct_model_choose_layouts_for(m, CT_LAYOUT_C8, CPU_DTYPES, CPU_C8_POOL, lay);
  int c8 = 0, c8_lost = 0;
  for (int i = 0; i < L; i++) {
    c8 += lay[i] == CT_LAYOUT_C8 && !ct_layer_is_fused(&m->layers[i]);
    c8_lost += lay16[i] == CT_LAYOUT_C16 && lay[i] != CT_LAYOUT_C8;
  }
  CHECK_MSG(c8_lost == 0, "%s: %d C16 activations not C8", name, c8_lost);
  free(lay16);
  ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, CUDA_DTYPES, 0, lay);
  int nhwc = count(m, lay, CT_LAYOUT_NHWC);
  CHECK_MSG(nhwc_violations(name, m, lay, CUDA_DTYPES) == 0, "%s: NHWC rules broken", name);
  CHECK_MSG(nhwc >= min_nhwc, "%s: %d NHWC activations, expected at least %d", name, nhwc, min_nhwc);
  CHECK_MSG(nhwc >= c16, "%s: NHWC (%d) keeps fewer activations than C16 (%d)", name, nhwc, c16);
  ct_model_choose_layouts_for(m, CT_LAYOUT_PLAIN, CUDA_DTYPES, 0, lay);
  CHECK_MSG(count(m, lay, CT_LAYOUT_NHWC) == 0 && count(m, lay, CT_LAYOUT_C16) == 0,
            "%s: PLAIN capability chose a layout", name);
  printf("%-10s C16 %d, C8 %d, NHWC %d activations\n", name, c16, c8, nhwc);
  free(lay);
  ct_model_destroy(m);
}

/* Hand-analysed: see the expected set below. */
static const char *model_text =
    "input 3x20x20\n"
    "conv2d 3 8 3 padding=1\n"    /* 0: NHWC and C8 (8 channels: never C16) */
    "leakyrelu 0.1\n"             /* 1: NHWC, a keeper of 0 */
    "avgpool2d 2\n"               /* 2: NHWC */
    "conv2d 8 24 3\n"             /* 3: NHWC, batch norm keeps it */
    "batchnorm2d 24\n"            /* 4: NHWC */
    "relu\n"                      /* 5: NHWC */
    "conv2d 24 16 1\n"            /* 6: plain, the pool after it is */
    "maxpool2d 2\n"               /* 7: plain, dropout reads it */
    "dropout 0.2\n"               /* 8 */
    "conv2d 16 4 1\n"             /* 9: plain, the pool after it is */
    "avgpool2d 2 ceil_mode=true\n" /* 10: plain (counts padding under ceil_mode) */
    "conv2d 4 4 1\n"              /* 11: plain, flatten reads it */
    "flatten\n"
    "linear 16 10\n";

int main(void) {
#if !CTRAIN_HAVE_DNNL
  fprintf(stderr, "built without oneDNN: the cpu device chooses no C16/NHWC activations: skipping\n");
  return 77;
#endif
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  zoo_model(dev, "cnn", 1, 28, 28, 2);
  zoo_model(dev, "alexnet", 3, 64, 64, 6); /* folded ReLUs not counted */
  zoo_model(dev, "resnet18", 3, 32, 32, 49); /* the last stage too: the global pool reads NHWC */
  zoo_model(dev, "resnet9", 3, 32, 32, 21);

  char path[] = "/tmp/ctrain_layout_choice_XXXXXX.txt";
  test_write_temp(path, 4, model_text);
  ct_model *m = prepared(dev, path, 3, 20, 20);
  remove(path);
  if (m) {
    int L = m->n_layers;
    int *lay = calloc((size_t)L, sizeof *lay);
    for (int i = 0; i < L; i++) printf("  layer %d %s%s\n", i, m->layers[i].cls->torch_name,
                                       ct_layer_is_fused(&m->layers[i]) ? " (folded)" : "");
    ct_model_choose_layouts_for(m, CT_LAYOUT_C16, CPU_DTYPES, 0, lay);
    CHECK_MSG(count(m, lay, CT_LAYOUT_C16) == 0, "text model: %d C16 activations, expected none",
              count(m, lay, CT_LAYOUT_C16));
    ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, CUDA_DTYPES, 0, lay);
    CHECK(nhwc_violations("text model", m, lay, CUDA_DTYPES) == 0);
    const int expect[] = {1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 12 && i < L; i++)
      CHECK_MSG((lay[i] == CT_LAYOUT_NHWC) == expect[i], "text model: layer %d (%s) NHWC %d, expected %d", i,
                m->layers[i].cls->torch_name, lay[i] == CT_LAYOUT_NHWC, expect[i]);
    /* C8 without pooling into plain takes the same set: every channel
     * count up to layer 5 is a multiple of 8. With it (the AVX2 cpu), the
     * max pool 7 that dropout reads stays plain but reads a C8 layer 6. */
    ct_model_choose_layouts_for(m, CT_LAYOUT_C8, CPU_DTYPES, 0, lay);
    for (int i = 0; i < 12 && i < L; i++)
      CHECK_MSG((lay[i] == CT_LAYOUT_C8) == expect[i], "text model: layer %d (%s) C8 %d, expected %d", i,
                m->layers[i].cls->torch_name, lay[i] == CT_LAYOUT_C8, expect[i]);
    const int expect_c8[] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
    ct_model_choose_layouts_for(m, CT_LAYOUT_C8, CPU_DTYPES, CPU_C8_POOL, lay);
    for (int i = 0; i < 12 && i < L; i++)
      CHECK_MSG((lay[i] == CT_LAYOUT_C8) == expect_c8[i], "text model, pool to plain: layer %d (%s) C8 %d, expected %d",
                i, m->layers[i].cls->torch_name, lay[i] == CT_LAYOUT_C8, expect_c8[i]);
    /* The capability is per layout: C8's does nothing for C16 or NHWC. */
    ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, CUDA_DTYPES, CPU_C8_POOL, lay);
    CHECK_MSG(lay[6] == CT_LAYOUT_PLAIN, "C8's pool to plain applied to NHWC");
    /* f16 activations: cuda's NHWC keeps them, the cpu's dtypes do not. */
    if (m->act_dt) {
      for (int i = 0; i < L; i++) m->act_dt[i] = CT_F16;
      ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, CUDA_DTYPES, 0, lay);
      CHECK_MSG(lay[0] == CT_LAYOUT_NHWC && lay[4] == CT_LAYOUT_NHWC, "f16: NHWC dropped");
      CHECK(nhwc_violations("text model f16", m, lay, CUDA_DTYPES) == 0);
      ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, CPU_DTYPES, 0, lay);
      CHECK_MSG(count(m, lay, CT_LAYOUT_NHWC) == 0, "f16: NHWC chosen for the cpu's dtypes");
    }
    free(lay);
    ct_model_destroy(m);
  }
  /* A residual stage ending in a global pool keeps the layout up to the
   * pool (ResNet's last stage, the fast CIFAR network's); an adaptive pool
   * to more pixels keeps its producer plain. */
  const char *pools[] = {"adaptiveavgpool2d 1", "adaptivemaxpool2d 1 1", "adaptiveavgpool2d 2"};
  for (int k = 0; k < 3; k++) {
    char text[256], path3[] = "/tmp/ctrain_layout_choice3_XXXXXX.txt";
    snprintf(text, sizeof text,
             "input 3x8x8\nconv2d 3 16 3 padding=1\nbatchnorm2d 16\nrelu\nconv2d 16 16 3 padding=1\n%s\n"
             "flatten\nlinear %d 10\n", pools[k], k == 2 ? 64 : 16);
    test_write_temp(path3, 4, text);
    m = prepared(dev, path3, 3, 8, 8);
    remove(path3);
    if (!m) continue;
    int lay[8] = {0}, global = k < 2, pool = 4;
    CHECK_MSG(m->layers[pool].cls == (k == 1 ? &ct_layer_adaptive_maxpool2d : &ct_layer_adaptive_avgpool2d),
              "%s: layer %d is %s", pools[k], pool, m->layers[pool].cls->torch_name);
    for (int c16 = 0; c16 < 2; c16++) {
      ct_layout want = c16 ? CT_LAYOUT_C16 : CT_LAYOUT_NHWC;
      ct_model_choose_layouts_for(m, want, c16 ? CPU_DTYPES : CUDA_DTYPES, 0, lay);
      CHECK_MSG((lay[3] == (int)want) == global, "%s: the pooled conv's layout %d", pools[k], lay[3]);
      CHECK_MSG(lay[0] == (int)want, "%s: the first conv's layout %d", pools[k], lay[0]);
      CHECK_MSG(lay[pool] == CT_LAYOUT_PLAIN, "%s: the pool's output is laid out", pools[k]);
      if (!c16) CHECK(nhwc_violations(pools[k], m, lay, CUDA_DTYPES) == 0);
    }
    /* The cpu device chose the same when it prepared the model. */
    CHECK_MSG(m->layers[3].y.layout == (global ? ct_device_backend(dev)->act_layout : CT_LAYOUT_PLAIN),
              "%s: prepared layout %d", pools[k], (int)m->layers[3].y.layout);
    ct_model_destroy(m);
  }
  /* A conv that is the model's output stays plain. */
  char path2[] = "/tmp/ctrain_layout_choice2_XXXXXX.txt";
  test_write_temp(path2, 4, "input 3x8x8\nconv2d 3 4 3\nrelu\nconv2d 4 4 3\n");
  m = prepared(dev, path2, 3, 8, 8);
  remove(path2);
  if (m) {
    int lay[8] = {0};
    ct_model_choose_layouts_for(m, CT_LAYOUT_NHWC, CUDA_DTYPES, 0, lay);
    CHECK_MSG(lay[m->output] == CT_LAYOUT_PLAIN, "the model output is NHWC");
    CHECK_MSG(lay[0] == CT_LAYOUT_NHWC, "the first conv (read by relu then a conv) is not NHWC");
    CHECK(nhwc_violations("output model", m, lay, CUDA_DTYPES) == 0);
    ct_model_destroy(m);
  }
  /* The memory format decides at prepare: channels-last gives NHWC on the
   * cpu device (as its rules allow), contiguous nothing, auto the
   * backend's own choice. */
  m = prepared(dev, "convnet", 1, 28, 28);
  if (m) {
    const ct_memory_format fmts[] = {CT_MEMORY_FORMAT_CHANNELS_LAST, CT_MEMORY_FORMAT_CONTIGUOUS,
                                     CT_MEMORY_FORMAT_AUTO};
    const ct_layout wants[] = {CT_LAYOUT_NHWC, CT_LAYOUT_PLAIN, ct_device_backend(dev)->act_layout};
    int *lay = calloc((size_t)m->n_layers, sizeof *lay);
    for (int k = 0; k < 3; k++) {
      CHECK_OK(ct_model_set_memory_format(m, fmts[k]));
      CHECK_OK(ct_model_prepare(m, dev, 2, 1));
      ct_model_choose_layouts_for(m, wants[k], CPU_DTYPES, ct_device_backend(dev)->maxpool_to_plain, lay);
      int same = 1, chosen = 0;
      for (int i = 0; i < m->n_layers; i++)
        same &= lay[i] == (int)m->layers[i].y.layout, chosen += m->layers[i].y.layout != CT_LAYOUT_PLAIN;
      CHECK_MSG(same, "memory format %s: prepare chose other layouts than the rules", ct_memory_format_name(fmts[k]));
      CHECK_MSG(wants[k] == CT_LAYOUT_PLAIN ? chosen == 0 : chosen >= 4, "memory format %s: %d layers not plain",
                ct_memory_format_name(fmts[k]), chosen);
    }
    free(lay);
    CHECK(ct_model_set_memory_format(m, (ct_memory_format)7) == CT_ERR_INVALID_ARG);
    ct_memory_format f = CT_MEMORY_FORMAT_AUTO;
    CHECK(ct_memory_format_parse("channels_last", &f) == CT_OK && f == CT_MEMORY_FORMAT_CHANNELS_LAST);
    CHECK(ct_memory_format_parse("nchw", &f) == CT_OK && f == CT_MEMORY_FORMAT_CONTIGUOUS);
    CHECK(ct_memory_format_parse("chanels-last", &f) == CT_ERR_INVALID_ARG);
    CHECK(strstr(ct_last_error(), "chanels-last") != NULL);
    ct_model_destroy(m);
  }
  ct_device_close(dev);

  /* The reference backend asks for nothing. */
  CHECK_OK(ct_device_open("ref", &dev));
  m = prepared(dev, "cnn", 1, 28, 28);
  if (m) {
    int *lay = calloc((size_t)m->n_layers, sizeof *lay);
    CHECK_OK(ct_model_choose_layouts(m, lay));
    CHECK_MSG(count(m, lay, CT_LAYOUT_NHWC) == 0 && count(m, lay, CT_LAYOUT_C16) == 0, "ref device chose a layout");
    free(lay);
    CHECK_OK(ct_model_set_memory_format(m, CT_MEMORY_FORMAT_CHANNELS_LAST));
    CHECK(ct_model_prepare(m, dev, 2, 1) == CT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(ct_last_error(), "channels-last") && strstr(ct_last_error(), "ref"), "unclear error: %s",
              ct_last_error());
    ct_model_destroy(m);
  }
  ct_device_close(dev);
  return test_summary("layout_choice");
}
