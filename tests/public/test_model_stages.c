/* stages.h on two virtual CPU devices: bit for bit. */
#include "stages.h"

/* Replicas and stages share their source's definition, which outlives
 * it: a stage of a stage of a replica, made after the original is gone,
 * is the same model as the stage of those layers made directly (same
 * state names and values, the same forward output bit for bit). */
static int shared_definition(void) {
  ct_model_options mo = {0, 0, 0, 0, 5};
  ct_model *whole, *rep, *tail, *nested, *direct;
  ct_device *dev;
  TRY(ct_device_open("cpu", &dev));
  TRY(ct_model_create("lenet5", &mo, &whole));
  TRY(ct_model_replicate(whole, &rep));
  ct_model_destroy(whole);
  const int L = ct_model_layer_count(rep);
  TRY(ct_model_stage(rep, 3, L - 1, &tail));
  TRY(ct_model_stage(tail, 4, ct_model_layer_count(tail) - 1, &nested));
  TRY(ct_model_stage(rep, 7, L - 1, &direct));
  int bad = ct_model_state_count(nested) != ct_model_state_count(direct);
  for (int i = 0; !bad && i < ct_model_state_count(nested); i++) {
    const ct_state_entry *a = ct_model_state(nested, i), *b = ct_model_state(direct, i);
    bad = strcmp(a->name, b->name) || ct_tensor_nbytes(&a->value) != ct_tensor_nbytes(&b->value) ||
          memcmp(a->value.data, b->value.data, ct_tensor_nbytes(&a->value));
  }
  int c, h, w;
  ct_model_input_shape(direct, &c, &h, &w);
  int64_t per = (int64_t)c * h * w, shape[2] = {NB, per};
  float *x = malloc((size_t)(NB * per) * sizeof *x);
  for (int64_t i = 0; i < NB * per; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  ct_tensor xt = ct_tensor_view(x, CT_F32, 2, shape);
  const ct_tensor *on, *od;
  TRY(ct_model_prepare(nested, dev, NB, 0));
  TRY(ct_model_prepare(direct, dev, NB, 0));
  TRY(ct_model_forward(nested, &xt, 0, 0, &on));
  TRY(ct_model_forward(direct, &xt, 0, 0, &od));
  bad |= same("the nested stage's output", od, on, 1, 0);
  if (bad) fprintf(stderr, "FAIL: a stage of a stage of a replica differs from the direct stage\n");
  else printf("ok: a stage of a stage of a replica, its source destroyed, equals the direct stage\n");
  free(x);
  ct_model_destroy(nested), ct_model_destroy(direct), ct_model_destroy(tail), ct_model_destroy(rep);
  ct_device_close(dev);
  return bad;
}

int main(void) {
  int r = stages_check("cpu:0", "cpu:1", 1);
  if (!r) r = shared_definition();
  if (r) return r;
  /* A cut inside a residual block is refused (one activation must cross):
   * some of resnet18's layers start a block body whose shortcut reads
   * the layer before it. */
  ct_model *m, *s;
  ct_model_options mo = {0, 32, 32, 10, 1};
  TRY(ct_model_create("resnet18", &mo, &m));
  int bad = 0;
  for (int cut = 1; cut < ct_model_layer_count(m) - 1; cut++) {
    ct_status st = ct_model_stage(m, cut + 1, ct_model_layer_count(m) - 1, &s);
    if (st == CT_OK) ct_model_destroy(s);
    else if (!strstr(ct_last_error(), "cannot start at layer")) bad = 1, fprintf(stderr, "FAIL: %s\n", ct_last_error());
    else bad |= 2; /* at least one refused cut seen */
  }
  ct_model_destroy(m);
  if (bad != 2) {
    fprintf(stderr, "FAIL: no cut inside a residual block of resnet18 was refused\n");
    return 1;
  }
  printf("ok: cuts inside resnet18's residual blocks are refused\n");
  return 0;
}
