/* The CUDA emulator's kernel scheduler: runs a launched grid block by
 * block, each block's threads as fibers (emu_kernel.h has the contract).
 *
 * A fiber is a stack and a saved stack pointer; switching is a dozen
 * instructions (x86-64 below, ucontext elsewhere). Threads start in index
 * order; a fiber runs them one after another until one waits at a barrier,
 * which keeps that fiber while another takes over, so a kernel without
 * barriers costs one fiber per block. The wait that completes a release
 * (the 32nd lane of a warp at a shuffle, the last thread of the block at a
 * barrier) releases it and queues the released threads, and a waiting
 * thread switches straight to the next one to run: an unstarted thread,
 * else the next queued one, in the order a pass over the block would take
 * them. Only when none can run does control return to the scheduler, which
 * reports the wait that cannot be released (a shuffle with missing lanes,
 * a barrier in divergent code). CT_EMU_REVERSE=1 runs blocks and threads
 * in reverse order: a kernel whose result changes with it depends on an
 * order the hardware does not promise. */
#include <signal.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "emu.h"
#include "emu_kernel.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

/* The linker's bounds of the __shared__ section (emu_kernel.h); weak, as a
 * program may have no shared variables at all. */
extern "C" char __start_ct_emu_shared[] __attribute__((weak));
extern "C" char __stop_ct_emu_shared[] __attribute__((weak));

namespace ct_emu {

thread_local uint3 block_idx;
thread_local dim3 block_dim, grid_dim;

namespace {

enum { UNSTARTED, READY, WAIT_BLOCK, WAIT_WARP, DONE };

/* A stack and its saved context. */
struct Fiber {
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t uc;
#endif
};

/* One GPU thread of the running block. */
struct Thread {
  int state;
  int fiber; /* the fiber it runs on, once started */
  uint3 idx;
  int op, pred, result; /* block barrier */
  unsigned mask;        /* warp shuffle */
  int src;
  uint64_t val, out;
};

constexpr size_t kStack = 128 * 1024, kGuard = 4096, kMaxThreads = 1024;

struct Sched {
  std::vector<Fiber> fibers;
  std::vector<int> free_fibers;
  std::vector<Thread> t;
  int nt = 0, next = 0; /* threads in the block, threads started */
  bool rev = false;
  char *stacks = nullptr; /* kMaxThreads stacks, each above a guard page */
  Fiber main;             /* the scheduler's own context */
  const std::function<void()> *run = nullptr;
  Thread *cur = nullptr;
  int cur_fiber = -1;
  /* Releases done by the thread whose wait completed them: the released
   * threads in the order to resume them, and the waits counted so far. */
  std::vector<int> ready;
  size_t ready_head = 0;
  int wait_block = 0;
  int warp_wait[kMaxThreads / 32] = {};
};

thread_local Sched *g_sched;

Sched &sched() {
  if (!g_sched) {
    g_sched = new Sched;
    size_t one = kStack + kGuard;
    void *m = mmap(nullptr, one * kMaxThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
      fprintf(stderr, "ct_emu: cannot map fiber stacks\n");
      abort();
    }
    g_sched->stacks = (char *)m;
    for (size_t i = 0; i < kMaxThreads; i++) mprotect(g_sched->stacks + i * one, kGuard, PROT_NONE);
    /* The SIGSEGV handler (emu_runtime.cpp) runs on this thread's own
     * stack, so a fiber's stack overflow can still report itself. */
    static thread_local char altstack[64 * 1024];
    stack_t ss = {};
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    sigaltstack(&ss, nullptr);
    g_sched->fibers.resize(kMaxThreads);
    g_sched->t.resize(kMaxThreads);
    for (int i = (int)kMaxThreads - 1; i >= 0; i--) g_sched->free_fibers.push_back(i);
  }
  return *g_sched;
}

}  // namespace
}  // namespace ct_emu

#if defined(__x86_64__)
/* ct_emu_switch(save, to): pushes the callee-saved registers, stores the
 * stack pointer in *save, loads `to` and pops the same frame there. The
 * floating-point control words (MXCSR, x87 CW) are not switched: every
 * fiber runs kernel code on the scheduler thread's environment and none
 * changes it (no rounding-mode or exception-mask calls in the kernels or
 * the emulator), and saving and loading them was 80% of a switch. */
extern "C" void ct_emu_switch(void **save, void *to);
extern "C" void ct_emu_trampoline(void);
asm(R"(
  .text
  .globl ct_emu_switch
  .type ct_emu_switch,@function
ct_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ct_emu_switch, .-ct_emu_switch

  .globl ct_emu_trampoline
  .type ct_emu_trampoline,@function
ct_emu_trampoline:
  movq %r12, %rdi
  andq $-16, %rsp
  callq *%r13
  ud2
  .size ct_emu_trampoline, .-ct_emu_trampoline
)");
#endif

namespace ct_emu {
namespace {

void jump(Fiber *save, Fiber *to) {
#if defined(__x86_64__)
  ct_emu_switch(&save->sp, to->sp);
#else
  swapcontext(&save->uc, &to->uc);
#endif
}

void fiber_init(Sched &s, int fi);

/* Switches from the running context (saved in *save) to the next one: an
 * unstarted thread on a fresh fiber, else the next released thread, else
 * the scheduler, which reports what cannot go on. Going from thread to
 * thread directly, rather than through the scheduler, halves the switches
 * of a barrier or shuffle (a switch costs mostly its stack misses). */
void switch_to_next(Sched &s, Fiber *save) {
  if (s.next < s.nt) {
    int fi = s.free_fibers.back();
    s.free_fibers.pop_back();
    fiber_init(s, fi);
    s.cur_fiber = fi;
    jump(save, &s.fibers[fi]);
    return;
  }
  if (s.ready_head < s.ready.size()) {
    Thread &nx = s.t[s.ready[s.ready_head++]];
    s.cur = &nx;
    s.cur_fiber = nx.fiber;
    if (&s.fibers[nx.fiber] != save) jump(save, &s.fibers[nx.fiber]); /* else: the waiter itself goes on */
    return;
  }
  jump(save, &s.main);
}

/* Marks threads lo..hi-1 released, queued in the order they would start. */
void release(Sched &s, int lo, int hi) {
  for (int k = lo; k < hi; k++) {
    const int i = s.rev ? hi - 1 - (k - lo) : k;
    s.t[i].state = READY;
    s.ready.push_back(i);
  }
}

/* Warp w's shuffle once all 32 lanes wait at one the emulator models;
 * anything else is left for run_block to report. */
void try_release_warp(Sched &s, int w) {
  const int lo = w * 32;
  if (lo + 32 > s.nt || s.warp_wait[w] < 32) return;
  for (int i = lo; i < lo + 32; i++)
    if (s.t[i].mask != 0xffffffffu || s.t[i].src < 0 || s.t[i].src >= 32) return;
  for (int i = lo; i < lo + 32; i++) s.t[i].out = s.t[lo + s.t[i].src].val;
  s.warp_wait[w] = 0;
  release(s, lo, lo + 32);
}

/* The block barrier once every thread waits at the same kind of one. */
void try_release_block(Sched &s) {
  if (s.wait_block < s.nt) return;
  const int op = s.t[0].op;
  int any = 0, all = 1, count = 0;
  for (int i = 0; i < s.nt; i++) {
    if (s.t[i].op != op) return;
    any |= s.t[i].pred;
    all &= s.t[i].pred;
    count += s.t[i].pred;
  }
  const int r = op == 1 ? any : op == 2 ? all : op == 3 ? count : 0;
  for (int i = 0; i < s.nt; i++) s.t[i].result = r;
  s.wait_block = 0;
  release(s, 0, s.nt);
}

/* A fiber runs unstarted threads one after another until one waits at a
 * barrier (that thread keeps the fiber; another starts on a fresh one) or
 * none is left. A kernel without barriers thus runs a whole block on one
 * fiber with two switches. */
[[noreturn]] void fiber_main(void *) {
  Sched &s = *g_sched;
  const int me = s.cur_fiber;
  for (;;) {
    if (s.next >= s.nt) break;
    int k = s.next++;
    Thread &th = s.t[s.rev ? s.nt - 1 - k : k];
    th.state = READY;
    th.fiber = me;
    s.cur = &th;
    (*s.run)();
    th.state = DONE;
    /* A thread that waited at a barrier was resumed only after every
     * thread had started, so the loop ends here for its fiber. */
  }
  s.free_fibers.push_back(me);
  switch_to_next(s, &s.fibers[me]); /* saving into a free fiber is harmless: it is reinitialised before use */
  __builtin_unreachable();
}

#if !defined(__x86_64__)
void fiber_entry_uc() { fiber_main(nullptr); }
#endif

void fiber_init(Sched &s, int fi) {
  Fiber &f = s.fibers[fi];
  char *top = s.stacks + (size_t)fi * (kStack + kGuard) + kGuard + kStack;
#if defined(__x86_64__)
  uint64_t *sp = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15) - 7;
  sp[0] = sp[1] = 0;                        /* r15, r14 */
  sp[2] = (uint64_t)(uintptr_t)&fiber_main; /* r13: entry */
  sp[3] = 0;                                /* r12: its argument */
  sp[4] = sp[5] = 0;                        /* rbx, rbp */
  sp[6] = (uint64_t)(uintptr_t)&ct_emu_trampoline;
  f.sp = sp;
#else
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = top - kStack;
  f.uc.uc_stack.ss_size = kStack;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, fiber_entry_uc, 0);
#endif
}

/* From a thread: wait (state already set) until released. The wait that
 * completes a warp's shuffle or the block's barrier releases it here. */
void wait_here(Sched &s) {
  Thread *th = s.cur;
  const int i = (int)(th - s.t.data());
  if (th->state == WAIT_WARP) {
    s.warp_wait[i / 32]++;
    try_release_warp(s, i / 32);
  } else {
    s.wait_block++;
    try_release_block(s);
  }
  switch_to_next(s, &s.fibers[th->fiber]);
  /* resumed: s.cur == th again */
}

int g_reverse = -1; /* -1: from CT_EMU_REVERSE at the first launch */

bool reverse_order() {
  if (g_reverse < 0) g_reverse = ct_emu::env_flag("CT_EMU_REVERSE");
  return g_reverse;
}

/* Runs one block to the end; false (after ct_emu::fail) on a wait the
 * block cannot pass. */
bool run_block(Sched &s, const char *name, int nt) {
  const uintptr_t sh0 = (uintptr_t)__start_ct_emu_shared, sh1 = (uintptr_t)__stop_ct_emu_shared;
  if (sh1 > sh0) memset(__start_ct_emu_shared, 0xff, sh1 - sh0);
  s.nt = nt;
  s.next = 0;
  s.ready.clear();
  s.ready_head = 0;
  s.wait_block = 0;
  memset(s.warp_wait, 0, sizeof s.warp_wait);
  for (int i = 0; i < nt; i++) {
    s.t[i].state = UNSTARTED;
    s.t[i].fiber = -1;
  }
  auto where = [&](const char *what, const std::string &detail) {
    char b[256];
    snprintf(b, sizeof b, "kernel %s, block (%u,%u,%u): %s: ", name, block_idx.x, block_idx.y, block_idx.z, what);
    fail(cudaErrorLaunchFailure, b + detail);
    /* The suspended threads are abandoned; their fibers return to the pool. */
    for (int i = 0; i < nt; i++)
      if (s.t[i].state == WAIT_BLOCK || s.t[i].state == WAIT_WARP) s.free_fibers.push_back(s.t[i].fiber);
    return false;
  };
  /* Start the first thread: the threads then pass control among
   * themselves (switch_to_next), every release done by the wait that
   * completes it, and control comes back here only when none can run:
   * every thread has ended, or the waits left cannot be released. */
  while (s.next < nt) switch_to_next(s, &s.main);
  int done = 0, wblock = 0;
  for (int i = 0; i < nt; i++) {
    done += s.t[i].state == DONE;
    wblock += s.t[i].state == WAIT_BLOCK;
  }
  if (done == nt) return true;
  for (int w = 0; w * 32 < nt; w++) {
    int lo = w * 32, hi = lo + 32 < nt ? lo + 32 : nt, waiting = 0;
    for (int i = lo; i < hi; i++) waiting += s.t[i].state == WAIT_WARP;
    if (!waiting) continue;
    if (hi - lo < 32) return where("warp shuffle", "a full mask in a warp of " + std::to_string(hi - lo) + " lanes");
    if (waiting < 32)
      return where("warp shuffle", std::to_string(32 - waiting) + " lanes of warp " + std::to_string(w) +
                                       " exited or wait at __syncthreads");
    return where("warp shuffle", "mask or source lane the emulator does not model");
  }
  if (wblock == nt) return where("__syncthreads", "threads wait at different barrier kinds");
  if (wblock)
    return where("__syncthreads", std::to_string(wblock) + " threads wait while " + std::to_string(done) +
                                      " have exited (a barrier in divergent code)");
  return where("scheduler", "no thread can run");
}

}  // namespace

void set_reverse_for_test(bool reverse) { g_reverse = reverse; }

const uint3 &thread_idx() { return g_sched->cur->idx; }

int block_barrier(int op, int pred) {
  Sched &s = *g_sched;
  Thread *th = s.cur;
  th->op = op;
  th->pred = pred;
  th->state = WAIT_BLOCK;
  wait_here(s);
  return th->result;
}

uint64_t warp_shuffle(unsigned mask, uint64_t bits, int src_lane) {
  Sched &s = *g_sched;
  Thread *th = s.cur;
  th->mask = mask;
  th->val = bits;
  th->src = src_lane;
  th->state = WAIT_WARP;
  wait_here(s);
  return th->out;
}

void launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, std::function<void()> run,
            const void *const *ptrs, const size_t *aligns, int nptrs) {
  uint64_t nt = (uint64_t)block.x * block.y * block.z;
  if (!nt || nt > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || !grid.x || !grid.y || !grid.z ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 || smem > 48 * 1024) {
    char b[256];
    snprintf(b, sizeof b, "kernel %s: grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of shared memory", name, grid.x,
             grid.y, grid.z, block.x, block.y, block.z, smem);
    set_last_error(cudaErrorInvalidConfiguration, b);
    return;
  }
  if (!check_stream_device(stream, name)) return;
  for (int i = 0; i < nptrs; i++) {
    if (!ptrs[i]) continue;
    char what[64];
    snprintf(what, sizeof what, "pointer argument %d", i);
    if (!check_device_range(ptrs[i], 1, name, what)) return;
    if ((uintptr_t)ptrs[i] % aligns[i]) {
      char b[160];
      snprintf(b, sizeof b, "kernel %s: %s %p is not aligned to %zu bytes", name, what, ptrs[i], aligns[i]);
      fail(cudaErrorMisalignedAddress, b);
      return;
    }
  }
  trace(stream, "kernel %s grid %u,%u,%u block %u,%u,%u", name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
  std::string kname = name;
  enqueue(stream, [kname, grid, block, run]() {
    Sched &s = sched();
    s.run = &run;
    s.rev = reverse_order();
    grid_dim = grid;
    block_dim = block;
    const int nt = (int)(block.x * block.y * block.z);
    for (int i = 0; i < nt; i++) { /* thread indices: once per launch */
      uint3 &idx = s.t[i].idx;
      idx.x = (unsigned)(i % (int)block.x);
      idx.y = (unsigned)((i / (int)block.x) % (int)block.y);
      idx.z = (unsigned)(i / ((int)block.x * (int)block.y));
    }
    const uint64_t nb = (uint64_t)grid.x * grid.y * grid.z;
    for (uint64_t k = 0; k < nb; k++) {
      uint64_t b = s.rev ? nb - 1 - k : k;
      block_idx.x = (unsigned)(b % grid.x);
      block_idx.y = (unsigned)((b / grid.x) % grid.y);
      block_idx.z = (unsigned)(b / ((uint64_t)grid.x * grid.y));
      if (!run_block(s, kname.c_str(), nt)) break;
    }
    s.run = nullptr;
  });
}

}  // namespace ct_emu
