/* __fpurge needs _GNU_SOURCE, which the build defines. */
#include "ctrain/tensorboard.h"

#include <errno.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "io/crc32c.h"

/* Field numbers from tensorflow/core/util/event.proto,
 * core/framework/summary.proto, tensor.proto and tensor_shape.proto. */
enum {
  EVENT_WALL_TIME = 1,     /* double */
  EVENT_STEP = 2,          /* int64 */
  EVENT_FILE_VERSION = 3,  /* string */
  EVENT_SUMMARY = 5,       /* Summary */
  SUMMARY_VALUE = 1,       /* repeated Summary.Value */
  VALUE_TAG = 1,           /* string */
  VALUE_SIMPLE_VALUE = 2,  /* float */
  VALUE_TENSOR = 8,        /* TensorProto */
  VALUE_METADATA = 9,      /* SummaryMetadata */
  METADATA_PLUGIN_DATA = 1,
  PLUGIN_DATA_NAME = 1,
  TENSOR_DTYPE = 1,        /* enum DataType */
  TENSOR_SHAPE = 2,        /* TensorShapeProto; empty = scalar */
  TENSOR_STRING_VAL = 8,   /* repeated bytes */
  DT_STRING = 7
};
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

#define TB_AUTO_FLUSH_S 2.0

struct ct_tb_writer {
  FILE *f;
  char *path;
  double last_flush; /* monotonic seconds */
  off_t durable;     /* the file's size after the last successful flush: whole records only */
  int failed;        /* a write or flush failed: the file was cut back to durable, nothing more is written */
};

/* After a failed write or flush (a full disk): drops what stdio still
 * buffers, cuts the file back to its last whole record and stops the
 * writer, so a reader never meets half a record. */
static ct_status fail(ct_tb_writer *w, const char *what, int err) {
  __fpurge(w->f);
  clearerr(w->f);
  if (ftruncate(fileno(w->f), w->durable) == 0) (void)fseeko(w->f, w->durable, SEEK_SET);
  w->failed = 1;
  return ct_error(CT_ERR_IO, "%s: %s failed: %s (the file was cut back to its last whole record)", w->path, what,
                  strerror(err));
}

/* ---- a minimal protobuf encoder ------------------------------------- */

typedef struct pb_buf {
  unsigned char *p;
  size_t n, cap;
  int oom; /* sticky: checked once after a message is built */
} pb_buf;

static void pb_reserve(pb_buf *b, size_t extra) {
  if (b->oom || b->n + extra <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->n + extra) cap *= 2;
  unsigned char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return;
  }
  b->p = p;
  b->cap = cap;
}

static void pb_raw(pb_buf *b, const void *data, size_t n) {
  pb_reserve(b, n);
  if (b->oom) return;
  if (n) memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void pb_varint(pb_buf *b, uint64_t v) {
  unsigned char tmp[10];
  size_t k = 0;
  do {
    tmp[k] = (unsigned char)(v & 0x7F);
    v >>= 7;
    if (v) tmp[k] |= 0x80;
    k++;
  } while (v);
  pb_raw(b, tmp, k);
}

static void pb_key(pb_buf *b, unsigned field, unsigned wire) { pb_varint(b, (uint64_t)field << 3 | wire); }

static void pb_le(pb_buf *b, uint64_t v, int bytes) {
  unsigned char tmp[8];
  for (int i = 0; i < bytes; i++) tmp[i] = (unsigned char)(v >> (8 * i));
  pb_raw(b, tmp, (size_t)bytes);
}

static void pb_double(pb_buf *b, unsigned field, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  pb_key(b, field, WIRE_FIXED64);
  pb_le(b, u, 8);
}

static void pb_float(pb_buf *b, unsigned field, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  pb_key(b, field, WIRE_FIXED32);
  pb_le(b, u, 4);
}

/* int64 fields are varints of the two's-complement value (10 bytes when
 * negative), which is what protobuf does for int64 (not sint64). */
static void pb_int64(pb_buf *b, unsigned field, int64_t v) {
  pb_key(b, field, WIRE_VARINT);
  pb_varint(b, (uint64_t)v);
}

static void pb_bytes(pb_buf *b, unsigned field, const void *data, size_t n) {
  pb_key(b, field, WIRE_BYTES);
  pb_varint(b, n);
  pb_raw(b, data, n);
}

static void pb_message(pb_buf *b, unsigned field, const pb_buf *inner) {
  if (inner->oom) b->oom = 1;
  pb_bytes(b, field, inner->p, inner->n);
}

static void pb_free(pb_buf *b) { free(b->p); }

/* ---- TFRecord framing ---------------------------------------------- */

static double now_realtime(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_monotonic(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void put_u32le(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static ct_status write_record(ct_tb_writer *w, const pb_buf *event) {
  if (event->oom) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory encoding an event", w->path);
  unsigned char head[12], tail[4];
  uint64_t len = event->n;
  for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
  put_u32le(head + 8, ct_crc32c_mask(ct_crc32c(0, head, 8)));
  put_u32le(tail, ct_crc32c_mask(ct_crc32c(0, event->p, event->n)));
  if (w->failed) return ct_error(CT_ERR_IO, "%s: not written: an earlier write failed", w->path);
  if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
      (event->n && fwrite(event->p, 1, event->n, w->f) != event->n) ||
      fwrite(tail, 1, sizeof tail, w->f) != sizeof tail)
    return fail(w, "write", errno);
  double t = now_monotonic();
  if (t - w->last_flush >= TB_AUTO_FLUSH_S) return ct_tb_flush(w);
  return CT_OK;
}

/* Wraps one Summary.Value into Event{wall_time, step, summary{value}} and
 * appends it. */
static ct_status write_summary_value(ct_tb_writer *w, int64_t step, const pb_buf *value) {
  pb_buf summary = {0}, event = {0};
  pb_message(&summary, SUMMARY_VALUE, value);
  pb_double(&event, EVENT_WALL_TIME, now_realtime());
  pb_int64(&event, EVENT_STEP, step);
  pb_message(&event, EVENT_SUMMARY, &summary);
  ct_status s = write_record(w, &event);
  pb_free(&summary);
  pb_free(&event);
  return s;
}

/* ---- opening ------------------------------------------------------- */

/* mkdir -p: each prefix ending at a '/' is created if absent. */
static ct_status make_dirs(const char *dir) {
  size_t n = strlen(dir);
  char *p = malloc(n + 1);
  if (!p) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
  memcpy(p, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != 0) continue;
    char c = p[i];
    p[i] = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST) {
      int e = errno;
      ct_status s = ct_error(CT_ERR_IO, "TensorBoard log dir %s: cannot create %s: %s", dir, p, strerror(e));
      free(p);
      return s;
    }
    p[i] = c;
  }
  free(p);
  struct stat st;
  if (stat(dir, &st) != 0)
    return ct_error(CT_ERR_IO, "TensorBoard log dir %s: %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return ct_error(CT_ERR_IO, "TensorBoard log dir %s: exists and is not a directory", dir);
  return CT_OK;
}

/* Host name as a file-name component: characters that would change the
 * path ('/') or confuse shells become '_'. */
static void host_component(char *out, size_t cap) {
  if (gethostname(out, cap) != 0 || !out[0]) snprintf(out, cap, "localhost");
  out[cap - 1] = 0;
  for (char *c = out; *c; c++)
    if (*c == '/' || *c == ' ' || (unsigned char)*c < 32) *c = '_';
}

ct_status ct_tb_open(const char *logdir, ct_tb_writer **out) {
  if (!out) return ct_error(CT_ERR_INVALID_ARG, "ct_tb_open: out is NULL");
  *out = NULL;
  if (!logdir || !*logdir) return ct_error(CT_ERR_INVALID_ARG, "ct_tb_open: empty TensorBoard log dir");
  CT_TRY(make_dirs(logdir));

  char host[256];
  host_component(host, sizeof host);
  long long secs = (long long)time(NULL);
  size_t cap = strlen(logdir) + strlen(host) + 96;
  char *path = malloc(cap);
  ct_tb_writer *w = calloc(1, sizeof *w);
  if (!path || !w) {
    free(path);
    free(w);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "TensorBoard log dir %s: out of memory", logdir);
  }
  /* "x" (C11 exclusive create) so two writers in the same second never
   * share a file; collisions get a pid and counter suffix. */
  FILE *f = NULL;
  for (int n = 0; n < 1000 && !f; n++) {
    if (n == 0)
      snprintf(path, cap, "%s/events.out.tfevents.%lld.%s", logdir, secs, host);
    else
      snprintf(path, cap, "%s/events.out.tfevents.%lld.%s.%ld.%d", logdir, secs, host, (long)getpid(), n);
    f = fopen(path, "wbx");
    if (!f && errno != EEXIST) break;
  }
  if (!f) {
    ct_status s = ct_error(CT_ERR_IO, "TensorBoard event file %s: cannot create: %s", path, strerror(errno));
    free(path);
    free(w);
    return s;
  }
  w->f = f;
  w->path = path;
  w->last_flush = now_monotonic();

  pb_buf event = {0};
  static const char version[] = "brain.Event:2";
  pb_double(&event, EVENT_WALL_TIME, now_realtime());
  pb_bytes(&event, EVENT_FILE_VERSION, version, sizeof version - 1);
  ct_status s = write_record(w, &event);
  pb_free(&event);
  if (s == CT_OK) s = ct_tb_flush(w);
  if (s != CT_OK) {
    fclose(w->f);
    remove(w->path);
    free(w->path);
    free(w);
    return s;
  }
  *out = w;
  return CT_OK;
}

const char *ct_tb_path(const ct_tb_writer *w) { return w ? w->path : ""; }

static ct_status check_args(const ct_tb_writer *w, const char *tag, const char *fn) {
  if (!w) return ct_error(CT_ERR_INVALID_ARG, "%s: writer is NULL", fn);
  if (!tag || !*tag) return ct_error(CT_ERR_INVALID_ARG, "%s: %s: empty tag", fn, w->path);
  return CT_OK;
}

ct_status ct_tb_scalar(ct_tb_writer *w, const char *tag, int64_t step, double value) {
  CT_TRY(check_args(w, tag, "ct_tb_scalar"));
  pb_buf v = {0};
  pb_bytes(&v, VALUE_TAG, tag, strlen(tag));
  pb_float(&v, VALUE_SIMPLE_VALUE, (float)value);
  ct_status s = write_summary_value(w, step, &v);
  pb_free(&v);
  return s;
}

ct_status ct_tb_text(ct_tb_writer *w, const char *tag, int64_t step, const char *markdown) {
  CT_TRY(check_args(w, tag, "ct_tb_text"));
  if (!markdown) return ct_error(CT_ERR_INVALID_ARG, "ct_tb_text: %s: tag %s: text is NULL", w->path, tag);
  static const char plugin[] = "text";
  pb_buf plugin_data = {0}, metadata = {0}, shape = {0}, tensor = {0}, v = {0};
  pb_bytes(&plugin_data, PLUGIN_DATA_NAME, plugin, sizeof plugin - 1);
  pb_message(&metadata, METADATA_PLUGIN_DATA, &plugin_data);
  pb_key(&tensor, TENSOR_DTYPE, WIRE_VARINT);
  pb_varint(&tensor, DT_STRING);
  pb_message(&tensor, TENSOR_SHAPE, &shape); /* no dims: a scalar string */
  pb_bytes(&tensor, TENSOR_STRING_VAL, markdown, strlen(markdown));
  pb_bytes(&v, VALUE_TAG, tag, strlen(tag));
  pb_message(&v, VALUE_TENSOR, &tensor);
  pb_message(&v, VALUE_METADATA, &metadata);
  ct_status s = write_summary_value(w, step, &v);
  pb_free(&plugin_data);
  pb_free(&metadata);
  pb_free(&shape);
  pb_free(&tensor);
  pb_free(&v);
  return s;
}

ct_status ct_tb_flush(ct_tb_writer *w) {
  if (!w) return ct_error(CT_ERR_INVALID_ARG, "ct_tb_flush: writer is NULL");
  w->last_flush = now_monotonic();
  if (w->failed) return ct_error(CT_ERR_IO, "%s: not written: an earlier write failed", w->path);
  if (fflush(w->f) != 0) return fail(w, "flush", errno);
  w->durable = ftello(w->f);
  return CT_OK;
}

ct_status ct_tb_close(ct_tb_writer *w) {
  if (!w) return CT_OK;
  ct_status s = CT_OK;
  if (!w->failed && fflush(w->f) != 0) s = fail(w, "flush", errno);
  if (fclose(w->f) != 0 && s == CT_OK) s = ct_error(CT_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
  free(w->path);
  free(w);
  return s;
}
