/* PNG via libpng's simplified API, JPEG via libjpeg with a longjmp error
 * manager (libjpeg otherwise exit()s on a corrupt file). */
#include "data/image_decode.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef CTRAIN_HAVE_PNG
#include <png.h>
#endif
#ifdef CTRAIN_HAVE_JPEG
#include <jpeglib.h>
#include <jerror.h>
#endif

#include "core/file_open.h"

#if defined(CTRAIN_HAVE_PNG) || defined(CTRAIN_HAVE_JPEG)
/* A header's size is a claim, and the output is allocated from it before
 * any pixel is decoded: a corrupt header could ask for terabytes. Images
 * over CT_IMAGE_MAX_PIXELS are refused, as PIL refuses decompression
 * bombs. */
static ct_status check_pixels(const char *path, const char *kind, unsigned long long w, unsigned long long h) {
  if (w * h <= CT_IMAGE_MAX_PIXELS) return CT_OK;
  return ct_error(CT_ERR_UNSUPPORTED,
                  "%s: %s header claims %llux%llu (WxH) = %llu pixels, over the limit of %llu pixels (a possible "
                  "decompression bomb; PIL refuses these too): corrupt, or resize the image beforehand",
                  path, kind, w, h, w * h, CT_IMAGE_MAX_PIXELS);
}
#endif

#ifdef CTRAIN_HAVE_PNG
static ct_status decode_png(const char *path, long long file_size, uint8_t **pixels, int *h, int *w, int *channels) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path))
    return ct_error(CT_ERR_PARSE, "%s: cannot decode PNG: %s", path, img.message);
  /* Below the pixel limit a header can still claim far more than the file
   * holds. Every row has a filter byte and every pixel at least one bit,
   * and deflate inflates at most 1032:1, so a file too small for its
   * header is refused before allocating (a valid PNG always passes). */
  unsigned long long least = (unsigned long long)img.height * (1 + ((unsigned long long)img.width + 7) / 8);
  ct_status s = check_pixels(path, "PNG", img.width, img.height);
  if (s == CT_OK && least / 1032 > (unsigned long long)file_size)
    s = ct_error(CT_ERR_PARSE,
                 "%s: PNG header claims %ux%u (WxH) pixels, at least %llu bytes of image data once inflated, but the "
                 "file has only %lld bytes (deflate inflates at most 1032:1): truncated or corrupt",
                 path, img.width, img.height, least, file_size);
  if (s != CT_OK) {
    png_image_free(&img);
    return s;
  }
  int color = (img.format & PNG_FORMAT_FLAG_COLOR) != 0;
  /* Ask for alpha so libpng does not composite onto black; 8-bit output
   * with alpha is not premultiplied, so dropping alpha afterwards keeps the
   * stored colours, which is what PIL's convert("RGB") gives. */
  img.format = color ? PNG_FORMAT_RGBA : PNG_FORMAT_GA;
  int in_ch = color ? 4 : 2, out_ch = color ? 3 : 1;
  size_t npix = (size_t)img.width * img.height;
  uint8_t *buf = malloc(npix * (size_t)in_ch);
  uint8_t *out = buf ? malloc(npix * (size_t)out_ch) : NULL;
  if (!out) {
    free(buf);
    png_image_free(&img);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %ux%u image", path, img.width, img.height);
  }
  if (!png_image_finish_read(&img, NULL, buf, 0, NULL)) {
    free(buf);
    free(out);
    return ct_error(CT_ERR_PARSE, "%s: cannot decode PNG: %s", path, img.message);
  }
  for (size_t i = 0; i < npix; i++)
    for (int k = 0; k < out_ch; k++) out[i * (size_t)out_ch + (size_t)k] = buf[i * (size_t)in_ch + (size_t)k];
  free(buf);
  *pixels = out;
  *h = (int)img.height;
  *w = (int)img.width;
  *channels = out_ch;
  png_image_free(&img);
  return CT_OK;
}
#endif

#ifdef CTRAIN_HAVE_JPEG
typedef struct jpeg_err {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_error_exit(j_common_ptr c) {
  jpeg_err *e = (jpeg_err *)c->err;
  (*c->err->format_message)(c, e->msg);
  longjmp(e->jump, 1);
}

/* Warnings must not print. A file that ends early is an error, as in PIL
 * (libjpeg would pad it with gray); other warnings are tolerated. */
static void jpeg_quiet(j_common_ptr c, int level) {
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) jpeg_error_exit(c);
}

/* Most pixels a JPEG may have per byte of file. A Huffman-coded scan spends
 * at least a bit on every 8x8 block it covers, so real files hold at most
 * 512 pixels a byte (a flat image, progressive); only arithmetic coding or
 * scans that are missing or cut short by a marker (libjpeg pads those with
 * gray) get further. Fuzzing found a 164-byte progressive file that libjpeg
 * decodes to 3594x10498; raised to 13376x13376 (under the pixel limit) it
 * took 1.6 GB and seconds. Such Huffman-coded files are refused up front;
 * arithmetic-coded ones are not (a valid flat one holds 8,000 and more
 * pixels a byte) and only the pixel limit bounds them. */
#define JPEG_MAX_PIXELS_PER_BYTE 4096

static ct_status decode_jpeg(const char *path, long long file_size, uint8_t **pixels, int *h, int *w,
                             int *channels) {
  FILE *f;
  CT_TRY(ct_fopen_regular(path, NULL, "rb", &f));
  struct jpeg_decompress_struct cinfo;
  jpeg_err err;
  /* volatile: modified between setjmp and longjmp. */
  uint8_t *volatile out = NULL;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_quiet;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    fclose(f);
    free(out);
    return ct_error(CT_ERR_PARSE, "%s: cannot decode JPEG: %s", path, err.msg);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, f);
  jpeg_read_header(&cinfo, TRUE);
  ct_status s = check_pixels(path, "JPEG", cinfo.image_width, cinfo.image_height);
  unsigned long long npix = (unsigned long long)cinfo.image_width * cinfo.image_height;
  if (s == CT_OK && !cinfo.arith_code && npix / JPEG_MAX_PIXELS_PER_BYTE > (unsigned long long)file_size)
    s = ct_error(CT_ERR_PARSE,
                 "%s: JPEG header claims %ux%u (WxH) pixels, more than a %lld-byte file can hold (at most %d pixels "
                 "a byte): truncated or corrupt",
                 path, cinfo.image_width, cinfo.image_height, file_size, JPEG_MAX_PIXELS_PER_BYTE);
  if (s == CT_OK && (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK))
    s = ct_error(CT_ERR_UNSUPPORTED, "%s: CMYK JPEG images are not supported; convert it to RGB", path);
  if (s != CT_OK) {
    jpeg_destroy_decompress(&cinfo);
    fclose(f);
    return s;
  }
  int gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  int ch = (int)cinfo.output_components;
  size_t stride = (size_t)cinfo.output_width * (size_t)ch;
  out = malloc(stride * cinfo.output_height);
  if (!out) {
    jpeg_destroy_decompress(&cinfo);
    fclose(f);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %ux%u image", path, cinfo.output_width,
                    cinfo.output_height);
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  *pixels = out;
  *h = (int)cinfo.output_height;
  *w = (int)cinfo.output_width;
  *channels = ch;
  jpeg_destroy_decompress(&cinfo);
  fclose(f);
  return CT_OK;
}
#endif

ct_status ct_image_decode(const char *path, uint8_t **pixels, int *h, int *w, int *channels) {
  *pixels = NULL;
  unsigned char sig[8] = {0};
  FILE *f;
  CT_TRY(ct_fopen_regular(path, NULL, "rb", &f));
  size_t n = fread(sig, 1, sizeof sig, f);
  int read_err = ferror(f);
  struct stat st;
  int stat_err = fstat(fileno(f), &st);
  fclose(f);
  if (read_err || stat_err) return ct_error(CT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
  if (n >= 8 && memcmp(sig, "\x89PNG\r\n\x1a\n", 8) == 0) {
#ifdef CTRAIN_HAVE_PNG
    return decode_png(path, (long long)st.st_size, pixels, h, w, channels);
#else
    return ct_error(CT_ERR_UNSUPPORTED, "%s: PNG support was not built in (libpng not found)", path);
#endif
  }
  if (n >= 3 && sig[0] == 0xFF && sig[1] == 0xD8 && sig[2] == 0xFF) {
#ifdef CTRAIN_HAVE_JPEG
    return decode_jpeg(path, (long long)st.st_size, pixels, h, w, channels);
#else
    return ct_error(CT_ERR_UNSUPPORTED, "%s: JPEG support was not built in (libjpeg not found)", path);
#endif
  }
  return ct_error(CT_ERR_PARSE, "%s: not a PNG or JPEG image (unrecognised signature)", path);
}
