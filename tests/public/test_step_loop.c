/* The user loop of step_loop.h on the CPU. */
#include "step_loop.h"

int main(void) { return step_loop_check("cpu"); }
