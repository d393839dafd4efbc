/* Exact resume of an SGD optimizer created without momentum whose
 * momentum a OneCycle schedule cycles (PyTorch's OneCycleLR with
 * cycle_momentum on an SGD(momentum=0)): the schedule turns the momentum
 * on when ct_fit creates it, so the buffer must exist, be saved and be
 * restored like any optimizer state. Run A trains 2 epochs;
 * run B stops mid-epoch 2 (max_steps, a checkpoint) and resumes: the
 * weights must be equal bit for bit. On the cpu device here; the same on
 * cuda in test_gpu_resume_momentum. */
#include "test_resume_momentum.h"

int main(void) {
  resume_momentum_check("cpu");
  return test_summary("test_resume_momentum");
}
