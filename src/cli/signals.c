/* SIGINT, SIGTERM and SIGHUP during `ctrain train`: the first asks ct_fit
 * to stop at the next step boundary (ct_train_config.stop_request), which
 * checkpoints, saves and writes the metrics before the exit code 128 +
 * signal; a second SIGINT exits at once (the user insists). Clusters send
 * SIGTERM before a preemption. */
#define _DEFAULT_SOURCE
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static volatile sig_atomic_t stop_signal;

static void put(const char *s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

static void on_signal(int sig) {
  if (stop_signal && sig == SIGINT) {
    put("\nctrain: second interrupt: exiting now, without saving\n");
    _exit(128 + SIGINT);
  }
  if (stop_signal) return;
  stop_signal = sig;
  put(sig == SIGINT    ? "\nctrain: interrupt: stopping at the next step boundary (again to exit at once)\n"
      : sig == SIGTERM ? "\nctrain: SIGTERM: stopping at the next step boundary\n"
                       : "\nctrain: SIGHUP: stopping at the next step boundary\n");
}

volatile sig_atomic_t *cli_stop_on_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* reads and writes go on; the loop polls the flag */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  return &stop_signal;
}
