/* Non-blocking open of regular files for reading (file_open.h). */
#include "core/file_open.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
       : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

ct_status ct_open_regular(const char *path, const char *what, int *fd) {
  *fd = -1;
  int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (d < 0) {
    int e = errno;
    return ct_error(e == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: cannot open%s%s: %s", path, what ? " " : "",
                    what ? what : "", strerror(e));
  }
  struct stat sb;
  if (fstat(d, &sb) != 0) {
    int e = errno;
    close(d);
    return ct_error(CT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(d);
    return ct_error(CT_ERR_IO, "%s: is %s; expected a regular file", path, kind_of(sb.st_mode));
  }
  int fl = fcntl(d, F_GETFL);
  if (fl >= 0) (void)fcntl(d, F_SETFL, fl & ~O_NONBLOCK);
  *fd = d;
  return CT_OK;
}

ct_status ct_fopen_regular(const char *path, const char *what, const char *mode, FILE **f) {
  *f = NULL;
  int d;
  CT_TRY(ct_open_regular(path, what, &d));
  *f = fdopen(d, mode);
  if (!*f) {
    int e = errno;
    close(d);
    return ct_error(CT_ERR_IO, "%s: fdopen: %s", path, strerror(e));
  }
  return CT_OK;
}
