#include "ctrain/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ct_atomic_file {
  FILE *fp;
  char *path; /* the file replaced: the target, symlinks followed */
  char *tmp;  /* NULL when writing through (a device, a FIFO) */
};

static atomic_uint tmp_counter;

/* What a path names, after following symlinks. */
enum target { T_NEW, T_REGULAR, T_STREAM, T_OTHER };

/* What a path names, and where: *kind from the file at the end of any
 * symlinks; for a file to replace, out is that file's path (a dangling
 * link: the path it points at, which will be created). A link into /proc
 * or /dev/fd (/dev/stdout) names an open file of a process, not a place
 * to put a new one: written through. */
static ct_status resolve(const char *path, char *out, size_t cap, enum target *kind) {
  struct stat sb;
  const char *what = NULL;
  snprintf(out, cap, "%s", path);
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    *kind = S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode) ? T_STREAM : T_OTHER;
    what = S_ISDIR(sb.st_mode) ? "a directory" : S_ISSOCK(sb.st_mode) ? "a socket" : S_ISBLK(sb.st_mode) ? "a block device" : "a special file";
  } else {
    char cur[PATH_MAX];
    if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur)
      return ct_error(CT_ERR_INVALID_ARG, "%s: path longer than %d bytes", path, PATH_MAX - 1);
    for (int hops = 0;; hops++) {
      if (lstat(cur, &sb) != 0) {
        if (errno == ENOTDIR) return ct_error(CT_ERR_IO, "%s: a part of the folder path of %s is not a folder", path, cur);
        if (errno != ENOENT) return ct_error(CT_ERR_IO, "%s: cannot stat %s: %s", path, cur, strerror(errno));
        *kind = T_NEW;
        break;
      }
      if (!strncmp(cur, "/proc/", 6) || !strncmp(cur, "/dev/fd/", 8)) {
        *kind = T_STREAM;
        return CT_OK;
      }
      if (!S_ISLNK(sb.st_mode)) {
        *kind = T_REGULAR;
        break;
      }
      if (hops >= 40) return ct_error(CT_ERR_IO, "%s: too many levels of symbolic links", path);
      char link[PATH_MAX], next[PATH_MAX];
      ssize_t n = readlink(cur, link, sizeof link - 1);
      if (n < 0) return ct_error(CT_ERR_IO, "%s: cannot read link %s: %s", path, cur, strerror(errno));
      link[n] = 0;
      const char *slash = strrchr(cur, '/');
      int len = link[0] == '/' || !slash ? snprintf(next, sizeof next, "%s", link)
                                         : snprintf(next, sizeof next, "%.*s/%s", (int)(slash - cur), cur, link);
      if (len >= (int)sizeof next) return ct_error(CT_ERR_INVALID_ARG, "%s: link target too long", path);
      memcpy(cur, next, (size_t)len + 1);
    }
    snprintf(out, cap, "%s", cur);
  }
  if (*kind == T_OTHER)
    return ct_error(CT_ERR_IO, "%s: is %s; expected a regular file, a new path, a character device or a FIFO", path, what);
  return CT_OK;
}

/* The directory part of path ("." when there is none). */
static void dir_of(const char *path, char *buf, size_t n) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(buf, n, ".");
  } else if (slash == path) {
    snprintf(buf, n, "/");
  } else {
    size_t len = (size_t)(slash - path);
    if (len >= n) len = n - 1;
    memcpy(buf, path, len);
    buf[len] = 0;
  }
}

static void host_tag(char *buf, size_t n) {
  if (gethostname(buf, n) != 0) snprintf(buf, n, "host");
  buf[n - 1] = 0;
  for (char *c = buf; *c; c++)
    if (*c == '.' || *c == '/') *c = '_';
}

/* Removes the temp files a killed writer on this host left in dir:
 * names "<anything>.tmp.<host>.<pid>.<n>" whose process is gone. A live
 * process's (or another host's) are left alone. */
static void sweep(const char *dir) {
  char host[64], mark[80];
  host_tag(host, sizeof host);
  int ml = snprintf(mark, sizeof mark, ".tmp.%s.", host);
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    const char *p = strstr(e->d_name, mark);
    if (!p) continue;
    char *end;
    long pid = strtol(p + ml, &end, 10);
    if (end == p + ml || *end != '.' || pid <= 0) continue;
    const char *q = end + 1;
    strtoul(q, &end, 10);
    if (end == q || *end) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    char full[PATH_MAX];
    if (snprintf(full, sizeof full, "%s/%s", dir, e->d_name) < (int)sizeof full) unlink(full);
  }
  closedir(d);
}

static void release(ct_atomic_file *f) {
  free(f->tmp);
  free(f->path);
  free(f);
}

/* Opens a character device, FIFO or another process's open file for
 * writing through, appending (/dev/stdout redirected to a file continues
 * it). O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead
 * of hanging; the writes then block as usual. */
static ct_status open_stream(ct_atomic_file *f, const char *path) {
  int fd = open(f->path, O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return ct_error(CT_ERR_IO, "%s: cannot open %s for writing: %s", path, f->path,
                    errno == ENXIO ? "a FIFO with no reader" : strerror(errno));
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  f->fp = fdopen(fd, "wb");
  if (!f->fp) {
    int e = errno;
    close(fd);
    return ct_error(CT_ERR_IO, "%s: fdopen: %s", path, strerror(e));
  }
  return CT_OK;
}

/* Creates the temp file beside the target, after sweeping stale ones. */
static ct_status open_temp(ct_atomic_file *f, const char *path) {
  char dir[PATH_MAX], host[64];
  dir_of(f->path, dir, sizeof dir);
  sweep(dir);
  host_tag(host, sizeof host);
  size_t tn = strlen(f->path) + sizeof host + 48;
  f->tmp = malloc(tn);
  if (!f->tmp) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate atomic file handle", path);
  unsigned n = atomic_fetch_add(&tmp_counter, 1u);
  snprintf(f->tmp, tn, "%s.tmp.%s.%ld.%u", f->path, host, (long)getpid(), n);
  /* O_EXCL: a stale temp file of a dead process with a recycled pid must
   * not be silently appended to or shared. */
  int fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0 && (errno == EACCES || errno == EROFS))
    return ct_error(CT_ERR_IO, "%s: folder %s is not writable: %s", path, dir, strerror(errno));
  if (fd < 0) return ct_error(CT_ERR_IO, "%s: cannot create temp file %s: %s", path, f->tmp, strerror(errno));
  f->fp = fdopen(fd, "wb");
  if (!f->fp) {
    int e = errno;
    close(fd);
    unlink(f->tmp);
    return ct_error(CT_ERR_IO, "%s: fdopen of temp file %s: %s", path, f->tmp, strerror(e));
  }
  return CT_OK;
}

ct_status ct_atomic_file_open(const char *path, ct_atomic_file **out) {
  *out = NULL;
  if (!path || !*path) return ct_error(CT_ERR_INVALID_ARG, "atomic file: empty path");
  char target[PATH_MAX];
  enum target kind;
  CT_TRY(resolve(path, target, sizeof target, &kind));
  ct_atomic_file *f = calloc(1, sizeof *f);
  if (f) f->path = malloc(strlen(target) + 1);
  if (!f || !f->path) {
    free(f);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate atomic file handle", path);
  }
  strcpy(f->path, target);
  ct_status s = kind == T_STREAM ? open_stream(f, path) : open_temp(f, path);
  if (s != CT_OK) {
    release(f);
    return s;
  }
  *out = f;
  return CT_OK;
}

ct_status ct_atomic_file_check(const char *path) {
  if (!path || !*path) return ct_error(CT_ERR_INVALID_ARG, "atomic file: empty path");
  char target[PATH_MAX];
  enum target kind;
  CT_TRY(resolve(path, target, sizeof target, &kind));
  if (kind == T_STREAM) return CT_OK; /* written through; a FIFO is opened when written */
  ct_atomic_file *f;
  CT_TRY(ct_atomic_file_open(path, &f));
  ct_atomic_file_abort(f);
  return CT_OK;
}

FILE *ct_atomic_file_stream(ct_atomic_file *f) { return f ? f->fp : NULL; }

const char *ct_atomic_file_temp_path(const ct_atomic_file *f) { return f ? f->tmp : NULL; }

void ct_atomic_file_abort(ct_atomic_file *f) {
  if (!f) return;
  if (f->fp) fclose(f->fp);
  if (f->tmp) unlink(f->tmp);
  release(f);
}

ct_status ct_atomic_file_commit(ct_atomic_file *f) {
  if (!f) return ct_error(CT_ERR_INVALID_ARG, "atomic file: commit of NULL handle");
  const char *step = NULL;
  int e = 0;
  if (ferror(f->fp)) {
    step = "write";
    e = EIO;
  } else if (fflush(f->fp) != 0) {
    step = "flush";
    e = errno;
  } else if (f->tmp && fsync(fileno(f->fp)) != 0) {
    step = "fsync";
    e = errno;
  }
  /* fclose can report a deferred write error (NFS), so its result counts. */
  int rc = fclose(f->fp);
  f->fp = NULL;
  if (!step && rc != 0) {
    step = "close";
    e = errno;
  }
  if (!f->tmp) {
    /* Written through: the device's or reader's own error, if any. */
    ct_status s = step ? ct_error(CT_ERR_IO, "%s: %s failed: %s", f->path, step, strerror(e)) : CT_OK;
    release(f);
    return s;
  }
  if (!step && rename(f->tmp, f->path) != 0) {
    step = "rename";
    e = errno;
  }
  if (step) {
    ct_status s = ct_error(CT_ERR_IO, "%s: %s of temp file %s failed: %s", f->path, step, f->tmp, strerror(e));
    unlink(f->tmp);
    release(f);
    return s;
  }
  char dir[4096];
  dir_of(f->path, dir, sizeof dir);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ct_status s = CT_OK;
  if (dfd < 0 || fsync(dfd) != 0) {
    /* Some filesystems refuse fsync on directories (EINVAL); the data
     * itself is already durable and renamed, so only real errors count. */
    if (errno != EINVAL && errno != EROFS)
      s = ct_error(CT_ERR_IO, "%s: fsync of directory %s failed: %s", f->path, dir, strerror(errno));
  }
  if (dfd >= 0) close(dfd);
  release(f);
  return s;
}
