/* PNG and JPEG decoding into 8-bit pixels for folder datasets. Internal. */
#ifndef CTRAIN_DATA_IMAGE_DECODE_H
#define CTRAIN_DATA_IMAGE_DECODE_H

#include <stdint.h>
#include "ctrain/status.h"

/* Most pixels (height x width) a decoded image may have: PIL's
 * decompression-bomb limit (2 * Image.MAX_IMAGE_PIXELS), beyond which it
 * refuses to open a file. */
#define CT_IMAGE_MAX_PIXELS 178956970ull

/* Decodes the PNG or JPEG file at path (recognised by its signature, not
 * its name) into *pixels, malloc'd, interleaved HWC: *channels is 1 for a
 * grayscale image and 3 for a colour one; alpha is dropped and palettes and
 * 16-bit samples are expanded/reduced to 8-bit, as PIL's convert() does.
 * Fails with CT_ERR_PARSE naming the file for anything undecodable, and
 * CT_ERR_UNSUPPORTED for a format this build lacks, a CMYK JPEG or an image
 * of more than CT_IMAGE_MAX_PIXELS pixels. */
ct_status ct_image_decode(const char *path, uint8_t **pixels, int *h, int *w, int *channels);

#endif
