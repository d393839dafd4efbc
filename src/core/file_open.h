/* Opening a file for reading without ever blocking in open(): O_NONBLOCK
 * (a FIFO with no writer would wait forever), then anything but a regular
 * file is refused (a FIFO, a device or a directory named where a dataset
 * file, an image, a model file or a checkpoint belongs), and the
 * descriptor is made blocking again for the reads. Internal. */
#ifndef CTRAIN_CORE_FILE_OPEN_H
#define CTRAIN_CORE_FILE_OPEN_H

#include <stdio.h>

#include "ctrain/status.h"

/* The descriptor in *fd, or the error recorded: CT_ERR_NOT_FOUND for a
 * missing file, CT_ERR_IO otherwise, as "<path>: cannot open[ what]:
 * <reason>" or "<path>: is a FIFO; expected a regular file". what: NULL,
 * or the kind of file for the message ("model file"). */
ct_status ct_open_regular(const char *path, const char *what, int *fd);
/* The same as a stdio stream opened with mode ("rb", "r"). */
ct_status ct_fopen_regular(const char *path, const char *what, const char *mode, FILE **f);

#endif
