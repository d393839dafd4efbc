/* The libFuzzer entry point of a target whose body is `one(data, size)`:
 * a non-zero return (a property the body checks did not hold) aborts, so
 * libFuzzer saves the input as a crash. Compiled out when the ctest twin
 * includes the target's source with CT_FUZZ_BODY_ONLY. */
#ifndef CTRAIN_FUZZ_ENTRY_H
#define CTRAIN_FUZZ_ENTRY_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef CT_FUZZ_BODY_ONLY
#define CT_FUZZ_ENTRY(one)                                                \
  int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);           \
  int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {          \
    if (one(data, size) != 0) abort();                                    \
    return 0;                                                             \
  }
#else
#define CT_FUZZ_ENTRY(one)
#endif

#endif
