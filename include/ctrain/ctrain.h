/* ctrain: neural-network training in C on CPUs and NVIDIA GPUs.
 * This header includes the whole public API; each concept has its own
 * header with the contracts. */
#ifndef CTRAIN_H
#define CTRAIN_H

#include "ctrain/status.h"
#include "ctrain/dtype.h"
#include "ctrain/tensor.h"
#include "ctrain/rng.h"
#include "ctrain/device.h"
#include "ctrain/model.h"
#include "ctrain/amp.h"
#include "ctrain/loss.h"
#include "ctrain/data.h"
#include "ctrain/atomic_file.h"
#include "ctrain/safetensors.h"
#include "ctrain/optim.h"
#include "ctrain/linreg.h"
#include "ctrain/sched.h"
#include "ctrain/tensorboard.h"
#include "ctrain/history.h"
#include "ctrain/progress.h"
#include "ctrain/step.h"
#include "ctrain/tuning.h"
#include "ctrain/trainer.h"
#include "ctrain/checkpoint.h"
#include "ctrain/dist.h"

#define CTRAIN_VERSION "0.1.0"

#endif
