/* What the self-tests of the emulator's library stand-ins
 * (emu_selftest_lt, emu_selftest_dnn, emu_selftest_dnn_graph) share:
 * counted checks that say where they failed, and the summary line whose
 * count decides the exit status. */
#ifndef CTRAIN_TESTS_EMU_SELFTEST_H
#define CTRAIN_TESTS_EMU_SELFTEST_H

#include <cstdio>

namespace emu_selftest {
inline int failures = 0, checks = 0;
}  // namespace emu_selftest

#define EXPECT(cond, ...)                                  \
  do {                                                     \
    emu_selftest::checks++;                                \
    if (!(cond)) {                                         \
      emu_selftest::failures++;                            \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
    }                                                      \
  } while (0)

#ifdef CUDNN_MAJOR
/* A cuDNN call that must succeed; a failure names the call, the status and
 * the library's reason (cudnnGetLastErrorString). */
#define DNN_OK(call)                                                                                         \
  do {                                                                                                       \
    cudnnStatus_t s_ = (call);                                                                               \
    emu_selftest::checks++;                                                                                  \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                                        \
      char m_[512];                                                                                          \
      cudnnGetLastErrorString(m_, sizeof m_);                                                                \
      emu_selftest::failures++;                                                                              \
      fprintf(stderr, "FAIL %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call, cudnnGetErrorString(s_), m_); \
    }                                                                                                        \
  } while (0)
#endif

/* "<name>: N checks, M failed"; the exit status (1 when any failed). */
inline int emu_selftest_summary(const char *name) {
  printf("%s: %d checks, %d failed\n", name, emu_selftest::checks, emu_selftest::failures);
  return emu_selftest::failures ? 1 : 0;
}

#endif
