/* Image-folder datasets: PNG and JPEG files written here with libpng and
 * libjpeg, class/file ordering, channel conversion, resize at load, and
 * errors for odd sizes, undecodable files and unlabeled test classes. */
#include "ctrain/data.h"
#include "test_data_util.h"

#if __has_include(<png.h>) && __has_include(<jpeglib.h>)
#include <png.h>
#include <jpeglib.h>

#include "data/image_decode.h"

#define H 5
#define W 6

static int write_png(const char *path, const uint8_t *hwc, int h, int w, int ch) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = ch == 1 ? PNG_FORMAT_GRAY : ch == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  return png_image_write_to_file(&img, path, 0, hwc, 0, NULL) ? 0 : -1;
}

/* arith: arithmetic coding instead of Huffman (where libjpeg has it). */
static int write_jpeg_coded(const char *path, const uint8_t *hwc, int h, int w, int arith) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 100, TRUE);
  c.arith_code = arith ? TRUE : FALSE;
  for (int i = 0; i < 3; i++) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  jpeg_start_compress(&c, TRUE);
  for (int y = 0; y < h; y++) {
    JSAMPROW row = (JSAMPROW)(hwc + (size_t)y * w * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  fclose(f);
  return 0;
}

static int write_jpeg(const char *path, const uint8_t *hwc, int h, int w) {
  return write_jpeg_coded(path, hwc, h, w, 0);
}

/* HWC -> CHW with the same channel count. */
static void hwc_to_chw(const uint8_t *hwc, int h, int w, int ch, uint8_t *chw) {
  for (int i = 0; i < h * w; i++)
    for (int c = 0; c < ch; c++) chw[c * h * w + i] = hwc[i * ch + c];
}

static int max_diff(const uint8_t *a, const uint8_t *b, size_t n) {
  int m = 0;
  for (size_t i = 0; i < n; i++) {
    int d = abs((int)a[i] - (int)b[i]);
    if (d > m) m = d;
  }
  return m;
}

/* The first cap bytes of train/NAME under dir (0 and a failed check when
 * it cannot be read): the seed files that the damaged copies start from. */
static size_t read_sample(const char *dir, const char *name, uint8_t *buf, size_t cap) {
  char path[1400];
  snprintf(path, sizeof path, "%s/train/%s", dir, name);
  FILE *f = fopen(path, "rb");
  CHECK_MSG(f != NULL, "cannot read %s", path);
  if (!f) return 0;
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

static ct_status open_folder(const char *dir, int train, const ct_dataset_options *o, ct_dataset **ds) {
  char spec[1200];
  snprintf(spec, sizeof spec, "folder:%s", dir);
  *ds = NULL;
  return ct_dataset_open(spec, train, o, ds);
}

int main(void) {
  char dir[1024], p[1400];
  tdata_fresh_dir(dir, sizeof dir, "folder");
  const char *subs[] = {"train", "train/b_cat", "train/a_dog", "test", "test/a_dog"};
  for (int i = 0; i < 5; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
    tdata_mkdir(p);
  }
  uint8_t rgb[H * W * 3], gray[H * W], rgba[H * W * 4], smooth[H * W * 3], rgb_test[H * W * 3];
  tdata_fill(rgb, sizeof rgb, 1);
  tdata_fill(gray, sizeof gray, 2);
  tdata_fill(rgba, sizeof rgba, 3);
  tdata_fill(rgb_test, sizeof rgb_test, 4);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      smooth[(y * W + x) * 3 + 0] = (uint8_t)(60 + 10 * x);
      smooth[(y * W + x) * 3 + 1] = (uint8_t)(100 + 8 * y);
      smooth[(y * W + x) * 3 + 2] = 150;
    }
  /* Sorted order: a_dog/x.jpg, a_dog/y.png, b_cat/1.png, b_cat/2.png. */
  snprintf(p, sizeof p, "%s/train/a_dog/x.jpg", dir);
  CHECK(write_jpeg(p, smooth, H, W) == 0);
  snprintf(p, sizeof p, "%s/train/a_dog/y.png", dir);
  CHECK(write_png(p, rgb, H, W, 3) == 0);
  snprintf(p, sizeof p, "%s/train/b_cat/2.png", dir);
  CHECK(write_png(p, rgba, H, W, 4) == 0);
  snprintf(p, sizeof p, "%s/train/b_cat/1.png", dir);
  CHECK(write_png(p, gray, H, W, 1) == 0);
  snprintf(p, sizeof p, "%s/train/b_cat/notes.txt", dir);
  tdata_write(p, "not an image", 12, 0);
  snprintf(p, sizeof p, "%s/test/a_dog/t.PNG", dir);
  CHECK(write_png(p, rgb_test, H, W, 3) == 0);

  uint8_t want[H * W * 3], rgb_of_rgba[H * W * 3];
  ct_dataset *ds;
  CHECK_OK(open_folder(dir, 1, NULL, &ds));
  if (ds) {
    int c, h, w;
    ct_dataset_shape(ds, &c, &h, &w);
    CHECK(c == 3 && h == H && w == W);
    CHECK(ct_dataset_size(ds) == 4);
    CHECK(ct_dataset_classes(ds) == 2);
    CHECK(ct_dataset_class_name(ds, 0) && strcmp(ct_dataset_class_name(ds, 0), "a_dog") == 0);
    CHECK(ct_dataset_class_name(ds, 1) && strcmp(ct_dataset_class_name(ds, 1), "b_cat") == 0);
    const uint8_t *px;
    int64_t y;
    /* JPEG: lossy even at quality 100, close on a smooth image. */
    CHECK_OK(ct_dataset_sample(ds, 0, &px, &y));
    hwc_to_chw(smooth, H, W, 3, want);
    CHECK(y == 0);
    CHECK_MSG(max_diff(px, want, sizeof want) <= 6, "jpeg differs by %d", max_diff(px, want, sizeof want));
    CHECK_OK(ct_dataset_sample(ds, 1, &px, &y));
    hwc_to_chw(rgb, H, W, 3, want);
    CHECK(y == 0 && memcmp(px, want, sizeof want) == 0);
    /* Grayscale PNG in an RGB dataset: replicated into 3 planes. */
    CHECK_OK(ct_dataset_sample(ds, 2, &px, &y));
    CHECK(y == 1);
    CHECK(memcmp(px, gray, H * W) == 0 && memcmp(px + H * W, gray, H * W) == 0 &&
          memcmp(px + 2 * H * W, gray, H * W) == 0);
    /* RGBA: alpha dropped, colours kept (not composited). */
    CHECK_OK(ct_dataset_sample(ds, 3, &px, &y));
    for (int i = 0; i < H * W; i++)
      for (int k = 0; k < 3; k++) rgb_of_rgba[i * 3 + k] = rgba[i * 4 + k];
    hwc_to_chw(rgb_of_rgba, H, W, 3, want);
    CHECK(y == 1 && memcmp(px, want, sizeof want) == 0);
    ct_dataset_close(ds);
  }
  /* Test split: labels from the train class list. */
  CHECK_OK(open_folder(dir, 0, NULL, &ds));
  if (ds) {
    const uint8_t *px;
    int64_t y;
    CHECK(ct_dataset_size(ds) == 1 && ct_dataset_classes(ds) == 2);
    CHECK_OK(ct_dataset_sample(ds, 0, &px, &y));
    hwc_to_chw(rgb_test, H, W, 3, want);
    CHECK(y == 0 && memcmp(px, want, sizeof want) == 0);
    ct_dataset_close(ds);
  }
  /* Forced grayscale: PIL's convert("L") weights. */
  ct_dataset_options o;
  ct_dataset_options_default(&o);
  o.channels = 1;
  CHECK_OK(open_folder(dir, 1, &o, &ds));
  if (ds) {
    const uint8_t *px;
    int c;
    ct_dataset_shape(ds, &c, NULL, NULL);
    CHECK(c == 1);
    CHECK_OK(ct_dataset_sample(ds, 1, &px, NULL));
    int bad = 0;
    for (int i = 0; i < H * W; i++) {
      const uint8_t *q = rgb + i * 3;
      int l = (q[0] * 299 + q[1] * 587 + q[2] * 114 + 500) / 1000;
      if (abs(l - px[i]) > 1) bad++;
    }
    CHECK_MSG(bad == 0, "%d gray pixels off", bad);
    CHECK_OK(ct_dataset_sample(ds, 2, &px, NULL));
    CHECK(memcmp(px, gray, H * W) == 0);
    ct_dataset_close(ds);
  }
  /* An image of another size: an error naming it, unless resizing. */
  uint8_t flat[4 * 4 * 3];
  for (size_t i = 0; i < sizeof flat; i++) flat[i] = (uint8_t)(i % 3 == 0 ? 200 : i % 3 == 1 ? 17 : 99);
  snprintf(p, sizeof p, "%s/train/b_cat/3.png", dir);
  CHECK(write_png(p, flat, 4, 4, 3) == 0);
  CHECK(open_folder(dir, 1, NULL, &ds) == CT_ERR_SHAPE);
  CHECK_MSG(strstr(ct_last_error(), "b_cat/3.png") && strstr(ct_last_error(), "4x4") &&
                strstr(ct_last_error(), "5x6"),
            "%s", ct_last_error());
  o.channels = 0;
  o.resize_h = 8;
  o.resize_w = 9;
  CHECK_OK(open_folder(dir, 1, &o, &ds));
  if (ds) {
    int c, h, w;
    const uint8_t *px;
    ct_dataset_shape(ds, &c, &h, &w);
    CHECK(c == 3 && h == 8 && w == 9 && ct_dataset_size(ds) == 5);
    CHECK_OK(ct_dataset_sample(ds, 4, &px, NULL));
    int bad = 0;
    for (int i = 0; i < 8 * 9; i++)
      bad += px[i] != 200 || px[72 + i] != 17 || px[144 + i] != 99;
    CHECK_MSG(bad == 0, "resized flat image not flat at %d pixels", bad);
    ct_dataset_close(ds);
  }
  remove(p);
  /* Undecodable: garbage with a PNG name, a truncated PNG, a truncated JPEG. */
  snprintf(p, sizeof p, "%s/train/b_cat/0.png", dir);
  tdata_write(p, "garbage garbage garbage", 23, 0);
  CHECK(open_folder(dir, 1, NULL, &ds) == CT_ERR_PARSE);
  CHECK_MSG(strstr(ct_last_error(), "b_cat/0.png") != NULL, "%s", ct_last_error());
  {
    uint8_t buf[4096];
    size_t n = read_sample(dir, "a_dog/y.png", buf, sizeof buf);
    tdata_write(p, buf, n / 2, 0);
    CHECK(open_folder(dir, 1, NULL, &ds) == CT_ERR_PARSE);
    CHECK_MSG(strstr(ct_last_error(), "b_cat/0.png") != NULL, "%s", ct_last_error());
    remove(p);
    n = read_sample(dir, "a_dog/x.jpg", buf, sizeof buf);
    snprintf(p, sizeof p, "%s/train/b_cat/0.jpg", dir);
    tdata_write(p, buf, n - 40, 0);
    CHECK(open_folder(dir, 1, NULL, &ds) == CT_ERR_PARSE);
    CHECK_MSG(strstr(ct_last_error(), "b_cat/0.jpg") != NULL, "%s", ct_last_error());
    /* A frame header claiming 32774x53765 pixels, as fuzzing made one: the
     * decoder allocated 5 GB for a 300-byte file before reading a pixel;
     * over the pixel limit it is refused first (cut short, so without the
     * limit this fails fast on the missing data, with another message). */
    size_t sof = 2;
    while (sof + 9 < n && !(buf[sof] == 0xff && buf[sof + 1] == 0xc0)) sof++;
    CHECK(sof + 9 < n);
    buf[sof + 5] = 0xd2, buf[sof + 6] = 0x05, buf[sof + 7] = 0x80, buf[sof + 8] = 0x06;
    tdata_write(p, buf, n - 40, 0);
    CHECK(open_folder(dir, 1, NULL, &ds) == CT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(ct_last_error(), "b_cat/0.jpg") && strstr(ct_last_error(), "32774x53765") &&
                  strstr(ct_last_error(), "over the limit"),
              "%s", ct_last_error());
    /* 4000x4000 claimed by a whole file of a few hundred bytes: libjpeg
     * would pad the missing blocks with gray and decode it. */
    buf[sof + 5] = 0x0f, buf[sof + 6] = 0xa0, buf[sof + 7] = 0x0f, buf[sof + 8] = 0xa0;
    tdata_write(p, buf, n, 0);
    CHECK(open_folder(dir, 1, NULL, &ds) == CT_ERR_PARSE);
    CHECK_MSG(strstr(ct_last_error(), "b_cat/0.jpg") && strstr(ct_last_error(), "4000x4000") &&
                  strstr(ct_last_error(), "more than a"),
              "%s", ct_last_error());
    remove(p);
    /* A PNG header claiming 1000000x1000000 pixels (libpng's largest), or
     * 100000x1000 (under the limit) in a 69-byte file: refused before
     * allocating, the second because no deflate stream that short can
     * hold that many rows. The chunk CRC is fixed so libpng reads on. */
    n = read_sample(dir, "a_dog/y.png", buf, sizeof buf);
    snprintf(p, sizeof p, "%s/train/b_cat/0.png", dir);
    const uint32_t claims[2][2] = {{1000000, 1000000}, {100000, 1000}};
    for (int k = 0; k < 2; k++) {
      tdata_be32(buf + 16, claims[k][0]);
      tdata_be32(buf + 20, claims[k][1]);
      tdata_be32(buf + 29, (uint32_t)crc32(0, buf + 12, 17));
      tdata_write(p, buf, 69, 0);
      CHECK(open_folder(dir, 1, NULL, &ds) == (k ? CT_ERR_PARSE : CT_ERR_UNSUPPORTED));
      CHECK_MSG(strstr(ct_last_error(), "b_cat/0.png") &&
                    strstr(ct_last_error(), k ? "100000x1000 (WxH) pixels" : "1000000x1000000") &&
                    strstr(ct_last_error(), k ? "only 69 bytes" : "over the limit"),
                "%s", ct_last_error());
    }
    remove(p);
  }
  /* A test class the train split does not have. */
  snprintf(p, sizeof p, "%s/test/zebra", dir);
  tdata_mkdir(p);
  CHECK(open_folder(dir, 0, NULL, &ds) == CT_ERR_PARSE);
  CHECK_MSG(strstr(ct_last_error(), "zebra") != NULL, "%s", ct_last_error());
  CHECK_OK(open_folder(dir, 1, NULL, &ds));
  ct_dataset_close(ds);
  /* No split: PATH/<class>/ directly. */
  snprintf(p, sizeof p, "%s/train", dir);
  CHECK_OK(open_folder(p, 0, NULL, &ds));
  if (ds) CHECK(ct_dataset_size(ds) == 4 && ct_dataset_classes(ds) == 2);
  ct_dataset_close(ds);
  /* Missing folder and an empty one. */
  CHECK(open_folder("/nonexistent-ctrain-folder", 1, NULL, &ds) == CT_ERR_NOT_FOUND);
  CHECK(strstr(ct_last_error(), "/nonexistent-ctrain-folder") != NULL);
  snprintf(p, sizeof p, "%s/test/zebra", dir);
  CHECK(open_folder(p, 1, NULL, &ds) == CT_ERR_NOT_FOUND);
#if defined(C_ARITH_CODING_SUPPORTED) && defined(D_ARITH_CODING_SUPPORTED)
  {
    /* A flat arithmetic-coded JPEG holds far more than 4096 pixels a byte
     * and is valid: only Huffman-coded ones are held to that. */
    enum { AH = 1000, AW = 1000 };
    uint8_t *flat = malloc((size_t)AH * AW * 3);
    memset(flat, 90, (size_t)AH * AW * 3);
    snprintf(p, sizeof p, "%s/arith.jpg", dir);
    CHECK(write_jpeg_coded(p, flat, AH, AW, 1) == 0);
    uint8_t *px = NULL;
    int h = 0, w = 0, ch = 0;
    CHECK_OK(ct_image_decode(p, &px, &h, &w, &ch));
    CHECK(h == AH && w == AW && ch == 3 && px && abs(px[0] - 90) <= 2 && abs(px[(size_t)AH * AW * 3 - 1] - 90) <= 2);
    FILE *af = fopen(p, "rb");
    fseek(af, 0, SEEK_END);
    CHECK_MSG(ftell(af) * 4096 < AH * AW, "the arithmetic-coded file is %ld bytes: not dense enough to test", ftell(af));
    fclose(af);
    free(px);
    free(flat);
  }
#endif
  tdata_rm_rf(dir);
  return test_summary("test_data_folder");
}
#else
int main(void) {
  printf("test_data_folder: libpng/libjpeg headers absent, skipped\n");
  return 77;
}
#endif
