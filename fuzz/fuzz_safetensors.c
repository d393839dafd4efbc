/* libFuzzer target for the safetensors reader (see fuzz/README.md).
 *
 * The body is shared with tests/unit/test_safetensors_mutate.c, which
 * includes this file with CT_FUZZ_BODY_ONLY defined and drives it with a
 * deterministic mutation loop, so gcc builds without libFuzzer still run
 * it in ctest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/safetensors.h"
#include "io/json.h"
#include "fuzz_entry.h"

/* One input: parse it; when it is accepted, exercise every accessor and
 * read (raw and converted) every tensor. Returns 0 if the input was
 * rejected with a status and a non-empty message or accepted and fully
 * readable, -1 on an inconsistency (the fuzzer aborts on it). */
static int ct_fuzz_safetensors_one(const uint8_t *data, size_t size) {
  /* The JSON reader on its own, on the raw bytes. */
  ct_json *j = NULL;
  ct_status js = ct_json_parse((const char *)data, size, "fuzz", NULL, &j);
  if (js != CT_OK && ct_last_error()[0] == 0) return -1;
  ct_json_free(j);

  ct_safetensors *st = NULL;
  ct_status s = ct_safetensors_open_mem(data, size, "fuzz", &st);
  if (s != CT_OK) return (st == NULL && ct_last_error()[0] != 0) ? 0 : -1;
  int rc = 0;
  size_t n = ct_safetensors_count(st);
  for (size_t i = 0; i < n && rc == 0; i++) {
    const char *name;
    ct_dtype dt;
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if (ct_safetensors_info(st, i, &name, &dt, &nd, shape) != CT_OK) rc = -1;
    if (rc || ct_safetensors_find(st, name) != (long)i) {
      rc = -1;
      break;
    }
    size_t nb = ct_safetensors_nbytes(st, i);
    /* Accepted tensors lie inside the input, so nb <= size. */
    if (nb > size) {
      rc = -1;
      break;
    }
    void *buf = malloc(nb ? nb : 1);
    if (ct_safetensors_read(st, i, buf, nb) != CT_OK) rc = -1;
    size_t numel = nb / ct_dtype_size(dt);
    float *f = malloc((numel ? numel : 1) * sizeof *f);
    ct_status cs = ct_safetensors_read_as(st, i, CT_F32, f, numel);
    int is_float = dt == CT_F32 || dt == CT_F16 || dt == CT_BF16 || dt == CT_F64;
    if (is_float ? cs != CT_OK : cs != CT_ERR_UNSUPPORTED) rc = -1;
    free(f);
    free(buf);
  }
  for (size_t i = 0; i < ct_safetensors_metadata_count(st); i++) {
    const char *k, *v;
    if (ct_safetensors_metadata_at(st, i, &k, &v) != CT_OK || ct_safetensors_metadata(st, k) != v) rc = -1;
  }
  ct_safetensors_close(st);
  return rc;
}

CT_FUZZ_ENTRY(ct_fuzz_safetensors_one)
