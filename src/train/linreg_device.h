/* Linear regression on a device: the fused full-batch fit of
 * include/ctrain/linreg.h run by one backend entry (CUDA: a per-step
 * reduction kernel and a one-thread optimizer kernel, every step queued at
 * once). Internal: the benchmark and the tests use it. */
#ifndef CTRAIN_TRAIN_LINREG_DEVICE_H
#define CTRAIN_TRAIN_LINREG_DEVICE_H

#include "ctrain/device.h"
#include "ctrain/linreg.h"

/* ct_linreg_fit on dev: data->x and data->y are device memory of dev
 * (uploaded by the caller, so a timed fit excludes the transfer), params
 * (features + 1 floats) and loss_history (steps doubles, may be NULL) are
 * host memory, read/written around the run. Same math as ct_linreg_fit:
 * double sums, the f32 gradient, the optimizer's f32 element formulas
 * with its scalars rounded on the host per step; the sums' order differs
 * (per-block partials), so results agree to rounding, not bit for bit.
 * Fails with CT_ERR_UNSUPPORTED when dev has no fused linreg kernel or
 * features exceeds CT_LINREG_MAX_FEATURES (16), and as ct_linreg_fit for
 * bad arguments. */
ct_status ct_linreg_fit_device(ct_device *dev, const ct_linreg_data *data, const ct_optim_config *optim,
                               int64_t steps, float *params, double *loss_history);

#endif
