/* Keras-like progress display for one training epoch.
 *
 *   Epoch 3/10
 *    47/469 [===>..........................] - ETA: 6s - loss: 0.5123 - accuracy: 0.8123 - 9500 img/s
 *   469/469 [==============================] - 7s 15ms/step - loss: 0.4011 - accuracy: 0.8560 - val_loss: 0.3900 - val_accuracy: 0.8610 - 9500 img/s
 *
 * On a terminal the bar is redrawn in place with '\r' at most 10 times per
 * second; on a pipe or file (logs) a plain line is written each time another
 * tenth of the epoch completes, then the final line. Output goes only to
 * the FILE* the caller passes (the CLI passes stdout); the library never
 * picks a stream itself. Metric values print as Keras does: %.4f, or %.4e
 * when |v| <= 1e-3.
 */
#ifndef CTRAIN_PROGRESS_H
#define CTRAIN_PROGRESS_H

#include <stdint.h>
#include <stdio.h>
#include "ctrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_progress ct_progress;

/* Seconds on some monotonic clock; ctx is the pointer given with it. */
typedef double (*ct_progress_clock_fn)(void *ctx);

/* Starts the display of epoch (1-based) of epochs, which has steps steps
 * (> 0): writes "Epoch <epoch>/<epochs>\n" ("Epoch <epoch>\n" when epochs
 * <= 0) to out and starts the epoch timer. is_tty: 1 redraws in place, 0
 * writes plain lines, -1 asks isatty() about out. On success *p must be
 * finished with ct_progress_end or ct_progress_free. CT_ERR_INVALID_ARG for
 * a NULL stream or steps <= 0, CT_ERR_IO if the write fails. */
ct_status ct_progress_begin(FILE *out, int epoch, int epochs, int64_t steps, int is_tty,
                            ct_progress **p);

/* Replaces the time source (default CLOCK_MONOTONIC) and restarts the
 * epoch timer from it; for tests and for replaying recorded timings. */
void ct_progress_set_clock(ct_progress *p, ct_progress_clock_fn now, void *ctx);

/* Reports that step steps (0 <= step <= steps) are done, with the running
 * values of n metrics (names[i] = values[i]) and the current throughput
 * (img_per_s <= 0 leaves it out). Cheap to call every step: it writes only
 * when the bar is due (terminal: 0.1 s since the last redraw; otherwise
 * another tenth of the epoch done, never at the last step, which the final
 * line covers). CT_ERR_INVALID_ARG for a step out of range or NULL arrays
 * with n > 0, CT_ERR_IO if the write fails. */
ct_status ct_progress_update(ct_progress *p, int64_t step, const char *const *names,
                             const double *values, int n, double img_per_s);

/* Writes the final line "<steps>/<steps> [===...] - <s>s <t>/step" with the
 * given n metrics (typically training and validation) and the last reported
 * throughput, ends it with a newline and frees p, also on failure
 * (CT_ERR_IO if the write fails, CT_ERR_INVALID_ARG for NULL arrays). */
ct_status ct_progress_end(ct_progress *p, const char *const *names, const double *values, int n);

/* Writes text and a newline on a line of its own during the epoch: on a
 * terminal an in-place bar is ended first, and the next update draws on
 * the line after. CT_ERR_IO if the write fails. */
ct_status ct_progress_message(ct_progress *p, const char *text);

/* Frees p without a final line, e.g. when an epoch is aborted by an error;
 * on a terminal, an in-place bar on screen is ended with a newline so what
 * is printed next starts on its own line. NULL is a no-op. */
void ct_progress_free(ct_progress *p);

#ifdef __cplusplus
}
#endif
#endif
