/* Graph-level fusion done when a model is bound to a device. Internal. */
#ifndef CTRAIN_NN_FUSE_H
#define CTRAIN_NN_FUSE_H

#include "nn/model_impl.h"

/* Folds each ReLU layer into the layer that produces its input when that
 * producer is a conv2d, linear, batchnorm or add whose output nothing else
 * reads and that has no activation yet: the producer gets act = ReLU (a
 * oneDNN post-op for conv/linear, inside the backend's add for an add,
 * inside cuDNN's batch norm where the backend fuses it, batchnorm_act_*;
 * otherwise its backward applies the ReLU gradient in place on its dy
 * using its output), the ReLU's readers are rewired to
 * the producer, and the ReLU layer becomes an inert view of the producer's
 * output (no buffer, no forward or backward work, no gradient). The
 * model's output layer is never folded. Results are the same as unfused to
 * the last bit (ReLU is exact); the summary still lists the layer as ReLU.
 *
 * Then, for a convolution or batch norm whose folded ReLU's output a max
 * pool alone reads (and no add reads the pool's output, whose gradient
 * could be an add's shared one), the ReLU's gradient moves to the pool:
 * the pool masks its output gradient by (its output > 0) before
 * scattering it to the argmaxes, and the producer's backward skips the
 * ReLU. Each window's gradient goes to its argmax, whose ReLU output is
 * the window's maximum, so the producer receives the same masked
 * gradient to the last bit; the planner no longer keeps the producer's
 * output to its backward, only the pool's (a quarter of it or less):
 * AlexNet-227 loses its two largest saved activations (98 + 68 MiB at
 * batch 256, fp16), ResNet-50 its stem's batch-norm output (392 MiB at
 * batch 256, bf16). A batch norm whose backend fuses the ReLU into its
 * forward (cuDNN's BN+ReLU) keeps that forward and runs the plain
 * backward. PyTorch keeps both tensors (ReLU's result, max pool's input).
 *
 * Idempotent: a model already fused is left as it is. Never fails. */
void ct_model_fuse(ct_model *m);

/* Turns the pass on (default) or off for models prepared afterwards, so
 * tests and benchmarks can compare fused and unfused steps. Process-wide.
 * The same switch governs the planner's residual-gradient sharing
 * (exec_plan.c: an add's input gradients that are its output gradient)
 * and its accumulating convolution backward-data. */
void ct_fuse_set_enabled(int on);
int ct_fuse_enabled(void);

/* Turns the ReLU's move to a max pool (above) on (default) or off for
 * models prepared afterwards; process-wide. Off keeps every ReLU output
 * to its producer's backward, as the model runner's --dump-relu needs
 * (it reads them after the forward), and lets a test compare the two. */
void ct_fuse_set_relu_to_pool(int on);

/* 1 if layer l is a ReLU that ct_model_fuse() folded into its producer. */
int ct_layer_is_fused(const ct_layer *l);

#endif
