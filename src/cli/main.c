/* ctrain: the command. Thin: parses, calls the library, maps the status
 * to an exit code (docs/CLI.md). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

int omp_get_max_threads_wrapper(void) { return omp_get_max_threads(); }

static const char *USAGE =
    "usage: ctrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train     train a model (fit), evaluating on the test split every epoch\n"
    "  eval      evaluate saved weights on the test split\n"
    "  predict   class probabilities for a dataset's test split or image files\n"
    "  summary   layers, output shapes, parameters and step memory of a model\n"
    "  devices   the devices this build can use\n"
    "  version   print the version\n"
    "\n"
    "'ctrain <command> --help' describes each command's options.\n";

int main(int argc, char **argv) {
  /* How long idle OpenMP threads spin before sleeping: libgomp's default
   * lets them steal the cores the loader threads need on small machines,
   * and sleeping at once pays a futex wake-up at each parallel region of
   * a step; about 10 us of spinning was fastest (docs/ARCHITECTURE.md,
   * "Threads"). libgomp reads these when it loads, before main, so the
   * default is set by re-executing once; an explicit OMP_WAIT_POLICY or
   * GOMP_SPINCOUNT wins. The path is read from /proc/self/exe first:
   * exec'd directly that names the running binary, which under valgrind
   * is valgrind's, not ctrain. */
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", "30000", 1);
    /* LLVM's libomp ignores GOMP_SPINCOUNT: sleep at once there, as before. */
    if (!getenv("KMP_BLOCKTIME")) setenv("KMP_BLOCKTIME", "0", 1);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
      self[n] = 0;
      execv(self, argv); /* returns only on failure: go on */
    }
  }
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    fputs(USAGE, argc < 2 ? stderr : stdout);
    return argc < 2 ? CLI_EXIT_USAGE : 0;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "train")) return cmd_train(argc - 2, argv + 2);
  if (!strcmp(cmd, "eval")) return cmd_eval(argc - 2, argv + 2);
  if (!strcmp(cmd, "predict")) return cmd_predict(argc - 2, argv + 2);
  if (!strcmp(cmd, "summary")) return cmd_summary(argc - 2, argv + 2);
  if (!strcmp(cmd, "devices")) return cmd_devices(argc - 2, argv + 2);
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("ctrain %s\n", CTRAIN_VERSION);
    return 0;
  }
  fprintf(stderr, "ctrain: unknown command '%s'\n\n%s", cmd, USAGE);
  return CLI_EXIT_USAGE;
}
