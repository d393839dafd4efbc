/* PNG and JPEG decoding into 8-bit pixels for folder datasets. Internal. */
#ifndef CTRAIN_DATA_IMAGE_DECODE_H
#define CTRAIN_DATA_IMAGE_DECODE_H

#include <stdint.h>
#include "ctrain/data.h"

/* (declared in ctrain/data.h: CT_IMAGE_MAX_PIXELS, ct_image_decode) */

#endif
