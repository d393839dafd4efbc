/* stages.h on two virtual CPU devices: bit for bit. */
#include "stages.h"

int main(void) {
  int r = stages_check("cpu:0", "cpu:1", 1);
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
