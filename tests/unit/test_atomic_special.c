/* The atomic writer on what is not a plain file, all made in a temp
 * directory (never the system's own nodes): a symlink is followed and its
 * target replaced; a FIFO and a character device are written through and
 * stay what they were; a FIFO without a reader fails at once instead of
 * hanging; a socket is refused; a link into /proc/self/fd (/dev/stdout)
 * writes to the open file; the temp files of a killed writer are swept. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

static char dir[512];

/* The file's bytes as a string into buf (cap bytes), and their count; -1
 * when it cannot be read. */
static int read_all(const char *path, char *buf, size_t cap) {
  size_t n = 0;
  unsigned char *p = test_read_file(path, &n);
  if (!p) return -1;
  n = n < cap - 1 ? n : cap - 1;
  memcpy(buf, p, n);
  buf[n] = 0;
  free(p);
  return (int)n;
}

static ct_status write_text(const char *path, const char *text) {
  ct_atomic_file *f;
  CT_TRY(ct_atomic_file_open(path, &f));
  fputs(text, ct_atomic_file_stream(f));
  return ct_atomic_file_commit(f);
}

static void in_dir(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

static int is_kind(const char *path, mode_t kind) {
  struct stat sb;
  return lstat(path, &sb) == 0 && (sb.st_mode & S_IFMT) == kind;
}

static void symlinks(void) {
  char file[600], link[600], dangling[600], made[600], buf[64];
  in_dir(file, sizeof file, "file.txt");
  in_dir(link, sizeof link, "link.txt");
  in_dir(dangling, sizeof dangling, "dangling.txt");
  in_dir(made, sizeof made, "made.txt");
  FILE *fp = fopen(file, "w");
  fputs("old", fp);
  fclose(fp);
  CHECK(symlink("file.txt", link) == 0);
  CHECK_OK(write_text(link, "new"));
  CHECK_MSG(is_kind(link, S_IFLNK), "the link was replaced");
  CHECK(read_all(file, buf, sizeof buf) == 3 && !strcmp(buf, "new"));
  /* A dangling link: its target is created, the link stays. */
  CHECK(symlink("made.txt", dangling) == 0);
  CHECK_OK(write_text(dangling, "created"));
  CHECK(is_kind(dangling, S_IFLNK) && is_kind(made, S_IFREG));
  CHECK(read_all(made, buf, sizeof buf) == 7);
  unlink(file), unlink(link), unlink(dangling), unlink(made);
}

static void fifos(void) {
  char fifo[600], buf[64];
  in_dir(fifo, sizeof fifo, "pipe.fifo");
  CHECK(mkfifo(fifo, 0600) == 0);
  /* No reader: fails at once (this test would hang before), stays a FIFO. */
  ct_atomic_file *f = NULL;
  ct_status s = ct_atomic_file_open(fifo, &f);
  CHECK(s == CT_ERR_IO && f == NULL);
  CHECK_MSG(strstr(ct_last_error(), "no reader"), "%s", ct_last_error());
  CHECK_OK(ct_atomic_file_check(fifo));
  /* A reader: the bytes arrive through the FIFO, which stays one. */
  int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
  CHECK(rfd >= 0);
  CHECK_OK(write_text(fifo, "through"));
  ssize_t n = read(rfd, buf, sizeof buf - 1);
  CHECK(n == 7 && !memcmp(buf, "through", 7));
  close(rfd);
  CHECK(is_kind(fifo, S_IFIFO));
  unlink(fifo);
}

/* Character devices need CAP_MKNOD (root, as CI runs): /dev/null's and
 * /dev/full's numbers made in the temp directory. */
static void char_devices(void) {
  char null_dev[600], full_dev[600];
  in_dir(null_dev, sizeof null_dev, "null");
  in_dir(full_dev, sizeof full_dev, "full");
  if (mknod(null_dev, S_IFCHR | 0666, makedev(1, 3)) != 0 || mknod(full_dev, S_IFCHR | 0666, makedev(1, 7)) != 0) {
    printf("note: no mknod here (not root): character-device cases skipped\n");
    unlink(null_dev);
    return;
  }
  CHECK_OK(ct_atomic_file_check(null_dev));
  CHECK_OK(write_text(null_dev, "gone"));
  CHECK_MSG(is_kind(null_dev, S_IFCHR), "the device node was replaced");
  ct_status s = write_text(full_dev, "x");
  CHECK(s == CT_ERR_IO);
  CHECK_MSG(strstr(ct_last_error(), "No space left"), "%s", ct_last_error());
  CHECK(is_kind(full_dev, S_IFCHR));
  unlink(null_dev), unlink(full_dev);
}

static void refused(void) {
  char sock[600], inside[700];
  in_dir(sock, sizeof sock, "s.sock");
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  int fits = strlen(sock) < sizeof a.sun_path;
  if (fits) memcpy(a.sun_path, sock, strlen(sock) + 1);
  if (fd >= 0 && fits && bind(fd, (struct sockaddr *)&a, sizeof a) == 0) {
    CHECK(ct_atomic_file_check(sock) == CT_ERR_IO);
    CHECK_MSG(strstr(ct_last_error(), "is a socket"), "%s", ct_last_error());
    CHECK(is_kind(sock, S_IFSOCK));
  }
  if (fd >= 0) close(fd);
  unlink(sock);
  /* The write probe: a directory that cannot hold the file fails the
   * check, before any work (a file, not a directory, on the way). */
  in_dir(inside, sizeof inside, "plain/x.bin");
  char plain[600];
  in_dir(plain, sizeof plain, "plain");
  FILE *p = fopen(plain, "w");
  fclose(p);
  CHECK(ct_atomic_file_check(inside) == CT_ERR_IO);
  CHECK_MSG(strstr(ct_last_error(), "is not a folder"), "%s", ct_last_error());
  unlink(plain);
}

/* A link to /proc/self/fd/N (what /dev/stdout is) writes to that open
 * file, appending, instead of replacing anything. */
static void proc_fd(void) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  char link[600], target[64], buf[64];
  in_dir(link, sizeof link, "stdout");
  snprintf(target, sizeof target, "/proc/self/fd/%d", fds[1]);
  CHECK(symlink(target, link) == 0);
  CHECK_OK(write_text(link, "piped"));
  CHECK(read(fds[0], buf, sizeof buf) == 5 && !memcmp(buf, "piped", 5));
  CHECK(is_kind(link, S_IFLNK));
  close(fds[0]), close(fds[1]);
  unlink(link);
}

/* Temp files of a writer that died are removed by the next open in that
 * directory; a live process's are kept. */
static void stale_temps(void) {
  char host[64], dead[700], live[700], target[600];
  CHECK(gethostname(host, sizeof host) == 0);
  host[sizeof host - 1] = 0;
  for (char *c = host; *c; c++)
    if (*c == '.' || *c == '/') *c = '_';
  pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, NULL, 0); /* now a pid of no running process */
  snprintf(dead, sizeof dead, "%s/ck.safetensors.tmp.%s.%ld.3", dir, host, (long)child);
  snprintf(live, sizeof live, "%s/ck.safetensors.tmp.%s.%ld.9", dir, host, (long)getppid());
  FILE *a = fopen(dead, "w"), *b = fopen(live, "w");
  fclose(a), fclose(b);
  in_dir(target, sizeof target, "history.csv");
  CHECK_OK(write_text(target, "x"));
  CHECK_MSG(access(dead, F_OK) != 0, "a dead writer's temp file stayed: %s", dead);
  CHECK_MSG(access(live, F_OK) == 0, "a live process's temp file was removed: %s", live);
  unlink(live), unlink(target);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/atomic_special_%ld", test_tmpdir(), (long)getpid());
  mkdir(dir, 0777);
  symlinks();
  fifos();
  char_devices();
  refused();
  proc_fd();
  stale_temps();
  rmdir(dir);
  return test_summary("test_atomic_special");
}
