/* SIGINT, SIGTERM and SIGHUP during `ctrain train`. The signals are
 * blocked in every thread (the mask is set before any thread starts and
 * is inherited) and one thread takes them with sigwait, so no handler
 * ever interrupts the training code. Before training starts a signal
 * exits at once (nothing to save); during ct_fit the first one sets the
 * stop request (ct_train_config.stop_request), and fit stops at the next
 * step boundary, checkpoints, and the command saves and writes its
 * metrics before the exit code 128 + signal; a second SIGINT exits at
 * once. Clusters send SIGTERM before a preemption. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static volatile sig_atomic_t stop_signal;
static atomic_int armed;
static sigset_t watched;

static void put(const char *s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

static void *watch(void *arg) {
  (void)arg;
  for (;;) {
    int sig;
    if (sigwait(&watched, &sig) != 0) continue;
    if (!atomic_load(&armed) || (stop_signal && sig == SIGINT)) {
      put(stop_signal ? "\nctrain: second interrupt: exiting now, without saving\n" : "\nctrain: stopped before training\n");
      _exit(128 + sig);
    }
    if (stop_signal) continue;
    stop_signal = sig;
    put(sig == SIGINT    ? "\nctrain: interrupt: stopping at the next step boundary (again to exit at once)\n"
        : sig == SIGTERM ? "\nctrain: SIGTERM: stopping at the next step boundary\n"
                         : "\nctrain: SIGHUP: stopping at the next step boundary\n");
  }
  return NULL;
}

void cli_watch_signals(void) {
  sigemptyset(&watched);
  sigaddset(&watched, SIGINT);
  sigaddset(&watched, SIGTERM);
  sigaddset(&watched, SIGHUP);
  pthread_t t;
  if (pthread_sigmask(SIG_BLOCK, &watched, NULL) != 0) return;
  if (pthread_create(&t, NULL, watch, NULL) != 0) {
    /* No watcher: the default actions again. */
    pthread_sigmask(SIG_UNBLOCK, &watched, NULL);
    return;
  }
  pthread_detach(t);
}

volatile sig_atomic_t *cli_stop_on_signals(void) {
  atomic_store(&armed, 1);
  return &stop_signal;
}
