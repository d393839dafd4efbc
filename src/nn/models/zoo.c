/* The model zoo. Each constructor builds the graph with the exact module
 * names of the PyTorch/torchvision model it mirrors, so state_dict keys
 * match and weights move both ways through safetensors. The PyTorch
 * definitions of the models that torchvision lacks are in docs/MODELS.md. */
#include <string.h>

#include "nn/model_impl.h"

typedef struct zoo_ctx {
  ct_model *m;
  char buf[CT_NAME_MAX];
} zoo_ctx;

static const char *nm(zoo_ctx *z, const char *fmt, int a, int b, int c) {
  snprintf(z->buf, sizeof z->buf, fmt, a, b, c);
  return z->buf;
}

/* conv (+bn) (+relu) with torchvision's init for ResNet/VGG convs. */
static int conv_kaiming(ct_model *m, const char *name, int in, int cin, int cout, int k, int s, int p, int bias) {
  int i = ct_g_conv2d(m, name, in, cin, cout, k, s, p, 1, 1, bias);
  if (i >= 0) m->layers[i].init_kind = CT_INIT_KAIMING_NORMAL_FAN_OUT;
  return i;
}

static ct_status build_linreg(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  int f = o->in_channels ? o->in_channels : 2;
  ct_g_linear(m, "", -1, f, o->num_classes ? o->num_classes : 1, 1);
  *nd = 1, in[0] = f;
  return CT_OK;
}

static ct_status build_mlp(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  int c = o->in_channels ? o->in_channels : 1, h = o->height ? o->height : 28, w = o->width ? o->width : 28;
  int k = ct_g_flatten(m, "0", -1);
  k = ct_g_linear(m, "1", k, c * h * w, 512, 1);
  k = ct_g_act(m, "2", k, CT_ACT_RELU, 0);
  k = ct_g_linear(m, "3", k, 512, 256, 1);
  k = ct_g_act(m, "4", k, CT_ACT_RELU, 0);
  ct_g_linear(m, "5", k, 256, o->num_classes ? o->num_classes : 10, 1);
  *nd = 3, in[0] = c, in[1] = h, in[2] = w;
  return CT_OK;
}

/* torchkeras' CnnModel: an nn.ModuleList named `layers`. */
static ct_status build_cnn(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  int c = o->in_channels ? o->in_channels : 1;
  int k = ct_g_conv2d(m, "layers.0", -1, c, 32, 3, 1, 0, 1, 1, 1);
  k = ct_g_maxpool2d(m, "layers.1", k, 2, 2, 0, 0);
  k = ct_g_conv2d(m, "layers.2", k, 32, 64, 5, 1, 0, 1, 1, 1);
  k = ct_g_maxpool2d(m, "layers.3", k, 2, 2, 0, 0);
  k = ct_g_dropout(m, "layers.4", k, 0.1f, 1);
  k = ct_g_adaptive_maxpool2d(m, "layers.5", k, 1, 1);
  k = ct_g_flatten(m, "layers.6", k);
  k = ct_g_linear(m, "layers.7", k, 64, 32, 1);
  k = ct_g_act(m, "layers.8", k, CT_ACT_RELU, 0);
  ct_g_linear(m, "layers.9", k, 32, o->num_classes ? o->num_classes : 10, 1);
  *nd = 3, in[0] = c, in[1] = o->height ? o->height : 28, in[2] = o->width ? o->width : 28;
  return CT_OK;
}

/* The default model of `make train`: two conv-bn-relu-pool stages and a
 * small classifier; about 0.92 test accuracy on Fashion-MNIST in a few
 * epochs at a fraction of LeNet's cost per accuracy point. */
static ct_status build_convnet(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  int c = o->in_channels ? o->in_channels : 1;
  int k = ct_g_conv2d(m, "0", -1, c, 32, 3, 1, 1, 1, 1, 0);
  k = ct_g_batchnorm(m, "1", k, 32, 2, 1e-5f, 0.1f, 1);
  k = ct_g_act(m, "2", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "3", k, 2, 2, 0, 0);
  k = ct_g_conv2d(m, "4", k, 32, 64, 3, 1, 1, 1, 1, 0);
  k = ct_g_batchnorm(m, "5", k, 64, 2, 1e-5f, 0.1f, 1);
  k = ct_g_act(m, "6", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "7", k, 2, 2, 0, 0);
  k = ct_g_flatten(m, "8", k);
  k = ct_g_linear(m, "9", k, 0, 128, 1);
  k = ct_g_act(m, "10", k, CT_ACT_RELU, 0);
  k = ct_g_dropout(m, "11", k, 0.25f, 0);
  ct_g_linear(m, "12", k, 128, o->num_classes ? o->num_classes : 10, 1);
  *nd = 3, in[0] = c, in[1] = o->height ? o->height : 28, in[2] = o->width ? o->width : 28;
  return CT_OK;
}

static ct_status build_lenet5(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  int c = o->in_channels ? o->in_channels : 1;
  int k = ct_g_conv2d(m, "0", -1, c, 6, 5, 1, 2, 1, 1, 1);
  k = ct_g_act(m, "1", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "2", k, 2, 2, 0, 0);
  k = ct_g_conv2d(m, "3", k, 6, 16, 5, 1, 0, 1, 1, 1);
  k = ct_g_act(m, "4", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "5", k, 2, 2, 0, 0);
  k = ct_g_flatten(m, "6", k);
  k = ct_g_linear(m, "7", k, 0, 120, 1);
  k = ct_g_act(m, "8", k, CT_ACT_RELU, 0);
  k = ct_g_linear(m, "9", k, 120, 84, 1);
  k = ct_g_act(m, "10", k, CT_ACT_RELU, 0);
  ct_g_linear(m, "11", k, 84, o->num_classes ? o->num_classes : 10, 1);
  *nd = 3, in[0] = c, in[1] = o->height ? o->height : 28, in[2] = o->width ? o->width : 28;
  return CT_OK;
}

/* torchvision.models.alexnet */
static ct_status build_alexnet(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  int c = o->in_channels ? o->in_channels : 3;
  int k = ct_g_conv2d(m, "features.0", -1, c, 64, 11, 4, 2, 1, 1, 1);
  k = ct_g_act(m, "features.1", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "features.2", k, 3, 2, 0, 0);
  k = ct_g_conv2d(m, "features.3", k, 64, 192, 5, 1, 2, 1, 1, 1);
  k = ct_g_act(m, "features.4", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "features.5", k, 3, 2, 0, 0);
  k = ct_g_conv2d(m, "features.6", k, 192, 384, 3, 1, 1, 1, 1, 1);
  k = ct_g_act(m, "features.7", k, CT_ACT_RELU, 0);
  k = ct_g_conv2d(m, "features.8", k, 384, 256, 3, 1, 1, 1, 1, 1);
  k = ct_g_act(m, "features.9", k, CT_ACT_RELU, 0);
  k = ct_g_conv2d(m, "features.10", k, 256, 256, 3, 1, 1, 1, 1, 1);
  k = ct_g_act(m, "features.11", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "features.12", k, 3, 2, 0, 0);
  k = ct_g_adaptive_avgpool2d(m, "avgpool", k, 6, 6);
  k = ct_g_flatten(m, "flatten", k);
  k = ct_g_dropout(m, "classifier.0", k, 0.5f, 0);
  k = ct_g_linear(m, "classifier.1", k, 256 * 6 * 6, 4096, 1);
  k = ct_g_act(m, "classifier.2", k, CT_ACT_RELU, 0);
  k = ct_g_dropout(m, "classifier.3", k, 0.5f, 0);
  k = ct_g_linear(m, "classifier.4", k, 4096, 4096, 1);
  k = ct_g_act(m, "classifier.5", k, CT_ACT_RELU, 0);
  ct_g_linear(m, "classifier.6", k, 4096, o->num_classes ? o->num_classes : 1000, 1);
  *nd = 3, in[0] = c, in[1] = o->height ? o->height : 224, in[2] = o->width ? o->width : 224;
  return CT_OK;
}

/* torchvision.models.vgg11_bn, with torchvision's initialisation. */
static ct_status build_vgg11_bn(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  static const int cfg[] = {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0};
  zoo_ctx z = {m, {0}};
  int c = o->in_channels ? o->in_channels : 3, k = -1, idx = 0, ch = c;
  for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
    if (!cfg[i]) {
      k = ct_g_maxpool2d(m, nm(&z, "features.%d", idx++, 0, 0), k, 2, 2, 0, 0);
      continue;
    }
    k = conv_kaiming(m, nm(&z, "features.%d", idx++, 0, 0), k, ch, cfg[i], 3, 1, 1, 1);
    m->layers[k].init_kind = CT_INIT_KAIMING_NORMAL_FAN_OUT;
    k = ct_g_batchnorm(m, nm(&z, "features.%d", idx++, 0, 0), k, cfg[i], 2, 1e-5f, 0.1f, 1);
    k = ct_g_act(m, nm(&z, "features.%d", idx++, 0, 0), k, CT_ACT_RELU, 0);
    ch = cfg[i];
  }
  k = ct_g_adaptive_avgpool2d(m, "avgpool", k, 7, 7);
  k = ct_g_flatten(m, "flatten", k);
  k = ct_g_linear(m, "classifier.0", k, 512 * 7 * 7, 4096, 1);
  m->layers[k].init_kind = CT_INIT_NORMAL_001;
  k = ct_g_act(m, "classifier.1", k, CT_ACT_RELU, 0);
  k = ct_g_dropout(m, "classifier.2", k, 0.5f, 0);
  k = ct_g_linear(m, "classifier.3", k, 4096, 4096, 1);
  m->layers[k].init_kind = CT_INIT_NORMAL_001;
  k = ct_g_act(m, "classifier.4", k, CT_ACT_RELU, 0);
  k = ct_g_dropout(m, "classifier.5", k, 0.5f, 0);
  k = ct_g_linear(m, "classifier.6", k, 4096, o->num_classes ? o->num_classes : 1000, 1);
  m->layers[k].init_kind = CT_INIT_NORMAL_001;
  *nd = 3, in[0] = c, in[1] = o->height ? o->height : 224, in[2] = o->width ? o->width : 224;
  return CT_OK;
}

/* torchvision ResNet blocks: BasicBlock (expansion 1) and Bottleneck
 * (expansion 4, stride on the 3x3 conv: "ResNet v1.5"). */
static int resnet_block(zoo_ctx *z, int x, const char *p, int cin, int planes, int stride, int bottleneck) {
  ct_model *m = z->m;
  char pre[CT_NAME_MAX];
  snprintf(pre, sizeof pre, "%s", p);
  int out = bottleneck ? planes * 4 : planes, k;
  char n[CT_NAME_MAX + 32];
#define N(s) (snprintf(n, sizeof n, "%s.%s", pre, s), n)
  if (bottleneck) {
    k = conv_kaiming(m, N("conv1"), x, cin, planes, 1, 1, 0, 0);
    k = ct_g_batchnorm(m, N("bn1"), k, planes, 2, 1e-5f, 0.1f, 1);
    k = ct_g_act(m, N("relu1"), k, CT_ACT_RELU, 0);
    k = conv_kaiming(m, N("conv2"), k, planes, planes, 3, stride, 1, 0);
    k = ct_g_batchnorm(m, N("bn2"), k, planes, 2, 1e-5f, 0.1f, 1);
    k = ct_g_act(m, N("relu2"), k, CT_ACT_RELU, 0);
    k = conv_kaiming(m, N("conv3"), k, planes, out, 1, 1, 0, 0);
    k = ct_g_batchnorm(m, N("bn3"), k, out, 2, 1e-5f, 0.1f, 1);
  } else {
    k = conv_kaiming(m, N("conv1"), x, cin, planes, 3, stride, 1, 0);
    k = ct_g_batchnorm(m, N("bn1"), k, planes, 2, 1e-5f, 0.1f, 1);
    k = ct_g_act(m, N("relu1"), k, CT_ACT_RELU, 0);
    k = conv_kaiming(m, N("conv2"), k, planes, planes, 3, 1, 1, 0);
    k = ct_g_batchnorm(m, N("bn2"), k, planes, 2, 1e-5f, 0.1f, 1);
  }
  int sc = x;
  if (stride != 1 || cin != out) {
    sc = conv_kaiming(m, N("downsample.0"), x, cin, out, 1, stride, 0, 0);
    sc = ct_g_batchnorm(m, N("downsample.1"), sc, out, 2, 1e-5f, 0.1f, 1);
  }
  k = ct_g_add(m, N("add"), k, sc);
  k = ct_g_act(m, N("relu"), k, CT_ACT_RELU, 0);
#undef N
  return k;
}

static ct_status build_resnet(const ct_model_options *o, ct_model *m, int64_t *in, int *nd, const int *blocks,
                              int bottleneck) {
  zoo_ctx z = {m, {0}};
  int c = o->in_channels ? o->in_channels : 3;
  int k = conv_kaiming(m, "conv1", -1, c, 64, 7, 2, 3, 0);
  k = ct_g_batchnorm(m, "bn1", k, 64, 2, 1e-5f, 0.1f, 1);
  k = ct_g_act(m, "relu", k, CT_ACT_RELU, 0);
  k = ct_g_maxpool2d(m, "maxpool", k, 3, 2, 1, 0);
  int ch = 64;
  for (int s = 0; s < 4; s++) {
    int planes = 64 << s;
    for (int b = 0; b < blocks[s]; b++) {
      k = resnet_block(&z, k, nm(&z, "layer%d.%d", s + 1, b, 0), ch, planes, b == 0 && s > 0 ? 2 : 1, bottleneck);
      ch = bottleneck ? planes * 4 : planes;
    }
  }
  k = ct_g_adaptive_avgpool2d(m, "avgpool", k, 1, 1);
  k = ct_g_flatten(m, "flatten", k);
  ct_g_linear(m, "fc", k, ch, o->num_classes ? o->num_classes : 1000, 1);
  *nd = 3, in[0] = c, in[1] = o->height ? o->height : 224, in[2] = o->width ? o->width : 224;
  return CT_OK;
}

static ct_status build_resnet18(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  static const int b[4] = {2, 2, 2, 2};
  return build_resnet(o, m, in, nd, b, 0);
}

static ct_status build_resnet50(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  static const int b[4] = {3, 4, 6, 3};
  return build_resnet(o, m, in, nd, b, 1);
}

/* A fast small CIFAR network after the DAWNBench ResNet-9 / airbench
 * designs: conv-bn-relu stages with max-pool downsampling and two residual
 * stages, global max pool, a bias-free classifier. */
static int cbr(zoo_ctx *z, int x, const char *pre, int cin, int cout) {
  char n[CT_NAME_MAX];
  snprintf(n, sizeof n, "%s.0", pre);
  int k = conv_kaiming(z->m, n, x, cin, cout, 3, 1, 1, 0);
  snprintf(n, sizeof n, "%s.1", pre);
  k = ct_g_batchnorm(z->m, n, k, cout, 2, 1e-5f, 0.1f, 1);
  snprintf(n, sizeof n, "%s.2", pre);
  return ct_g_act(z->m, n, k, CT_ACT_RELU, 0);
}

static ct_status build_resnet9(const ct_model_options *o, ct_model *m, int64_t *in, int *nd) {
  zoo_ctx z = {m, {0}};
  int c = o->in_channels ? o->in_channels : 3;
  int k = cbr(&z, -1, "prep", c, 64);
  k = cbr(&z, k, "layer1.conv", 64, 128);
  k = ct_g_maxpool2d(m, "layer1.pool", k, 2, 2, 0, 0);
  int r = cbr(&z, k, "layer1.res1", 128, 128);
  r = cbr(&z, r, "layer1.res2", 128, 128);
  k = ct_g_add(m, "layer1.add", k, r);
  k = cbr(&z, k, "layer2.conv", 128, 256);
  k = ct_g_maxpool2d(m, "layer2.pool", k, 2, 2, 0, 0);
  k = cbr(&z, k, "layer3.conv", 256, 512);
  k = ct_g_maxpool2d(m, "layer3.pool", k, 2, 2, 0, 0);
  r = cbr(&z, k, "layer3.res1", 512, 512);
  r = cbr(&z, r, "layer3.res2", 512, 512);
  k = ct_g_add(m, "layer3.add", k, r);
  k = ct_g_adaptive_maxpool2d(m, "pool", k, 1, 1);
  k = ct_g_flatten(m, "flatten", k);
  ct_g_linear(m, "fc", k, 512, o->num_classes ? o->num_classes : 10, 0);
  *nd = 3, in[0] = c, in[1] = o->height ? o->height : 32, in[2] = o->width ? o->width : 32;
  return CT_OK;
}

typedef ct_status (*zoo_fn)(const ct_model_options *, ct_model *, int64_t *, int *);
static const struct {
  const char *name;
  zoo_fn fn;
} zoo[] = {{"linreg", build_linreg},   {"mlp", build_mlp},           {"cnn", build_cnn}, {"convnet", build_convnet},
           {"lenet5", build_lenet5},   {"alexnet", build_alexnet},   {"vgg11_bn", build_vgg11_bn},
           {"resnet18", build_resnet18}, {"resnet50", build_resnet50}, {"resnet9", build_resnet9}};

const char *const *ct_model_zoo_names(void) {
  static const char *names[sizeof zoo / sizeof zoo[0] + 1];
  for (size_t i = 0; i < sizeof zoo / sizeof zoo[0]; i++) names[i] = zoo[i].name;
  return names;
}

ct_status ct_zoo_build(const char *name, const ct_model_options *opt, ct_model **out) {
  for (size_t i = 0; i < sizeof zoo / sizeof zoo[0]; i++) {
    if (strcmp(zoo[i].name, name)) continue;
    ct_model *m;
    CT_TRY(ct_model_new(name, &m));
    int64_t in[3];
    int nd = 0;
    ct_status s = zoo[i].fn(opt, m, in, &nd);
    if (s == CT_OK) s = ct_model_finish(m, nd, in, opt->seed);
    if (s != CT_OK) {
      ct_model_free(m);
      return s;
    }
    *out = m;
    return CT_OK;
  }
  char list[256] = "";
  for (size_t i = 0; i < sizeof zoo / sizeof zoo[0]; i++) {
    strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
    strncat(list, zoo[i].name, sizeof list - strlen(list) - 1);
  }
  return ct_error(CT_ERR_NOT_FOUND, "unknown model '%s': expected one of %s, or a model file path", name, list);
}
