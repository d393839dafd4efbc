/* stages.h on cuda (both stages on the one device; the emulator's in CI):
 * within rounding, since a stage's first convolution may take other
 * algorithms than the whole model's. */
#include "stages.h"

int main(void) { return stages_check("cuda", "cuda", 0); }
