/* test_resume_momentum's check with the model resident on a CUDA device:
 * the optimizer's state lives on the device, where the momentum buffer
 * that OneCycle's cycle turns on is allocated at the first device step.
 * Labelled gpu; exits 77 without a CUDA device. */
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
