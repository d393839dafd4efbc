/* The reference backend's ops, one C function per entry of struct
 * ct_backend (see backend/backend_ops.def for each op's contract). Internal: the
 * rest of ctrain reaches them through ct_ref_backend() or through
 * ct_backend_fill_defaults(). Each accepts CT_F32 and CT_F64 tensors (all
 * float tensors of one call share a dtype; targets are CT_I64) and returns
 * CT_ERR_UNSUPPORTED for any other dtype. */
#ifndef CTRAIN_REF_OPS_H
#define CTRAIN_REF_OPS_H

#include "backend/backend.h"

/* PyTorch's pooling output size for one spatial dim:
 * floor_or_ceil((in + 2*pad - dil*(k-1) - 1) / stride) + 1, and with
 * ceil_mode the last window is dropped when it would start at or beyond
 * in + pad (it must start inside the input or the left padding). Returns
 * <= 0 when the window does not fit. */
int64_t ct_ref_pool_out_size(int64_t in, int k, int stride, int pad, int dil, int ceil_mode);

/* ct_ref_<op> for every entry of backend_ops.def, and ct_ref_half_<op>:
 * the same op with bf16/f16 tensors widened to f32 temporaries
 * (ref_half.c; calls without 16-bit tensors go straight to the f32 op).
 * Each is defined where the reference implements it. */
#define CT_OP(rule, ret, name, params) ret ct_ref_##name params; ret ct_ref_half_##name params;
#include "backend/backend_ops.def"
#undef CT_OP

#endif
