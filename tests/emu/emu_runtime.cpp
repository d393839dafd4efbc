/* The CUDA emulator's runtime: the cuda* calls the backend makes
 * (the .c files of src/backend/cuda), with the signatures of the toolkit's
 * cuda_runtime_api.h, on host memory (emu.h has the model).
 *
 * Work is deferred per stream: a stream's queue runs, in order, only as
 * far as something waits for it (a synchronisation of the stream, of an
 * event recorded in it or of the device, a copy into pageable memory after
 * the stream's earlier work, or another stream's cudaStreamWaitEvent, which
 * queues a wait job). So a host that reads a result without the right
 * synchronisation, a stream that reads another's output without an event,
 * or a pinned staging buffer reused before its copy ran, sees stale data
 * here as it could on a GPU. CT_EMU_IMMEDIATE=1 runs work at enqueue;
 * CT_EMU_COPY_AHEAD=1 runs every stream, newest first, at each
 * synchronisation (a copy stream ahead of the compute stream).
 *
 * Stream capture records instead of running; cudaGraphLaunch replays the
 * record. While a thread captures, it may not allocate, free or
 * synchronise (cudaErrorStreamCaptureUnsupported, and the capture is
 * invalidated), as with cudaStreamCaptureModeGlobal/ThreadLocal; nor may
 * a capturing stream wait on an event recorded outside the capture. A
 * stream that waits on an event recorded inside a capture joins it (the
 * runtime's fork): its work is recorded into the capture, in call order
 * with the rest, and the capture ends only once every such stream has
 * joined back (a capturing stream waited on an event recorded on it after
 * its last work), else cudaErrorStreamCaptureUnjoined.
 *
 * New device memory is filled with 0xff bytes (NaN in every float dtype):
 * a kernel that reads what nobody wrote shows. Every allocation ends at a
 * PROT_NONE page and a freed one stays inaccessible for a while, so an
 * out-of-bounds access or a use after free faults with a message naming
 * the allocation (guarded_alloc). The device has CT_EMU_MEM_MB of memory
 * (default 16384). */
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_profiler_api.h>

#include "emu.h"

/* A node of a captured graph; `meets`: it waits for other threads (an
 * in-process NCCL collective), so a replay runs it outside the lock. */
struct EmuNode {
  std::function<void()> fn;
  bool meets = false;
};
/* A queued job: work, or a wait until another stream has run its first
 * `seq` jobs (cudaStreamWaitEvent). */
struct EmuJob {
  std::function<void()> fn;
  CUstream_st *wait = nullptr;
  uint64_t seq = 0;
};
/* A collective run at its call (emu_nccl.cpp) and the bytes of its
 * buffers right after it: no other work may write them before the
 * stream is seen past `seq` (collective_watch). */
struct EmuWatch {
  uint64_t seq;
  std::string who;
  std::vector<std::pair<const void *, std::string>> copies;
};
struct CUstream_st {
  int id = 0; /* 0: the legacy stream; others count up from 1 (the trace) */
  int device = -1; /* the device current at its creation; -1: the legacy stream, every device's */
  bool capturing = false, invalid = false;
  std::thread::id owner;
  std::vector<EmuNode> nodes;
  /* A stream forked into another's capture: that origin records its
   * work; captured counts the work it recorded, joined how much of it a
   * capturing stream has waited for. */
  CUstream_st *origin = nullptr;
  std::vector<CUstream_st *> forks; /* an origin's forked streams */
  uint64_t captured = 0, joined = 0;
  std::deque<EmuJob> q;          /* queued, not run yet */
  std::vector<EmuWatch> watches; /* collectives not yet seen complete */
  uint64_t queued = 0, done = 0; /* jobs ever queued / run */
};
/* An event is a position in one stream: the first `seq` jobs of it. */
struct CUevent_st {
  int flags = 0;
  CUstream_st *stream = nullptr; /* NULL: never recorded, an empty set of work */
  uint64_t seq = 0;
  bool in_capture = false; /* last recorded in a capturing stream */
  CUstream_st *captured_on = nullptr; /* that stream, and its work recorded so far */
  uint64_t captured_seq = 0;
};
struct CUgraph_st {
  std::vector<EmuNode> nodes;
};
struct CUgraphExec_st {
  std::vector<EmuNode> nodes;
  bool meets = false; /* some node meets other threads */
};

namespace ct_emu {
namespace {

enum Kind { DEVICE, PINNED };
struct Alloc {
  size_t bytes;
  Kind kind;
  uintptr_t base; /* the mapping: [base, base + span), its last page the guard */
  size_t span;
  int device; /* DEVICE memory: the device current at cudaMalloc */
};

std::recursive_mutex g_mu;
std::map<uintptr_t, Alloc> g_allocs;
size_t g_used;
CUstream_st g_default_stream;
/* The last error is per host thread, as in the runtime; a fault is
 * sticky for the whole (emulated) context. */
thread_local cudaError_t g_last = cudaSuccess;
cudaError_t g_sticky = cudaSuccess;
std::string g_sticky_msg;
/* The current device is per host thread, as in the runtime (0 until the
 * thread sets another). */
thread_local int g_device;

size_t total_mem() {
  static size_t t = 0;
  if (!t) {
    const char *e = getenv("CT_EMU_MEM_MB");
    t = (size_t)(e && atol(e) > 0 ? atol(e) : 16384) << 20;
  }
  return t;
}

bool immediate() {
  static const bool on = ct_emu::env_flag("CT_EMU_IMMEDIATE");
  return on;
}

/* One device, or CT_EMU_DEVICES: DDP's ranks each pick one
 * (cuda:LOCAL_RANK), DataParallel drives several from one process. The
 * emulated devices share one memory pool, but each allocation and stream
 * belongs to the device current when it was made, and kernels, library
 * calls and collectives given another device's memory or stream fail, as
 * they would without peer access. */
int device_count() {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (v && (!*v || v[0] == '-')) return 0;
  const char *n = getenv("CT_EMU_DEVICES");
  return n && atoi(n) > 1 ? atoi(n) : 1;
}

CUstream_st *stream_of(cudaStream_t s) { return s ? s : &g_default_stream; }

/* The allocation holding [p, p+bytes), or NULL. */
const Alloc *find(const void *p, size_t bytes, uintptr_t *base) {
  uintptr_t a = (uintptr_t)p;
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (a < it->first || a + bytes > it->first + it->second.bytes) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

std::vector<CUstream_st *> g_streams; /* live, for the capture checks */

bool live_stream(const CUstream_st *st) {
  return st == &g_default_stream || std::find(g_streams.begin(), g_streams.end(), st) != g_streams.end();
}

/* True when this thread captures on some stream. */
bool this_thread_captures() {
  auto me = std::this_thread::get_id();
  if (g_default_stream.capturing && g_default_stream.owner == me) return true;
  for (CUstream_st *s : g_streams)
    if (s->capturing && s->owner == me) return true;
  return false;
}

/* A call a capturing thread may not make: invalidates its captures. */
cudaError_t capture_violation(const char *call) {
  auto me = std::this_thread::get_id();
  auto hit = [&](CUstream_st *s) {
    if (s->capturing && s->owner == me) s->invalid = true;
  };
  hit(&g_default_stream);
  for (CUstream_st *s : g_streams) hit(s);
  fprintf(stderr, "ct_emu: %s while this thread captures a CUDA graph (not permitted)\n", call);
  return g_last = cudaErrorStreamCaptureUnsupported;
}

/* Runs job fn as work of stream st: on st's device, whichever host thread
 * drains the stream (a synchronisation runs every stream's work), so the
 * checks made at execution compare against the right device. */
void run_on(const CUstream_st *st, const std::function<void()> &fn) {
  const int saved = g_device;
  if (st->device >= 0) g_device = st->device;
  fn();
  g_device = saved;
}

/* Stream st is seen past its first seq jobs (by another stream's wait,
 * or the host): the watched collectives before that are complete, and
 * their buffers must still hold what the collective left (a write by
 * work not ordered after the collective would have raced it on a GPU). */
void settle(CUstream_st *st, uint64_t seq) {
  for (auto it = st->watches.begin(); it != st->watches.end();) {
    if (it->seq > seq) {
      ++it;
      continue;
    }
    for (const auto &c : it->copies)
      if (memcmp(c.first, c.second.data(), c.second.size()) != 0) {
        fail(cudaErrorLaunchFailure, it->who + ": other work wrote its buffer before the collective was seen "
                                     "complete (no wait for the collective's stream before the write)");
        break;
      }
    it = st->watches.erase(it);
  }
}

/* Runs stream st's jobs until it has run `seq` of them; a wait first runs
 * the stream waited for as far as its event. Waits only point back in
 * time, so this ends. */
void run_until(CUstream_st *st, uint64_t seq) {
  while (st->done < seq && !st->q.empty()) {
    EmuJob j = std::move(st->q.front());
    st->q.pop_front();
    if (j.wait)
      run_until(j.wait, j.seq), settle(j.wait, j.seq);
    else if (j.fn)
      run_on(st, j.fn);
    st->done++;
  }
}

void run_stream(CUstream_st *st) { run_until(st, st->queued); }

/* Everything queued on every stream: a device-wide synchronisation. */
void flush() {
  run_stream(&g_default_stream);
  for (CUstream_st *s : g_streams) run_stream(s);
  for (CUstream_st *s : g_streams) settle(s, UINT64_MAX);
}

/* CT_EMU_COPY_AHEAD=1: every synchronisation first runs every stream's
 * queue, newest stream first -- the copy stream (created after the compute
 * stream) runs all its queued copies before the compute stream's kernels
 * that precede them in time. A GPU's copy engine may do just that; a copy
 * that overwrites a buffer a kernel on another stream has still to read,
 * with no event making it wait, then lands first and the race shows. */
void run_ahead() {
  static const bool on = ct_emu::env_flag("CT_EMU_COPY_AHEAD");
  if (on)
    for (auto it = g_streams.rbegin(); it != g_streams.rend(); ++it) run_stream(*it);
}

/* Guarded allocations. Each lies just below a PROT_NONE page (its size
 * rounded to 256 bytes, cudaMalloc's alignment), so an access past the
 * rounded end faults at once instead of touching another buffer; a freed
 * one stays mapped PROT_NONE for the next 1024 frees, so a use after free
 * (a graph replaying into a freed buffer) faults too. The SIGSEGV handler
 * says which allocation was hit, then lets the signal kill the test. */
struct Freed {
  uintptr_t base, user;
  size_t span, bytes;
};
std::deque<Freed> g_freed;
const size_t kPage = 4096;

void on_segv(int, siginfo_t *si, void *) {
  const uintptr_t a = (uintptr_t)si->si_addr;
  char msg[320];
  int n = 0;
  for (const auto &kv : g_allocs) {
    const Alloc &al = kv.second;
    if (a >= al.base && a < al.base + al.span) {
      n = snprintf(msg, sizeof msg,
                   "ct_emu: fault at %p, %zu bytes past the start of a %zu-byte %s allocation at %p: an "
                   "out-of-bounds access\n",
                   (void *)a, (size_t)(a - kv.first), al.bytes, al.kind == DEVICE ? "device" : "pinned",
                   (void *)kv.first);
      break;
    }
  }
  for (size_t i = 0; !n && i < g_freed.size(); i++) {
    const Freed &f = g_freed[i];
    if (a >= f.base && a < f.base + f.span)
      n = snprintf(msg, sizeof msg, "ct_emu: fault at %p, inside a freed %zu-byte allocation at %p: a use after free\n",
                   (void *)a, f.bytes, (void *)f.user);
  }
  if (!n)
    n = snprintf(msg, sizeof msg, "ct_emu: fault at %p, outside emulated device memory (a host bug, or a fiber stack "
                 "overflow)\n", (void *)a);
  if (write(2, msg, (size_t)n) < 0) {
  }
  signal(SIGSEGV, SIG_DFL); /* returning re-runs the access, which now kills the process */
}

void install_segv_handler() {
  static bool done = false;
  if (done) return;
  done = true;
  struct sigaction sa = {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
}

/* A guarded allocation of bytes (0xff-filled when fill), or NULL. */
void *guarded_alloc(size_t bytes, Kind kind, bool fill) {
  install_segv_handler();
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) & ~(size_t)255;
  const size_t span = ((rounded + kPage - 1) & ~(kPage - 1)) + kPage;
  void *m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  /* Transparent huge pages where the kernel gives them on request: on the
   * 2-core CI VM (whose hypervisor backs guest memory lazily) first
   * touching fresh 4 KiB pages costs about 3.5 s per GB, a huge page the
   * kernel hands out again about 0.1 s, and the tests bind models of up to
   * 460 MB (AlexNet's weights) again and again: emu_test_gpu_recompute
   * 82 -> 57 s. */
  if (span >= (size_t)2 << 20) madvise(m, span - kPage, MADV_HUGEPAGE);
  const uintptr_t base = (uintptr_t)m, guard = base + span - kPage;
  mprotect((void *)guard, kPage, PROT_NONE);
  void *p = (void *)(guard - rounded);
  if (fill) memset(p, 0xff, rounded);
  g_allocs[(uintptr_t)p] = Alloc{bytes, kind, base, span, g_device};
  return p;
}

void guarded_free(std::map<uintptr_t, Alloc>::iterator it) {
  const Alloc al = it->second;
  const uintptr_t user = it->first;
  g_allocs.erase(it);
  madvise((void *)al.base, al.span, MADV_DONTNEED);
  mprotect((void *)al.base, al.span, PROT_NONE);
  g_freed.push_back(Freed{al.base, user, al.span, al.bytes});
  if (g_freed.size() > 1024) {
    munmap((void *)g_freed.front().base, g_freed.front().span);
    g_freed.pop_front();
  }
}

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) g_last = e;
  return e;
}

/* A synchronising call: runs what it waits for (st NULL: every stream),
 * then reports a sticky fault. `seen` 0: the emulator's own drain, which
 * no program order stands behind (the stream's collectives stay watched). */
cudaError_t sync_point(const char *call, CUstream_st *st = nullptr, bool seen = true) {
  if (this_thread_captures()) return capture_violation(call);
  trace_sync(call);
  run_ahead();
  if (st)
    run_stream(st);
  else
    flush();
  if (st && seen) settle(st, UINT64_MAX);
  return g_sticky;
}

FILE *trace_file() {
  static FILE *f = nullptr;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const char *path = getenv("CT_EMU_TRACE");
    if (path && *path && !(f = fopen(path, "w"))) fprintf(stderr, "ct_emu: CT_EMU_TRACE %s: cannot open\n", path);
  }
  return f;
}

}  // namespace

void trace(cudaStream_t s, const char *fmt, ...) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  FILE *f = trace_file();
  if (!f) return;
  const CUstream_st *st = stream_of(s);
  fprintf(f, "%s %d ", st->capturing ? "capture" : "run", st->id);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fflush(f);
}

void trace_sync(const char *call) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  FILE *f = trace_file();
  if (!f) return;
  fprintf(f, "sync - %s\n", call);
  fflush(f);
}

void enqueue(cudaStream_t s, std::function<void()> fn) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  CUstream_st *st = stream_of(s);
  if (st->capturing) {
    (st->origin ? st->origin : st)->nodes.push_back(EmuNode{std::move(fn), false});
    st->captured++;
  } else if (immediate()) {
    run_on(st, fn);
    st->queued++, st->done++;
  } else {
    st->q.push_back(EmuJob{std::move(fn), nullptr, 0});
    st->queued++;
  }
}

bool record_meeting(cudaStream_t s, std::function<void()> fn) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  CUstream_st *st = stream_of(s);
  if (!st->capturing) return false;
  (st->origin ? st->origin : st)->nodes.push_back(EmuNode{std::move(fn), true});
  st->captured++;
  return true;
}

bool is_device_range(const void *p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  if (!p) return bytes == 0;
  return find(p, bytes, nullptr) != nullptr;
}

void fail(cudaError_t e, const std::string &message) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  fprintf(stderr, "ct_emu: %s\n", message.c_str());
  if (g_sticky == cudaSuccess) {
    g_sticky = e;
    g_sticky_msg = message;
  }
}

void set_last_error(cudaError_t e, const std::string &message) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  fprintf(stderr, "ct_emu: %s\n", message.c_str());
  g_last = e;
}

bool check_device_range(const void *p, size_t bytes, const char *who, const char *what) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  char b[256];
  const Alloc *a = p ? find(p, bytes, nullptr) : nullptr;
  if (!p && bytes == 0) return true;
  if (!a)
    snprintf(b, sizeof b, "%s: %s %p (%zu bytes) is not device memory", who, what, p, bytes);
  else if (a->kind == DEVICE && a->device != g_device)
    snprintf(b, sizeof b, "%s: %s %p is memory of device %d, but device %d is current", who, what, p, a->device,
             g_device);
  else
    return true;
  fail(cudaErrorIllegalAddress, b);
  return false;
}

bool check_stream_device(cudaStream_t s, const char *who) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  const CUstream_st *st = stream_of(s);
  if (st->device < 0 || st->device == g_device) return true;
  char b[160];
  snprintf(b, sizeof b, "%s: stream %d belongs to device %d, but device %d is current", who, st->id, st->device,
           g_device);
  set_last_error(cudaErrorInvalidResourceHandle, b);
  return false;
}

int current_device() { return g_device; }

void reset_fault_for_test() {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  g_sticky = g_last = cudaSuccess;
  g_sticky_msg.clear();
}

bool env_flag(const char *name) {
  const char *e = getenv(name);
  return e && *e && strcmp(e, "0") != 0;
}

/* CT_EMU_ALGO_BITS: 0 or unset off, N > 0 the largest move in last places
 * (anything else on: 1). */
static int algo_bits_max() {
  static const int n = [] {
    if (!env_flag("CT_EMU_ALGO_BITS")) return 0;
    const int v = atoi(getenv("CT_EMU_ALGO_BITS"));
    return v > 0 ? std::min(v, 1 << 20) : 1;
  }();
  return n;
}

bool algo_bits_on() { return algo_bits_max() > 0; }

uint64_t mix64(uint64_t a, uint64_t b) {
  uint64_t h = a * 0x9E3779B97F4A7C15ull ^ b * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31, h *= 0x94D049BB133111EBull, h ^= h >> 29;
  return h;
}

double algo_bits(double v, uint64_t key, uint64_t index, bool narrow) {
  if (!algo_bits_on()) return v;
  const uint64_t h = mix64(key + 1, index);
  /* In last places of f32 at v's binade (subnormal and zero: the smallest
   * normal's): -N..+N, or -256N..+256N before a 16-bit rounding. The
   * binade and its last place are read off the bits (ilogb and ldexp were
   * most of the time of a call that runs for every element a library call
   * writes). */
  uint64_t b;
  std::memcpy(&b, &v, 8);
  const int e = std::max((int)((b >> 52) & 0x7ff) - 1023, -126);
  if (e == 1024) return v; /* inf, NaN */
  const uint64_t n = (uint64_t)algo_bits_max() * (narrow ? 256 : 1);
  const int64_t k = (int64_t)(h % (2 * n + 1)) - (int64_t)n;
  const uint64_t ub = (uint64_t)(e - 23 + 1023) << 52;
  double ulp;
  std::memcpy(&ulp, &ub, 8);
  return v + (double)k * ulp;
}

float round_tf32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf, NaN */
  u += 0xfffu + ((u >> 13) & 1u);
  u &= ~0x1fffu;
  memcpy(&x, &u, 4);
  return x;
}

cudaError_t drain_stream(cudaStream_t s, const char *who) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  std::string call = std::string("emulator: ") + who;
  return sync_point(call.c_str(), stream_of(s), false);
}

void collective_settle(cudaStream_t s, const std::vector<std::pair<const void *, size_t>> &ranges) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  CUstream_st *st = stream_of(s);
  uint64_t upto = 0;
  for (const EmuWatch &w : st->watches)
    for (const auto &c : w.copies)
      for (const auto &r : ranges) {
        const char *a = (const char *)c.first, *b = (const char *)r.first;
        if (a < b + r.second && b < a + c.second.size()) upto = std::max(upto, w.seq);
      }
  settle(st, upto);
}

void collective_watch(cudaStream_t s, const std::string &who, const std::vector<std::pair<const void *, size_t>> &ranges) {
  std::lock_guard<std::recursive_mutex> lk(g_mu);
  CUstream_st *st = stream_of(s);
  /* An empty job marks the collective's place in the stream: events
   * recorded before it do not see it complete, those after do. */
  if (immediate()) st->queued++, st->done++;
  else st->q.push_back(EmuJob{nullptr, nullptr, 0}), st->queued++;
  EmuWatch w{st->queued, who, {}};
  for (const auto &r : ranges)
    if (r.first && r.second) w.copies.emplace_back(r.first, std::string((const char *)r.first, r.second));
  st->watches.push_back(std::move(w));
}

}  // namespace ct_emu

using namespace ct_emu;
#define LOCK std::lock_guard<std::recursive_mutex> lk(g_mu)

extern "C" {

cudaError_t cudaGetLastError(void) {
  LOCK;
  if (g_sticky != cudaSuccess) return g_sticky;
  cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  LOCK;
  return g_sticky != cudaSuccess ? g_sticky : g_last;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    default: return "cudaError (emulator: unnamed)";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  LOCK;
  static std::string s;
  if (e != cudaSuccess && e == g_sticky) {
    s = "emulated fault: " + g_sticky_msg;
    return s.c_str();
  }
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnjoined: return "capture was not joined back to the origin stream";
    default: return cudaGetErrorName(e);
  }
}

cudaError_t cudaGetDeviceCount(int *n) {
  LOCK;
  *n = device_count();
  return *n ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int d) {
  LOCK;
  if (d < 0 || d >= device_count()) return ret(cudaErrorInvalidDevice);
  g_device = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
  LOCK;
  if (!device_count()) return ret(cudaErrorNoDevice);
  *d = g_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  LOCK;
  if (d < 0 || d >= device_count()) return ret(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "ctrain CUDA emulator (CPU)");
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = total_mem();
  p->multiProcessorCount = 132;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->sharedMemPerBlock = 48 * 1024;
  p->unifiedAddressing = 1;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
  LOCK;
  *total = total_mem();
  *free_b = total_mem() - g_used;
  return cudaSuccess;
}

/* Device bytes an allocation counts against CT_EMU_MEM_MB: cudaMalloc's
 * 256-byte granularity, at least one unit. */
static size_t charged(size_t bytes) { return (std::max<size_t>(bytes, 1) + 255) & ~(size_t)255; }

cudaError_t cudaMalloc(void **p, size_t bytes) {
  LOCK;
  *p = nullptr;
  if (this_thread_captures()) return capture_violation("cudaMalloc");
  if (bytes > total_mem() - g_used) return ret(cudaErrorMemoryAllocation);
  void *m = guarded_alloc(bytes, DEVICE, true);
  if (!m) return ret(cudaErrorMemoryAllocation);
  g_used += charged(bytes);
  *p = m;
  return cudaSuccess;
}

/* cudaFree / cudaFreeHost: a sync point, then p must be a live allocation
 * of that kind. */
static cudaError_t free_of_kind(void *p, Kind kind, const char *who) {
  if (!p) return cudaSuccess;
  cudaError_t e = sync_point(who);
  if (e == cudaErrorStreamCaptureUnsupported) return e;
  auto it = g_allocs.find((uintptr_t)p);
  if (it == g_allocs.end() || it->second.kind != kind) return ret(cudaErrorInvalidValue);
  if (kind == DEVICE) g_used -= charged(it->second.bytes);
  guarded_free(it);
  return e;
}

cudaError_t cudaFree(void *p) {
  LOCK;
  return free_of_kind(p, DEVICE, "cudaFree");
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
  LOCK;
  (void)flags;
  *p = nullptr;
  if (this_thread_captures()) return capture_violation("cudaHostAlloc");
  void *m = guarded_alloc(bytes, PINNED, false);
  if (!m) return ret(cudaErrorMemoryAllocation);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  LOCK;
  return free_of_kind(p, PINNED, "cudaFreeHost");
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  LOCK;
  memset(a, 0, sizeof *a);
  const Alloc *al = find(p, 0, nullptr);
  if (!al) {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    return cudaSuccess;
  }
  a->type = al->kind == DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  a->device = al->kind == DEVICE ? al->device : 0;
  a->devicePointer = (void *)p;
  a->hostPointer = al->kind == PINNED ? (void *)p : nullptr;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
  LOCK;
  if (!bytes) return cudaSuccess;
  const Alloc *da = find(dst, bytes, nullptr), *sa = find(src, bytes, nullptr);
  const bool d_dev = da && da->kind == DEVICE, s_dev = sa && sa->kind == DEVICE;
  const bool d_pageable = !da, s_pageable = !sa;
  bool ok;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = d_dev && !s_dev; break;
    case cudaMemcpyDeviceToHost: ok = s_dev && !d_dev; break;
    case cudaMemcpyDeviceToDevice: ok = s_dev && d_dev; break;
    case cudaMemcpyHostToHost: ok = !s_dev && !d_dev; break;
    case cudaMemcpyDefault: ok = true; break;
    default: ok = false;
  }
  if (!ok) {
    fprintf(stderr, "ct_emu: cudaMemcpyAsync(%p <- %p, %zu bytes): kind %d does not match the pointers%s\n", dst, src,
            bytes, (int)kind,
            (d_pageable && kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyHostToHost) ||
                    (s_pageable && kind != cudaMemcpyHostToDevice && kind != cudaMemcpyHostToHost)
                ? " (or a device range overruns its allocation)"
                : "");
    return ret(cudaErrorInvalidValue);
  }
  CUstream_st *st = stream_of(s);
  if (st->capturing && (d_pageable || s_pageable)) {
    fprintf(stderr, "ct_emu: cudaMemcpyAsync with pageable host memory while capturing a CUDA graph\n");
    st->invalid = true;
    return ret(cudaErrorStreamCaptureUnsupported);
  }
  static const char *kinds[] = {"H2H", "H2D", "D2H", "D2D", "default"};
  const char *kname = (unsigned)kind < 5 ? kinds[kind] : "?";
  if (d_pageable) {
    /* Into pageable memory the copy completes before the call returns,
     * after what the stream holds before it. */
    trace_sync("cudaMemcpyAsync into pageable memory");
    run_ahead();
    run_stream(st);
    memcpy(dst, src, bytes);
    return g_sticky;
  }
  if (s_pageable) {
    /* From pageable memory the runtime stages the data before returning. */
    trace(s, "memcpy %s %zu bytes from pageable memory", kname, bytes);
    auto data = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
    enqueue(s, [dst, data]() { memcpy(dst, data->data(), data->size()); });
    return cudaSuccess;
  }
  trace(s, "memcpy %s %zu bytes", kname, bytes);
  enqueue(s, [dst, src, bytes]() { memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  LOCK;
  /* On the legacy default stream, which does not wait for non-blocking
   * streams (every stream the backend creates is one). */
  cudaError_t e = sync_point("cudaMemcpy", &g_default_stream);
  if (e != cudaSuccess) return e;
  e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  run_stream(&g_default_stream);
  return g_sticky;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  LOCK;
  if (!bytes) return cudaSuccess;
  const Alloc *a = find(p, bytes, nullptr);
  if (!a || a->kind != DEVICE) {
    fprintf(stderr, "ct_emu: cudaMemsetAsync(%p, %zu bytes): not a device range\n", p, bytes);
    return ret(cudaErrorInvalidValue);
  }
  trace(s, "memset %zu bytes", bytes);
  enqueue(s, [p, v, bytes]() { memset(p, v, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) {
  LOCK;
  cudaError_t e = sync_point("cudaMemset", &g_default_stream);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(p, v, bytes, nullptr);
  if (e != cudaSuccess) return e;
  run_stream(&g_default_stream);
  return g_sticky;
}

cudaError_t cudaDeviceSynchronize(void) {
  LOCK;
  return sync_point("cudaDeviceSynchronize");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  LOCK;
  (void)flags;
  static int next_id = 1;
  *s = new CUstream_st;
  (*s)->id = next_id++;
  (*s)->device = g_device;
  g_streams.push_back(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  LOCK;
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  auto it = std::find(g_streams.begin(), g_streams.end(), s);
  if (it == g_streams.end()) return ret(cudaErrorInvalidResourceHandle);
  /* Its work still completes; waits on it are then met. */
  run_stream(s);
  settle(s, UINT64_MAX);
  g_streams.erase(it);
  auto unlink = [s](CUstream_st *o) {
    for (EmuJob &j : o->q)
      if (j.wait == s) j.wait = nullptr;
  };
  unlink(&g_default_stream);
  for (CUstream_st *o : g_streams) unlink(o);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  LOCK;
  return sync_point("cudaStreamSynchronize", stream_of(s));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  LOCK;
  (void)flags;
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  CUstream_st *st = stream_of(s);
  if (st->capturing) {
    /* Only in-stream order may cross a capture's boundary. */
    if (e->stream && !e->in_capture) {
      fprintf(stderr, "ct_emu: cudaStreamWaitEvent: a capturing stream waits on an event recorded outside the "
                      "capture\n");
      st->invalid = true;
      return ret(cudaErrorStreamCaptureIsolation);
    }
    /* Captured work replays in order anyway; a fork's work up to the
     * event has joined. */
    CUstream_st *f = e->captured_on;
    if (f && f->capturing && f->joined < e->captured_seq) f->joined = e->captured_seq;
    return cudaSuccess;
  }
  if (e->in_capture) {
    /* The fork: s joins the capture e was recorded in. */
    CUstream_st *f = e->captured_on, *origin = f && f->capturing ? (f->origin ? f->origin : f) : nullptr;
    if (!origin || st == &g_default_stream) return ret(cudaErrorCapturedEvent);
    st->capturing = true, st->invalid = false, st->owner = origin->owner;
    st->origin = origin, st->captured = st->joined = 0;
    origin->forks.push_back(st);
    return cudaSuccess;
  }
  /* A destroyed stream ran everything at its destruction. */
  if (!e->stream || e->stream == st || !live_stream(e->stream)) return cudaSuccess;
  trace(s, "wait for stream %d", e->stream->id);
  st->q.push_back(EmuJob{nullptr, e->stream, e->seq});
  st->queued++;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  LOCK;
  (void)mode;
  if (!s) return ret(cudaErrorStreamCaptureUnsupported); /* the legacy stream cannot capture */
  if (s->capturing) return ret(cudaErrorIllegalState);
  s->capturing = true;
  s->invalid = false;
  s->owner = std::this_thread::get_id();
  s->nodes.clear();
  s->origin = nullptr;
  s->forks.clear();
  s->captured = s->joined = 0;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  LOCK;
  *g = nullptr;
  if (!s || !s->capturing || s->origin) return ret(cudaErrorIllegalState);
  s->capturing = false;
  bool unjoined = false;
  for (CUstream_st *f : s->forks) {
    unjoined = unjoined || f->joined < f->captured;
    s->invalid = s->invalid || f->invalid;
    f->capturing = false, f->origin = nullptr;
  }
  s->forks.clear();
  if (unjoined && !s->invalid) {
    fprintf(stderr, "ct_emu: cudaStreamEndCapture: a stream forked into the capture has work the capturing stream "
                    "never waited for\n");
    s->nodes.clear();
    return ret(cudaErrorStreamCaptureUnjoined);
  }
  if (s->invalid) {
    s->nodes.clear();
    return ret(cudaErrorStreamCaptureInvalidated);
  }
  *g = new CUgraph_st{std::move(s->nodes)};
  s->nodes.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  LOCK;
  CUstream_st *x = stream_of(s);
  *st = !x->capturing ? cudaStreamCaptureStatusNone
                      : x->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
  LOCK;
  (void)flags;
  if (!g) return ret(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{g->nodes};
  for (const EmuNode &n : g->nodes) (*exec)->meets = (*exec)->meets || n.meets;
  return cudaSuccess;
}

/* A graph whose collectives meet other threads of this process runs at its
 * launch, after what its stream has queued, each meeting outside the lock
 * (the other ranks' launches must get in to arrive) and the rest under
 * it. Other graphs queue as one job. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  std::vector<EmuNode> nodes;
  CUstream_st *st;
  {
    LOCK;
    if (!exec) return ret(cudaErrorInvalidValue);
    st = stream_of(s);
    nodes = exec->nodes;
    trace(s, "graph %zu nodes", nodes.size());
    if (!exec->meets) {
      enqueue(s, [nodes]() {
        for (auto &n : nodes) n.fn();
      });
      return cudaSuccess;
    }
    if (this_thread_captures()) return capture_violation("cudaGraphLaunch of a graph with in-process NCCL");
    run_stream(st);
  }
  for (const EmuNode &n : nodes) {
    if (n.meets) {
      n.fn();
      continue;
    }
    LOCK;
    run_on(st, n.fn);
  }
  LOCK;
  return g_sticky;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  *e = new CUevent_st{(int)flags};
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  LOCK;
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  CUstream_st *st = stream_of(s);
  e->in_capture = st->capturing;
  e->stream = st->capturing ? nullptr : st;
  e->seq = st->queued;
  e->captured_on = st->capturing ? st : nullptr;
  e->captured_seq = st->captured;
  return cudaSuccess;
}

/* Runs the work event e stands for (none when never recorded). */
static cudaError_t event_wait(cudaEvent_t e, const char *call) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  if (e->in_capture) return ret(cudaErrorCapturedEvent);
  if (this_thread_captures()) return capture_violation(call);
  trace_sync(call);
  run_ahead();
  if (e->stream && live_stream(e->stream)) run_until(e->stream, e->seq), settle(e->stream, e->seq);
  return g_sticky;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  LOCK;
  return event_wait(e, "cudaEventSynchronize");
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  LOCK;
  /* The work runs now, so the event has always completed. */
  return event_wait(e, "cudaEventQuery");
}

/* The emulator has no clock for device work: the time between two events
 * of one stream is 1 us per job queued between them, so a caller that
 * times alternatives (cuda_conv_graph.c under cudnn_benchmark) sees the
 * one that queues less as faster, deterministically. Stricter than the
 * runtime: both events must be of one stream, recorded outside a capture,
 * without cudaEventDisableTiming; the work up to the end event is run
 * here (the runtime answers cudaErrorNotReady before it completes; the
 * callers synchronise first). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  LOCK;
  if (!ms || !start || !end) return ret(cudaErrorInvalidValue);
  if ((start->flags | end->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
  if (!start->stream || !end->stream || start->stream != end->stream) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t e = event_wait(end, "cudaEventElapsedTime");
  if (e != cudaSuccess) return e;
  *ms = 0.001f * (float)((double)end->seq - (double)start->seq);
  return cudaSuccess;
}

/* No profiler attaches to the emulator: the range is a no-op. */
cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

}  // extern "C"
