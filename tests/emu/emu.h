/* The CUDA emulator's shared core (C++, tests only): what the emulated
 * runtime (emu_runtime.cpp), the kernel scheduler (emu_kernel.cpp) and the
 * emulated cuBLASLt (emu_cublaslt.cpp) and cuDNN (emu_cudnn.cpp) have in
 * common.
 *
 * Why it exists: the test machines have no GPU, so without it not one line
 * of the CUDA backend ever runs before a device machine is lent. The
 * emulator runs the backend's real host code (the .c files of src/backend/cuda) and its
 * real kernels (the .cu files compiled as C++ with launches rewritten) on
 * the CPU, against stand-ins for the CUDA runtime, cuBLASLt and cuDNN that
 * implement the documented semantics of the calls the backend makes and
 * refuse (with the library's own "not supported" status) any argument they
 * do not implement. What it checks: indexing, dtype handling, launch
 * configurations, barrier use, the order of queued work, CUDA-graph capture
 * (recorded work replays later, so a value baked in at capture shows), and
 * that library calls and kernels receive device pointers. What it cannot
 * check: real concurrency and the memory model, timing, and whether the
 * real libraries agree with the documented semantics emulated here.
 *
 * Model: "device" memory is host memory from cudaMalloc's stand-in, which
 * records every allocation so arguments can be checked. Each stream queues
 * its work and runs it only when something waits for it: a synchronisation
 * of that stream, of an event recorded in it, of the device, or another
 * stream's cudaStreamWaitEvent on such an event. So a host that reads a
 * result without the right synchronisation, or a stream that reads what
 * another wrote without an event between them, sees stale data as it could
 * on a GPU (CT_EMU_IMMEDIATE=1 runs work at enqueue instead). While a
 * stream captures a graph its work is recorded, and runs at each
 * cudaGraphLaunch. */
#ifndef CTRAIN_TESTS_EMU_H
#define CTRAIN_TESTS_EMU_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ct_emu {

/* Runs fn on stream s now, or appends it to the graph s is capturing.
 * Everything an emulated library call enqueues must be captured by value
 * in fn (descriptors may be destroyed right after the call, host scalars
 * such as alpha/beta are read at the call). */
void enqueue(cudaStream_t s, std::function<void()> fn);
/* Inside a capture on s: records fn as a node that meets other threads
 * (an in-process NCCL collective), which a replay runs outside the
 * emulator's lock; false (nothing recorded) when s is not capturing. */
bool record_meeting(cudaStream_t s, std::function<void()> fn);

/* With CT_EMU_TRACE=<file>, appends one line per call that queues work or
 * waits for it, in the host's call order: "run <stream> <what>" for work
 * queued, "capture <stream> <what>" for work recorded into a graph, and
 * "sync - <call>" for a host wait. <stream> is 0 for the legacy stream and
 * 1, 2, ... for the others in creation order. bench/gpu/step_census.py
 * reads it to count what one training step launches. No-op without the
 * variable. */
void trace(cudaStream_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void trace_sync(const char *call);
/* Runs stream s's queued work now, as a host wait would, traced as
 * "sync - emulator: <who>": the emulated NCCL's rendezvous needs each
 * buffer's writers done, which real NCCL orders on the device. A trace
 * reader counting the host's waits leaves these lines out. */
cudaError_t drain_stream(cudaStream_t s, const char *who);

/* The collective just run at its call on stream s (not capturing) read or
 * wrote ranges. On a GPU it runs some time before its stream is seen past
 * it, so until then no other work may write them: another stream's wait
 * on an event recorded after it, a host wait for such an event or for s,
 * or a device-wide synchronisation sees it complete, and checks that the
 * ranges still hold what the collective left (else fail, naming who).
 * collective_settle: a collective about to run on s over ranges sees the
 * earlier ones it overlaps complete (stream order). */
void collective_watch(cudaStream_t s, const std::string &who,
                      const std::vector<std::pair<const void *, size_t>> &ranges);
void collective_settle(cudaStream_t s, const std::vector<std::pair<const void *, size_t>> &ranges);

/* 1 when [p, p + bytes) lies inside one live cudaMalloc allocation (or the
 * device side of a mapped host allocation). NULL with bytes 0 passes. */
bool is_device_range(const void *p, size_t bytes);

/* Records the first asynchronous error (a fault inside emulated work: a
 * host pointer handed to a library, a deadlocked barrier); it is returned
 * by the next synchronising call or cudaGetLastError, with the message
 * kept for cudaGetErrorString. */
void fail(cudaError_t e, const std::string &message);

/* Records a launch error (a bad configuration): returned, once, by the
 * next cudaGetLastError, as the runtime does; the message is printed. */
void set_last_error(cudaError_t e, const std::string &message);

/* Fails (cudaErrorIllegalAddress) naming what and who when [p, p+bytes)
 * is not device memory, or is another device's than the calling thread's
 * current one; returns whether it was fine. */
bool check_device_range(const void *p, size_t bytes, const char *who, const char *what);
/* A launch error (cudaErrorInvalidResourceHandle) when stream s belongs
 * to another device than the calling thread's current one; returns
 * whether it was fine. */
bool check_stream_device(cudaStream_t s, const char *who);
/* The calling thread's current device (cudaSetDevice). */
int current_device();

/* An on/off knob from the environment (CT_EMU_REVERSE, CT_EMU_DNN_NO_NHWC,
 * ...): on when set to anything but empty or "0". */
bool env_flag(const char *name);

/* CT_EMU_ALGO_BITS=N (N >= 1; anything else nonzero: 1): each cuDNN
 * convolution algorithm or engine and each cuBLASLt kernel sums in its own
 * order, as the real ones do (tile shapes, split-K, Winograd): every f32
 * accumulator moves, before it is rounded to the output type, by a whole
 * number of last places of f32 at its binade, -N..+N for an f32 output and
 * -256N..+256N for a 16-bit one (narrow; at most 1/32 of an f16 last
 * place, 1/256 of a bf16 one, so it flips a 16-bit rounding now and then
 * without moving any tolerance), a choice fixed by the algorithm's key and
 * the element's index. The same algorithm gives the same bits every time;
 * another one other bits. So a test that compares two runs bit for bit
 * fails under it when the runs chose different algorithms, as it would on
 * a GPU. Off: v unchanged. */
bool algo_bits_on();
/* The hash both the knob above and CT_EMU_DNN_NONDET draw their moves from:
 * a well-mixed 64-bit value of (a, b). */
uint64_t mix64(uint64_t a, uint64_t b);
double algo_bits(double v, uint64_t key, uint64_t index, bool narrow);

/* TF32 rounding of an f32 value (10 explicit mantissa bits, round to
 * nearest even), as tensor cores read f32 inputs under TF32 math. */
float round_tf32(float x);

/* For the emulator's own self-test only: clears a recorded fault (a real
 * context would be lost), and sets the block/thread run order (reverse
 * true: last first, as CT_EMU_REVERSE=1). */
void reset_fault_for_test();
void set_reverse_for_test(bool reverse);

}  // namespace ct_emu

#endif
