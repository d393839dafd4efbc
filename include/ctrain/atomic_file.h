/* Atomic file replacement.
 *
 * Checkpoints and weight files are written to a temporary file in the same
 * directory as the target and renamed over it only once every byte is on
 * disk, so a crash, a full disk or a killed job leaves either the old file
 * or the new one, never a torn mix that a later resume would trust.
 *
 * What the path names decides how: a regular file or a path that does not
 * exist yet is replaced atomically; a symlink is followed and its target
 * replaced the same way, in the target's own directory; a character
 * device, a terminal or a FIFO is written through as a stream, never
 * removed or renamed over (/dev/null, /dev/stdout); anything else (a
 * directory, a socket, a block device) is refused with CT_ERR_IO naming
 * what it is.
 */
#ifndef CTRAIN_ATOMIC_FILE_H
#define CTRAIN_ATOMIC_FILE_H

#include <stdio.h>
#include "ctrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_atomic_file ct_atomic_file;

/* Creates "<target>.tmp.<host>.<pid>.<n>" (n counts calls in this
 * process, so two threads writing the same target never share a temp
 * file) in the target's directory and returns a handle whose
 * ct_atomic_file_stream() is open for binary writing; the target itself is
 * not touched until commit. Before that it removes the temp files of this
 * naming that writers on this host which are no longer running (killed)
 * left in that directory. A device or FIFO is opened for writing through
 * instead; a FIFO without a reader fails at once rather than blocking.
 * Fails with CT_ERR_IO naming the path and the errno text. */
ct_status ct_atomic_file_open(const char *path, ct_atomic_file **out);

/* Whether path can be written as ct_atomic_file_open would, before any
 * work is done: refuses the kinds it refuses and, for a file, creates and
 * removes a temp file in the target's directory (a write probe: an
 * unwritable or read-only directory, /proc, fails here). A device or FIFO
 * passes without being opened. */
ct_status ct_atomic_file_check(const char *path);

/* The stdio stream to write the content to. Write errors may be left to
 * commit: it checks the stream's error flag and fails if any write did. */
FILE *ct_atomic_file_stream(ct_atomic_file *f);

/* The temp file's path (for messages and tests). */
const char *ct_atomic_file_temp_path(const ct_atomic_file *f);

/* Flushes the stream, fsyncs the temp file, renames it over the target and
 * fsyncs the directory so the rename itself survives a power loss. Always
 * frees f. On any failure the temp file is removed, the target is left as
 * it was, and CT_ERR_IO names the path, the step that failed and errno.
 * Written through: flushes and closes, failing as the device does
 * (/dev/full: ENOSPC). */
ct_status ct_atomic_file_commit(ct_atomic_file *f);

/* Closes and removes the temp file, leaves the target untouched and frees
 * f. Safe with NULL. Used on every error path after open. */
void ct_atomic_file_abort(ct_atomic_file *f);

#ifdef __cplusplus
}
#endif
#endif
