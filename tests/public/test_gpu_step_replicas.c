/* replicas.h on cuda: both replicas on the one device, in lockstep
 * (device memory hooks: the gradients, the inf/NaN flag and the squared
 * norm are reduced where the device keeps them). */
#include "replicas.h"

int main(void) {
  const char *spec[R] = {"cuda", "cuda"};
  return replicas_check(spec, 0);
}
