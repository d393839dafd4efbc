/* The portable f32 <-> f16 conversions (integer arithmetic, no branches).
 * ct_f32_to_f16 / ct_f16_to_f32 and ct_convert use the CPU's F16C
 * instructions where the build targets them; these are the code every
 * other CPU runs, exported so that tests check them against F16C and the
 * definition on any machine. Same results as F16C except the payload bits
 * of a NaN (both give a quiet NaN of the input's sign). */
#ifndef CTRAIN_CORE_HALF_PORTABLE_H
#define CTRAIN_CORE_HALF_PORTABLE_H

#include <stdint.h>

uint16_t ct_f32_to_f16_portable(float f);
float ct_f16_to_f32_portable(uint16_t h);

#endif
