/* Atomic file replacement: commit publishes, abort and failures leave the
 * old file and no temp file behind, errors name the path. */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

static char dir[512];

static int read_all(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
  return (int)n;
}

static void write_plain(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  fputs(text, f);
  fclose(f);
}

/* Entries in dir whose name contains ".tmp.": leftovers of failed writes. */
static int count_temps(void) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".tmp.")) n++;
  if (d) closedir(d);
  return n;
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/atomic_%ld", test_tmpdir(), (long)getpid());
  mkdir(dir, 0777);
  char path[600], buf[256];
  snprintf(path, sizeof path, "%s/out.bin", dir);
  ct_rng rng;
  ct_rng_init(&rng, 7, CT_RNG_TEST, 1, 0);
  char content[64];
  for (int i = 0; i < 63; i++) content[i] = (char)('a' + ct_rng_below(&rng, 26));
  content[63] = 0;

  /* Fresh file: nothing visible before commit, exact content after. */
  ct_atomic_file *f = NULL;
  CHECK_OK(ct_atomic_file_open(path, &f));
  CHECK(f && strstr(ct_atomic_file_temp_path(f), ".tmp.") != NULL);
  fputs(content, ct_atomic_file_stream(f));
  CHECK(access(path, F_OK) != 0);
  CHECK_OK(ct_atomic_file_commit(f));
  CHECK(read_all(path, buf, sizeof buf) == 63 && strcmp(buf, content) == 0);
  CHECK(count_temps() == 0);

  /* Abort keeps the old content and removes the temp file. */
  CHECK_OK(ct_atomic_file_open(path, &f));
  fputs("partial", ct_atomic_file_stream(f));
  ct_atomic_file_abort(f);
  CHECK(read_all(path, buf, sizeof buf) == 63 && strcmp(buf, content) == 0);
  CHECK(count_temps() == 0);
  ct_atomic_file_abort(NULL);

  /* Replace: the new content wins entirely. */
  CHECK_OK(ct_atomic_file_open(path, &f));
  fputs("new", ct_atomic_file_stream(f));
  CHECK_OK(ct_atomic_file_commit(f));
  CHECK(read_all(path, buf, sizeof buf) == 3 && strcmp(buf, "new") == 0);

  /* Two writers of one target get distinct temp files. */
  ct_atomic_file *a = NULL, *b = NULL;
  CHECK_OK(ct_atomic_file_open(path, &a));
  CHECK_OK(ct_atomic_file_open(path, &b));
  CHECK(a && b && strcmp(ct_atomic_file_temp_path(a), ct_atomic_file_temp_path(b)) != 0);
  fputs("A", ct_atomic_file_stream(a));
  fputs("B", ct_atomic_file_stream(b));
  CHECK_OK(ct_atomic_file_commit(b));
  CHECK_OK(ct_atomic_file_commit(a));
  CHECK(read_all(path, buf, sizeof buf) == 1 && buf[0] == 'A');
  CHECK(count_temps() == 0);

  /* Missing directory: CT_ERR_IO naming the path and the errno text. */
  char bad[700];
  snprintf(bad, sizeof bad, "%s/no_such_dir/x.bin", dir);
  ct_status s = ct_atomic_file_open(bad, &f);
  CHECK(s == CT_ERR_IO && f == NULL);
  CHECK_MSG(strstr(ct_last_error(), bad) && strstr(ct_last_error(), "No such file"), "%s", ct_last_error());

  /* A directory is refused at open (before any work is done): named,
   * left as it was, no temp file. */
  char target_dir[700], inner[800];
  snprintf(target_dir, sizeof target_dir, "%s/adir", dir);
  mkdir(target_dir, 0777);
  snprintf(inner, sizeof inner, "%s/keep", target_dir);
  write_plain(inner, "x");
  s = ct_atomic_file_open(target_dir, &f);
  CHECK(s == CT_ERR_IO && f == NULL);
  CHECK_MSG(strstr(ct_last_error(), target_dir) && strstr(ct_last_error(), "is a directory"), "%s", ct_last_error());
  CHECK(count_temps() == 0);
  CHECK(access(inner, F_OK) == 0);

  /* A file in the current directory (no slash) commits too. */
  char cwd[512];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  CHECK(chdir(dir) == 0);
  CHECK_OK(ct_atomic_file_open("plain.bin", &f));
  fputs("p", ct_atomic_file_stream(f));
  CHECK_OK(ct_atomic_file_commit(f));
  CHECK(read_all("plain.bin", buf, sizeof buf) == 1);
  CHECK(chdir(cwd) == 0);

  unlink(inner);
  rmdir(target_dir);
  snprintf(bad, sizeof bad, "%s/plain.bin", dir);
  unlink(bad);
  unlink(path);
  rmdir(dir);
  return test_summary("test_atomic_file");
}
