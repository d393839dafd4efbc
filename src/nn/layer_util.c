/* Small helpers shared by the layer classes. */
#include <stdio.h>

#include "nn/layer.h"

const char *ct_layer_input_str(const ct_layer *l, int j, char *buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "[N");
  for (int i = 0; i < l->in_ndim[j] && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, ", %lld", (long long)l->in_shape[j][i]);
  if (off < n) snprintf(buf + off, n - off, "]");
  return buf;
}

ct_status ct_norm_sync_scratch(ct_norm_sync *s, ct_device *dev, size_t bytes, void **out) {
  if (s->scratch && s->dev == dev && s->scratch_bytes >= bytes) {
    *out = s->scratch;
    return CT_OK;
  }
  ct_norm_sync_release(s);
  s->scratch = ct_device_alloc(dev, bytes);
  if (!s->scratch) return ct_error(CT_ERR_OUT_OF_MEMORY, "SyncBatchNorm: cannot allocate %zu bytes of scratch", bytes);
  s->dev = dev, s->scratch_bytes = bytes;
  *out = s->scratch;
  return CT_OK;
}

void ct_norm_sync_release(ct_norm_sync *s) {
  if (s->scratch) ct_device_free(s->dev, s->scratch);
  s->scratch = NULL, s->scratch_bytes = 0;
}
