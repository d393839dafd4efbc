/* The user loop of step_loop.h on cuda (the emulator's in CI). */
#include "step_loop.h"

int main(void) { return step_loop_check("cuda"); }
