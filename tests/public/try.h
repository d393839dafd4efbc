/* TRY: the public-API tests' check of a call that must succeed: on
 * failure it prints the call, where, and ct_last_error(), and exits 1. */
#ifndef CTRAIN_TESTS_PUBLIC_TRY_H
#define CTRAIN_TESTS_PUBLIC_TRY_H

#include <stdio.h>
#include <stdlib.h>

#include "ctrain/status.h"

#define TRY(x)                                                                                  \
  do {                                                                                          \
    ct_status s_ = (x);                                                                         \
    if (s_ != CT_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, ct_last_error());       \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

#endif
