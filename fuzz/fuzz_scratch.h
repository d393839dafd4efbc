/* Scratch files for fuzz targets whose parsers read files, not memory: one
 * directory per process under $CTRAIN_TEST_TMP (the ctest twins' temporary
 * directory), else $TMPDIR, else /tmp, created on first use. Paths are
 * reused for every input, so a long campaign leaves a handful of files. */
#ifndef CTRAIN_FUZZ_SCRATCH_H
#define CTRAIN_FUZZ_SCRATCH_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* The process's scratch directory (NULL if it cannot be created). */
static const char *fuzz_scratch_dir(void) {
  static char dir[512];
  if (!dir[0]) {
    const char *base = getenv("CTRAIN_TEST_TMP");
    if (!base || !*base) base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    mkdir(base, 0777);
    snprintf(dir, sizeof dir, "%s/ctrain_fuzz_%ld", base, (long)getpid());
    if (mkdir(dir, 0777) != 0) {
      struct stat st;
      if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        dir[0] = 0;
        return NULL;
      }
    }
  }
  return dir;
}

/* Writes data to <scratch dir>/<leaf>, puts that path in path[cap] and
 * returns it, or NULL when the file cannot be written. */
static const char *fuzz_scratch_file(const char *leaf, const uint8_t *data, size_t n, char *path, size_t cap) {
  const char *dir = fuzz_scratch_dir();
  if (!dir) return NULL;
  snprintf(path, cap, "%s/%s", dir, leaf);
  /* A new file, not the old one truncated: ext4 flushes a file truncated
   * and rewritten at close, which made the twins wait on the disk (15 s
   * instead of 0.9 for 10k checkpoints). */
  unlink(path);
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  size_t w = n ? fwrite(data, 1, n, f) : 0;
  if (fclose(f) != 0 || w != n) return NULL;
  return path;
}

/* Removes the scratch directory and the files in it (the twins call this
 * at the end; libFuzzer runs leave theirs). */
static void fuzz_scratch_clear(void) {
  const char *dir = fuzz_scratch_dir();
  DIR *d = dir ? opendir(dir) : NULL;
  if (!d) return;
  struct dirent *e;
  char p[1024];
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(dir);
}

#endif
