/* safetensors files: reading, writing and loading a model's state dict.
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of UTF-8 JSON
 *   {"__metadata__": {"k": "v", ...},            (optional)
 *    "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
 * then the data buffer; offsets are relative to its start, row-major,
 * little-endian. Names are PyTorch state_dict keys, so weights move between
 * ctrain and PyTorch both ways.
 *
 * Files from outside are not trusted: opening validates the whole header
 * (JSON syntax, fields, dtypes, shapes against byte ranges, ranges
 * contiguous and covering the buffer exactly, file size) before anything
 * is read, and every problem is CT_ERR_PARSE with a message naming the
 * file, the key and what was expected.
 */
#ifndef CTRAIN_SAFETENSORS_H
#define CTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "ctrain/status.h"
#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor with its state_dict key. t.data is host memory unless
 * t.device is set (then it is copied through ct_device_copy). */
typedef struct ct_named_tensor {
  const char *name;
  ct_tensor t;
} ct_named_tensor;

typedef struct ct_safetensors ct_safetensors;

/* Opens and validates a file; tensor data stays on disk until read. The
 * header is limited to 100 MB (as in the reference implementation) and
 * tensors to CT_MAX_DIMS dims (more: CT_ERR_UNSUPPORTED). Safetensors
 * dtypes ctrain has no type for (BOOL, I8, U16, F8_*, ...) are
 * CT_ERR_UNSUPPORTED naming the key; strings that are no dtype at all are
 * CT_ERR_PARSE. Missing file: CT_ERR_NOT_FOUND; other open/read failures
 * CT_ERR_IO. */
ct_status ct_safetensors_open(const char *path, ct_safetensors **out);

/* Same validation over a file image in memory (fuzzing, embedded
 * weights). The bytes are borrowed, not copied: they must outlive the
 * handle. `name` labels messages (NULL: "<memory>"). */
ct_status ct_safetensors_open_mem(const void *data, size_t size, const char *name, ct_safetensors **out);

void ct_safetensors_close(ct_safetensors *st);

/* Tensors in data-offset order, which is the order they are stored in. */
size_t ct_safetensors_count(const ct_safetensors *st);

/* Describes tensor i (< count): its key, dtype, ndim and shape (shape must
 * hold CT_MAX_DIMS entries). Any out pointer may be NULL.
 * CT_ERR_INVALID_ARG if i is out of range. */
ct_status ct_safetensors_info(const ct_safetensors *st, size_t i, const char **name, ct_dtype *dtype, int *ndim,
                              int64_t *shape);

/* Index of the tensor named `name`, or -1 if absent. */
long ct_safetensors_find(const ct_safetensors *st, const char *name);

/* Bytes tensor i occupies in the file (numel * dtype size). 0 for bad i. */
size_t ct_safetensors_nbytes(const ct_safetensors *st, size_t i);

/* Copies tensor i's raw bytes (its own dtype) to dst. dst_bytes must equal
 * ct_safetensors_nbytes (CT_ERR_INVALID_ARG otherwise: a size mismatch
 * means the caller's idea of the tensor is wrong). A short read - the file
 * changed since open - is CT_ERR_IO naming the file and key. */
ct_status ct_safetensors_read(const ct_safetensors *st, size_t i, void *dst, size_t dst_bytes);
/* The NaN and +-inf values of tensor i as stored (0 for integer dtypes),
 * read through in 1 MiB pieces. */
ct_status ct_safetensors_count_nonfinite(const ct_safetensors *st, size_t i, size_t *count);

/* Reads tensor i converting to `want`: any of F32, F16, BF16, F64 to any
 * other of them (rounding to nearest even), or the tensor's own dtype.
 * n must equal the tensor's element count. Other conversions are
 * CT_ERR_UNSUPPORTED. Converts in bounded chunks, so no full-size
 * temporary is allocated. */
ct_status ct_safetensors_read_as(const ct_safetensors *st, size_t i, ct_dtype want, void *dst, size_t n);

/* The "__metadata__" value for key, or NULL. Valid until close. */
const char *ct_safetensors_metadata(const ct_safetensors *st, const char *key);
/* Number of metadata entries and the i-th key/value (for listing). */
size_t ct_safetensors_metadata_count(const ct_safetensors *st);
ct_status ct_safetensors_metadata_at(const ct_safetensors *st, size_t i, const char **key, const char **value);

/* Writes n tensors and optional metadata (NULL-terminated array
 * key0, value0, key1, value1, ..., NULL; or NULL) to path, atomically
 * (temp file + fsync + rename): a failed write leaves any existing file
 * intact. The layout matches the reference implementation: data sorted by
 * dtype alignment (largest first) then name, header = compact JSON with
 * "__metadata__" first and keys in data order, padded with spaces to a
 * multiple of 8 bytes, so every tensor starts aligned. Names must be
 * unique, valid UTF-8, non-empty and not "__metadata__"
 * (CT_ERR_INVALID_ARG naming the name otherwise). */
ct_status ct_safetensors_write(const char *path, const ct_named_tensor *tensors, size_t n,
                               const char *const *meta_kv);

/* What ct_safetensors_load_named matched. Lists hold copies of the keys;
 * release with ct_load_report_free (safe on a zeroed report). */
typedef struct ct_load_report {
  size_t n_loaded;      /* dst tensors filled */
  size_t n_converted;   /* of those, read with a dtype conversion */
  size_t n_prefixed;    /* of those, matched through a "module." prefix */
  size_t n_missing;     /* dst names with no key in the file */
  char **missing;
  size_t n_unexpected;  /* file keys no dst name matched */
  char **unexpected;
} ct_load_report;

/* Loads a state dict into n named destination tensors (shapes, dtypes and
 * data pointers set by the caller, e.g. a model's parameter views). Each
 * name matches the file key of the same name, else the key with a
 * leading "module." added or removed (checkpoints saved from
 * DataParallel/DDP wrappers and plain models load into each other). The
 * shape must match exactly: CT_ERR_SHAPE naming key, file shape and
 * expected shape. Float dtypes convert as in ct_safetensors_read_as.
 * strict != 0: any missing or unexpected key is CT_ERR_NOT_FOUND listing
 * them all ("Missing key(s): ... Unexpected key(s): ..."); strict == 0:
 * loads what matches and lists the rest in the report. All keys and
 * shapes are checked before the first byte is copied, so a failed load
 * (other than an I/O error while reading) leaves dst untouched. report
 * may be NULL; when given it is filled on success and on key errors. */
ct_status ct_safetensors_load_named(const char *path, ct_named_tensor *dst, size_t n, int strict,
                                    ct_load_report *report);

void ct_load_report_free(ct_load_report *r);

#ifdef __cplusplus
}
#endif
#endif
