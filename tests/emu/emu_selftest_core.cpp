/* Self-test of the emulator's core (emu_kernel.cpp, emu_runtime.cpp):
 * that kernels with barriers and shuffles compute what the hardware would,
 * that it reports what the hardware would fault or refuse (a barrier in
 * divergent code, a shuffle with missing lanes, a bad launch
 * configuration, a host pointer handed to a kernel, allocating while
 * capturing), and that work is deferred and captured the way the CUDA
 * programming model allows: a result read before synchronising is stale,
 * a captured graph replays what it recorded. Every check compares against
 * a value computed on the host or against the state before the call. */
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu.h"
#include "emu_kernel.h"
#include "test_util.h"

/* Block sum through warp shuffles and shared memory, the pattern of
 * cuda_common.cuh's ct_block_sum; one partial per block. */
static void k_block_sum(const float *x, long n, double *out) {
  __shared__ double sh[32];
  const int t = (int)(threadIdx.x + blockDim.x * threadIdx.y);
  const int nt = (int)(blockDim.x * blockDim.y);
  double v = 0;
  for (long i = (long)blockIdx.x * nt + t; i < n; i += (long)gridDim.x * nt) v += x[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((t & 31) == 0) sh[t >> 5] = v;
  __syncthreads();
  if (t == 0) {
    double s = 0;
    for (int w = 0; w < nt / 32; w++) s += sh[w];
    out[blockIdx.x] = s;
  }
}

static void k_votes(const int *flags, int *out) {
  const int t = (int)threadIdx.x;
  int any = __syncthreads_or(flags[t]);
  int all = __syncthreads_and(flags[t]);
  int cnt = __syncthreads_count(flags[t]);
  if (t == 0) out[0] = any, out[1] = all, out[2] = cnt;
}

/* Thread 0 leaves before the barrier the others wait at. */
static void k_divergent(int *out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

static void k_shuffle_down(int *out) {
  int v = (int)threadIdx.x;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 3);
}

/* Races on purpose: reads a neighbour's shared slot without a barrier. */
static void k_racy(int *out) {
  __shared__ int sh[64];
  sh[threadIdx.x] = (int)threadIdx.x + 1;
  out[threadIdx.x] = sh[(threadIdx.x + 1) % 64];
}

/* Reads a shared slot before any thread wrote it (undefined on a GPU),
 * then writes it: the next block must not see this block's value. */
static void k_shared_first_read(int *out) {
  __shared__ int sh[1];
  if (threadIdx.x == 0) {
    out[blockIdx.x] = sh[0];
    sh[0] = 42;
  }
}

static void k_add(float *x, float v, long n) {
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) x[i] += v;
}

static void k_write(int *p) { p[threadIdx.x] = 7; }

static void test_reductions() {
  const long n = 100003;
  float *x;
  double *part;
  CHECK(cudaMalloc((void **)&x, n * 4) == cudaSuccess);
  CHECK(cudaMalloc((void **)&part, 64 * 8) == cudaSuccess);
  std::vector<float> h(n);
  double want = 0;
  for (long i = 0; i < n; i++) want += h[i] = (float)((i * 7919) % 1000) / 1000.f - 0.4f;
  CHECK(cudaMemcpyAsync(x, h.data(), n * 4, cudaMemcpyHostToDevice, 0) == cudaSuccess);
  for (int shape = 0; shape < 2; shape++) {
    dim3 block = shape ? dim3(32, 8) : dim3(256);
    ct_emu_launch(k_block_sum, 64, block, 0, 0)(x, n, part);
    CHECK(cudaGetLastError() == cudaSuccess);
    std::vector<double> hp(64);
    CHECK(cudaMemcpy(hp.data(), part, 64 * 8, cudaMemcpyDeviceToHost) == cudaSuccess);
    double got = 0;
    for (double v : hp) got += v;
    CHECK(std::fabs(got - want) < 1e-9 * n);
  }
  int *flags, *out;
  CHECK(cudaMalloc((void **)&flags, 128 * 4) == cudaSuccess);
  CHECK(cudaMalloc((void **)&out, 128 * 4) == cudaSuccess);
  for (int pattern = 0; pattern < 3; pattern++) {
    int hf[128], want_cnt = 0;
    for (int i = 0; i < 128; i++) want_cnt += hf[i] = pattern == 0 ? 0 : pattern == 1 ? 1 : (i % 5 == 0);
    CHECK(cudaMemcpy(flags, hf, sizeof hf, cudaMemcpyHostToDevice) == cudaSuccess);
    ct_emu_launch(k_votes, 1, 128, 0, 0)(flags, out);
    int ho[3];
    CHECK(cudaMemcpy(ho, out, sizeof ho, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(ho[0] == (want_cnt > 0) && ho[1] == (want_cnt == 128) && ho[2] == want_cnt);
  }
  ct_emu_launch(k_shuffle_down, 1, 64, 0, 0)(out);
  int hs[64];
  CHECK(cudaMemcpy(hs, out, sizeof hs, cudaMemcpyDeviceToHost) == cudaSuccess);
  int bad = 0;
  for (int i = 0; i < 64; i++) bad += hs[i] != ((i & 31) + 3 < 32 ? i + 3 : i);
  CHECK(bad == 0);
  cudaFree(x), cudaFree(part), cudaFree(flags), cudaFree(out);
}

/* What the hardware faults on or refuses is reported, not guessed at. */
static void test_faults() {
  int *out;
  CHECK(cudaMalloc((void **)&out, 256 * 4) == cudaSuccess);
  ct_emu_launch(k_divergent, 1, 64, 0, 0)(out);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  ct_emu::reset_fault_for_test();

  ct_emu_launch(k_shuffle_down, 1, 48, 0, 0)(out); /* a warp of 16 lanes */
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  ct_emu::reset_fault_for_test();

  CHECK(cudaMemset(out, 0, 256 * 4) == cudaSuccess);
  ct_emu_launch(k_write, 1, 2048, 0, 0)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess); /* a launch error is not sticky */
  ct_emu_launch(k_write, dim3(1, 70000), 1, 0, 0)(out);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  int h[256];
  CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(h[0] == 0); /* the refused launches did not run */

  int host[32];
  ct_emu_launch(k_write, 1, 32, 0, 0)(host);
  CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  ct_emu::reset_fault_for_test();

  /* A float pointer two bytes into an allocation. */
  ct_emu_launch(k_add, 1, 32, 0, 0)((float *)((char *)out + 2), 1.f, 4);
  CHECK(cudaDeviceSynchronize() == cudaErrorMisalignedAddress);
  ct_emu::reset_fault_for_test();

  /* Shared memory starts undefined (0xff here) in every block. */
  ct_emu_launch(k_shared_first_read, 2, 32, 0, 0)(out);
  CHECK(cudaMemcpy(h, out, 2 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(h[0] == -1 && h[1] == -1);

  CHECK(cudaMemcpy(out, h, sizeof h, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue); /* wrong kind */
  (void)cudaGetLastError();
  cudaFree(out);
}

/* Deferred work: results appear at synchronisation, pageable sources are
 * staged at the call, pinned ones read when the copy runs. */
static void test_deferred() {
  const long n = 1000;
  float *x, *pinned;
  CHECK(cudaMalloc((void **)&x, n * 4) == cudaSuccess);
  uint32_t bits;
  CHECK(cudaMemcpy(&bits, x, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(bits == 0xffffffffu); /* fresh device memory reads as NaN */
  CHECK(cudaHostAlloc((void **)&pinned, n * 4, cudaHostAllocPortable) == cudaSuccess);
  std::vector<float> h(n, 1.f);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaMemcpyAsync(x, h.data(), n * 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
  h.assign(n, 5.f); /* after the call: the staged copy keeps 1 */
  ct_emu_launch(k_add, 4, 256, 0, s)(x, 2.f, n);
  for (long i = 0; i < n; i++) pinned[i] = -1.f;
  CHECK(cudaMemcpyAsync(pinned, x, n * 4, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(pinned[0] == -1.f && pinned[n - 1] == -1.f); /* not yet */
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(pinned[0] == 3.f && pinned[n - 1] == 3.f);

  /* A pinned source is read when the copy runs, not at the call; and a
   * synchronous copy on the legacy stream does not wait for the
   * non-blocking stream s. */
  for (long i = 0; i < n; i++) pinned[i] = 10.f;
  CHECK(cudaMemcpyAsync(x, pinned, n * 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
  pinned[0] = 20.f;
  std::vector<float> back(n);
  CHECK(cudaMemcpy(back.data(), x, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back[0] == 3.f); /* s has not run its copy */
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaMemcpy(back.data(), x, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back[0] == 20.f && back[1] == 10.f);

  /* Across streams only an event orders work: a kernel on c reads what a
   * copy on s wrote only when c waits for s's event. */
  cudaStream_t c;
  cudaEvent_t ev, never;
  CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&never, cudaEventDisableTiming) == cudaSuccess);
  for (int wait = 0; wait < 2; wait++) {
    for (long i = 0; i < n; i++) pinned[i] = 1.f;
    CHECK(cudaMemcpy(x, pinned, n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    for (long i = 0; i < n; i++) pinned[i] = 100.f;
    CHECK(cudaMemcpyAsync(x, pinned, n * 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(cudaEventRecord(ev, s) == cudaSuccess);
    if (wait) CHECK(cudaStreamWaitEvent(c, ev, 0) == cudaSuccess);
    ct_emu_launch(k_add, 4, 256, 0, c)(x, 1.f, n);
    CHECK(cudaEventSynchronize(never) == cudaSuccess); /* never recorded: runs nothing */
    CHECK(cudaStreamSynchronize(c) == cudaSuccess);
    CHECK(cudaMemcpy(back.data(), x, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back[0] == (wait ? 101.f : 2.f));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  }
  /* A capture may not wait on work outside it. */
  CHECK(cudaStreamBeginCapture(c, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(c, ev, 0) == cudaErrorStreamCaptureIsolation);
  cudaGraph_t g;
  CHECK(cudaStreamEndCapture(c, &g) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  cudaEventDestroy(ev), cudaEventDestroy(never);
  cudaStreamDestroy(c);
  cudaStreamDestroy(s);
  cudaFreeHost(pinned);
  cudaFree(x);
}

/* A collective run at its call (the emulated NCCL) keeps its buffers
 * watched: work on another stream may write them only after waiting for
 * an event recorded behind the collective; a host wait on the
 * collective's stream then finds what it left, else fails. The
 * emulator's own drain of the stream is no such wait. */
static void test_collective_watch() {
  const long n = 256;
  float *x;
  CHECK(cudaMalloc((void **)&x, n * 4) == cudaSuccess);
  cudaStream_t coll, comp;
  cudaEvent_t before, after;
  CHECK(cudaStreamCreateWithFlags(&coll, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&comp, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming) == cudaSuccess);
  for (int how = 0; how < 3; how++) { /* 0: waits after it, 1: waits before it only, 2: no wait */
    CHECK(cudaMemset(x, 0, n * 4) == cudaSuccess);
    CHECK(cudaEventRecord(before, coll) == cudaSuccess);
    ct_emu::collective_watch(coll, "the collective", {{x, n * 4}});
    CHECK(cudaEventRecord(after, coll) == cudaSuccess);
    if (how < 2) CHECK(cudaStreamWaitEvent(comp, how == 0 ? after : before, 0) == cudaSuccess);
    ct_emu_launch(k_add, 1, 256, 0, comp)(x, 1.f, n);
    CHECK(ct_emu::drain_stream(coll, "selftest") == cudaSuccess); /* not a wait: still watched */
    CHECK(cudaStreamSynchronize(comp) == cudaSuccess);
    CHECK(cudaStreamSynchronize(coll) == (how == 0 ? cudaSuccess : cudaErrorLaunchFailure));
    ct_emu::reset_fault_for_test();
  }
  /* A later collective on the stream over the same buffer completes it. */
  ct_emu::collective_watch(coll, "the first", {{x, n * 4}});
  ct_emu::collective_settle(coll, {{x + 8, 4}});
  CHECK(cudaMemset(x, 0, 4) == cudaSuccess);
  CHECK(cudaStreamSynchronize(coll) == cudaSuccess);
  cudaEventDestroy(before), cudaEventDestroy(after);
  cudaStreamDestroy(comp), cudaStreamDestroy(coll);
  cudaFree(x);
}

/* A captured graph records; each launch replays with the captured
 * arguments and reads memory as it is at the replay. */
static void test_graph() {
  const long n = 300;
  float *x;
  CHECK(cudaMalloc((void **)&x, n * 4) == cudaSuccess);
  CHECK(cudaMemset(x, 0, n * 4) == cudaSuccess);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  float v = 1.5f;
  ct_emu_launch(k_add, 2, 128, 0, s)(x, v, n);
  v = 100.f; /* arguments are copied at the launch */
  cudaGraph_t g;
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g);
  cudaGraphExec_t e;
  CHECK(cudaGraphInstantiate(&e, g, 0) == cudaSuccess);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  float h[2];
  CHECK(cudaMemcpy(h, x, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(h[0] == 0.f); /* capturing ran nothing */
  CHECK(cudaGraphLaunch(e, s) == cudaSuccess);
  CHECK(cudaGraphLaunch(e, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaMemcpy(h, x, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(h[0] == 3.f && h[1] == 3.f);
  cudaGraphExecDestroy(e);

  /* Fork and join: a stream waiting on an event recorded in the capture
   * joins it, and its work replays with the rest; ending the capture
   * before it joined back fails. */
  cudaStream_t f;
  cudaEvent_t fork, join;
  CHECK(cudaStreamCreateWithFlags(&f, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  for (int joined = 0; joined < 2; joined++) {
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK(cudaEventRecord(fork, s) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(f, fork, 0) == cudaSuccess);
    cudaStreamCaptureStatus cs;
    CHECK(cudaStreamIsCapturing(f, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive);
    ct_emu_launch(k_add, 2, 128, 0, f)(x, 10.f, n);
    CHECK(cudaEventRecord(join, f) == cudaSuccess);
    if (joined) CHECK(cudaStreamWaitEvent(s, join, 0) == cudaSuccess);
    ct_emu_launch(k_add, 2, 128, 0, s)(x, 1.f, n);
    cudaError_t end = cudaStreamEndCapture(s, &g);
    CHECK(end == (joined ? cudaSuccess : cudaErrorStreamCaptureUnjoined));
    CHECK(cudaStreamIsCapturing(f, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone);
    (void)cudaGetLastError();
  }
  CHECK(cudaGraphInstantiate(&e, g, 0) == cudaSuccess);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  CHECK(cudaGraphLaunch(e, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaMemcpy(h, x, 8, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(h[0] == 14.f && h[1] == 14.f);
  cudaGraphExecDestroy(e);
  cudaEventDestroy(fork), cudaEventDestroy(join);
  cudaStreamDestroy(f);

  /* Allocating or synchronising while capturing breaks the capture. */
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  void *p = nullptr;
  CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported && !p);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  std::vector<float> pageable(4);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(cudaMemcpyAsync(x, pageable.data(), 16, cudaMemcpyHostToDevice, s) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  cudaStreamDestroy(s);
  cudaFree(x);
}

/* Memory is accounted against the emulated device's size. */
static void test_memory() {
  size_t fr0, tot;
  CHECK(cudaMemGetInfo(&fr0, &tot) == cudaSuccess && fr0 <= tot);
  void *p = nullptr;
  CHECK(cudaMalloc(&p, tot + 1) == cudaErrorMemoryAllocation && !p);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess);
  size_t fr1;
  CHECK(cudaMemGetInfo(&fr1, &tot) == cudaSuccess && fr1 == fr0 - (1 << 20));
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaMemGetInfo(&fr1, &tot) == cudaSuccess && fr1 == fr0);
  CHECK(cudaFree(p) == cudaErrorInvalidValue); /* twice */
  (void)cudaGetLastError();
}

/* Reverse order changes what a racy kernel computes: the mode exposes
 * an order the hardware does not promise. */
static void test_order() {
  int *out;
  CHECK(cudaMalloc((void **)&out, 64 * 4) == cudaSuccess);
  int fwd[64], rev[64];
  ct_emu::set_reverse_for_test(false);
  ct_emu_launch(k_racy, 1, 64, 0, 0)(out);
  CHECK(cudaMemcpy(fwd, out, sizeof fwd, cudaMemcpyDeviceToHost) == cudaSuccess);
  ct_emu::set_reverse_for_test(true);
  ct_emu_launch(k_racy, 1, 64, 0, 0)(out);
  CHECK(cudaMemcpy(rev, out, sizeof rev, cudaMemcpyDeviceToHost) == cudaSuccess);
  ct_emu::set_reverse_for_test(false);
  CHECK(memcmp(fwd, rev, sizeof fwd) != 0);
  cudaFree(out);
}

/* Runs fn in a child process; true when the child died of SIGSEGV. */
template <class F>
static bool dies_of_segv(F fn) {
  fflush(stdout), fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV;
}

/* An access past an allocation's (256-byte rounded) end, and a graph
 * replaying into a freed buffer, fault at once. */
static void test_guards() {
  const long n = 1000; /* 4000 bytes, rounded to 4096 */
  float *x;
  CHECK(cudaMalloc((void **)&x, n * 4) == cudaSuccess);
  CHECK(!dies_of_segv([&] {
    ct_emu_launch(k_add, 4, 256, 0, 0)(x, 1.f, 1024); /* within the rounding: allowed */
    cudaDeviceSynchronize();
  }));
  CHECK(dies_of_segv([&] {
    ct_emu_launch(k_add, 4, 256, 0, 0)(x, 1.f, 1025);
    cudaDeviceSynchronize();
  }));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  ct_emu_launch(k_add, 4, 256, 0, s)(x, 1.f, n);
  cudaGraph_t g;
  cudaGraphExec_t e;
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
  CHECK(cudaGraphInstantiate(&e, g, 0) == cudaSuccess);
  cudaGraphDestroy(g);
  CHECK(cudaFree(x) == cudaSuccess);
  CHECK(dies_of_segv([&] {
    cudaGraphLaunch(e, s);
    cudaStreamSynchronize(s);
  }));
  cudaGraphExecDestroy(e);
  cudaStreamDestroy(s);
}

int main() {
  test_reductions();
  test_faults();
  test_deferred();
  test_collective_watch();
  test_graph();
  test_memory();
  test_order();
  test_guards();
  return test_summary("emu_selftest_core");
}
