/* test_resume_momentum's check with the model resident on a CUDA device:
 * the momentum buffer OneCycle's cycle turns on moves to the device with
 * the rest of the optimizer's state, is saved from there and restored into
 * it. Labelled gpu; exits 77 without a CUDA device. */
#include "test_resume_momentum.h"

int main(void) {
  ct_device *d = NULL;
  if (ct_device_open("cuda", &d) != CT_OK) {
    printf("skip: %s\n", ct_last_error());
    return 77;
  }
  ct_device_close(d);
  resume_momentum_check("cuda");
  return test_summary("test_gpu_resume_momentum");
}
