/* replicas.h on two virtual CPU devices, each on its own thread. */
#include "replicas.h"

int main(void) {
  const char *spec[R] = {"cpu:0", "cpu:1"};
  return replicas_check(spec, 1);
}
