/* IDX (MNIST / Fashion-MNIST) reader: raw and gzipped round trips on
 * random data, and every kind of bad input gets a precise error. */
#include "ctrain/data.h"
#include "test_data_util.h"

#define N_TRAIN 37
#define N_TEST 11
#define ROWS 5
#define COLS 7

static uint8_t train_px[N_TRAIN * ROWS * COLS], train_lab[N_TRAIN];
static uint8_t test_px[N_TEST * ROWS * COLS], test_lab[N_TEST];

static void write_set(const char *dir, int gz) {
  char p[1024];
  const char *z = gz ? ".gz" : "";
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte%s", dir, z);
  tdata_write_idx_images(p, 2051, N_TRAIN, ROWS, COLS, train_px, sizeof train_px, 0, gz);
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte%s", dir, z);
  tdata_write_idx_labels(p, 2049, N_TRAIN, train_lab, sizeof train_lab, 0, gz);
  snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte%s", dir, z);
  tdata_write_idx_images(p, 2051, N_TEST, ROWS, COLS, test_px, sizeof test_px, 0, gz);
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte%s", dir, z);
  tdata_write_idx_labels(p, 2049, N_TEST, test_lab, sizeof test_lab, 0, gz);
}

static void check_equal(ct_dataset *ds, const uint8_t *px, const uint8_t *lab, int n) {
  int c, h, w;
  ct_dataset_shape(ds, &c, &h, &w);
  CHECK(ct_dataset_size(ds) == n);
  CHECK(c == 1 && h == ROWS && w == COLS);
  CHECK(ct_dataset_classes(ds) == 10);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const uint8_t *p;
    int64_t y;
    CHECK_OK(ct_dataset_sample(ds, i, &p, &y));
    if (y != lab[i] || memcmp(p, px + (size_t)i * ROWS * COLS, ROWS * COLS) != 0) bad++;
  }
  CHECK_MSG(bad == 0, "%d samples differ", bad);
}

static void round_trip(const char *dir, int gz) {
  char spec[1100];
  write_set(dir, gz);
  for (int fashion = 0; fashion < 2; fashion++) {
    snprintf(spec, sizeof spec, "%s:%s", fashion ? "fashion-mnist" : "mnist", dir);
    ct_dataset *ds = NULL;
    CHECK_OK(ct_dataset_open(spec, 1, NULL, &ds));
    if (ds) {
      check_equal(ds, train_px, train_lab, N_TRAIN);
      CHECK(strcmp(ct_dataset_name(ds), fashion ? "fashion-mnist" : "mnist") == 0);
      ct_dataset_close(ds);
    }
    ds = NULL;
    CHECK_OK(ct_dataset_open(spec, 0, NULL, &ds));
    if (ds) {
      check_equal(ds, test_px, test_lab, N_TEST);
      ct_dataset_close(ds);
    }
  }
}

/* Opens mnist:dir train and expects status s with every needle in the message. */
static void expect_error(const char *dir, int train, ct_status want, const char *n1, const char *n2, const char *n3) {
  char spec[1100];
  snprintf(spec, sizeof spec, "mnist:%s", dir);
  ct_dataset *ds = NULL;
  ct_status s = ct_dataset_open(spec, train, NULL, &ds);
  const char *m = ct_last_error();
  CHECK_MSG(s == want, "want %s got %s (%s)", ct_status_name(want), ct_status_name(s), m);
  CHECK(ds == NULL);
  const char *needles[3] = {n1, n2, n3};
  for (int i = 0; i < 3; i++)
    if (needles[i]) CHECK_MSG(strstr(m, needles[i]) != NULL, "message '%s' lacks '%s'", m, needles[i]);
  ct_dataset_close(ds);
}

int main(void) {
  tdata_fill(train_px, sizeof train_px, 1);
  tdata_fill(test_px, sizeof test_px, 2);
  for (int i = 0; i < N_TRAIN; i++) train_lab[i] = (uint8_t)((i * 7 + 3) % 10);
  for (int i = 0; i < N_TEST; i++) test_lab[i] = (uint8_t)((i * 3 + 1) % 10);

  char dir[1024], p[1100];
  tdata_fresh_dir(dir, sizeof dir, "idx_raw");
  round_trip(dir, 0);
  tdata_rm_rf(dir);
  tdata_fresh_dir(dir, sizeof dir, "idx_gz");
  round_trip(dir, 1);

  /* Wrong magic: a label file where the images should be. */
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
  tdata_write_idx_images(p, 2049, N_TRAIN, ROWS, COLS, train_px, sizeof train_px, 0, 1);
  expect_error(dir, 1, CT_ERR_PARSE, "train-images-idx3-ubyte.gz", "magic number 2049", "2051");
  /* Truncated pixels, gzipped and raw. */
  tdata_write_idx_images(p, 2051, N_TRAIN, ROWS, COLS, train_px, sizeof train_px, 100, 1);
  expect_error(dir, 1, CT_ERR_PARSE, "train-images-idx3-ubyte.gz", "truncated", NULL);
  remove(p);
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", dir);
  tdata_write_idx_images(p, 2051, N_TRAIN, ROWS, COLS, train_px, sizeof train_px, 1, 0);
  expect_error(dir, 1, CT_ERR_PARSE, "train-images-idx3-ubyte", "truncated", NULL);
  /* Trailing bytes: the header claims fewer images than the file holds. */
  tdata_write_idx_images(p, 2051, N_TRAIN - 1, ROWS, COLS, train_px, sizeof train_px, 0, 0);
  expect_error(dir, 1, CT_ERR_PARSE, "train-images-idx3-ubyte", "bytes after the data", NULL);
  /* Header cut inside itself. */
  tdata_write_idx_images(p, 2051, N_TRAIN, ROWS, COLS, train_px, 0, 6, 0);
  expect_error(dir, 1, CT_ERR_PARSE, "train-images-idx3-ubyte", "header", NULL);
  /* A header claiming far more pixels than the file holds is refused
   * before the dataset is allocated: fuzzing found a 76-byte file (count
   * 0x10000003) that cost a 5 GB allocation. Uncompressed, the file must
   * hold the whole claim; gzipped, it can inflate 1032 times at most. */
  tdata_write_idx_images(p, 2051, 0x10000003u, 4, 5, train_px, 60, 0, 0);
  expect_error(dir, 1, CT_ERR_PARSE, "268435459 images of 4x5 (5368709180 bytes", "holds only 60 bytes", NULL);
  tdata_write_idx_images(p, 2051, 1u << 20, 1000, 1000, train_px, 60, 0, 1);
  expect_error(dir, 1, CT_ERR_PARSE, "train-images-idx3-ubyte: truncated", "claims 1048576 images of 1000x1000",
               "at most 1032");
  tdata_write_idx_images(p, 2051, N_TRAIN, ROWS, COLS, train_px, sizeof train_px, 0, 0);
  /* Count mismatch between images and labels. */
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", dir);
  tdata_write_idx_labels(p, 2049, N_TRAIN - 1, train_lab, N_TRAIN - 1, 0, 1);
  expect_error(dir, 1, CT_ERR_PARSE, "train-labels-idx1-ubyte.gz", "36 labels", "37 images");
  /* Truncated labels. */
  tdata_write_idx_labels(p, 2049, N_TRAIN, train_lab, N_TRAIN, 5, 1);
  expect_error(dir, 1, CT_ERR_PARSE, "train-labels-idx1-ubyte.gz", "truncated", NULL);
  /* Wrong label magic. */
  tdata_write_idx_labels(p, 2051, N_TRAIN, train_lab, N_TRAIN, 0, 1);
  expect_error(dir, 1, CT_ERR_PARSE, "train-labels-idx1-ubyte.gz", "magic number 2051", "2049");
  /* Label out of range. */
  uint8_t bad_lab[N_TRAIN];
  memcpy(bad_lab, train_lab, sizeof bad_lab);
  bad_lab[17] = 10;
  tdata_write_idx_labels(p, 2049, N_TRAIN, bad_lab, N_TRAIN, 0, 1);
  expect_error(dir, 1, CT_ERR_PARSE, "label 10 of item 17", "train-labels-idx1-ubyte.gz", NULL);
  tdata_write_idx_labels(p, 2049, N_TRAIN, train_lab, N_TRAIN, 0, 1);
  /* Raw file preferred over .gz when both exist; both must load the same. */
  {
    char spec[1100];
    snprintf(spec, sizeof spec, "mnist:%s", dir);
    ct_dataset *ds = NULL;
    CHECK_OK(ct_dataset_open(spec, 1, NULL, &ds));
    if (ds) check_equal(ds, train_px, train_lab, N_TRAIN);
    ct_dataset_close(ds);
  }
  /* Unreadable file (a folder in its place: root can read any mode bits). */
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte.gz", dir);
  remove(p);
  tdata_mkdir(p);
  expect_error(dir, 0, CT_ERR_IO, "t10k-labels-idx1-ubyte.gz", NULL, NULL);

  /* Missing dataset: every path tried is named, plus how to get it. */
  char missing[1100];
  snprintf(missing, sizeof missing, "%s/nothing-here", dir);
  expect_error(missing, 1, CT_ERR_NOT_FOUND, "nothing-here/train-images-idx3-ubyte,", "train-labels-idx1-ubyte.gz",
               "download");
  {
    char spec[1200];
    snprintf(spec, sizeof spec, "fashion-mnist:%s", missing);
    ct_dataset *ds = NULL;
    CHECK(ct_dataset_open(spec, 0, NULL, &ds) == CT_ERR_NOT_FOUND);
    const char *m = ct_last_error();
    CHECK_MSG(strstr(m, "t10k-images-idx3-ubyte.gz") && strstr(m, "t10k-labels-idx1-ubyte,") &&
                  strstr(m, "apt-get install dataset-fashion-mnist"),
              "message: %s", m);
  }
  /* Bad spec kinds. */
  {
    ct_dataset *ds = NULL;
    CHECK(ct_dataset_open("imagenet:/x", 1, NULL, &ds) == CT_ERR_INVALID_ARG);
    CHECK(strstr(ct_last_error(), "imagenet") != NULL);
    CHECK(ct_dataset_open("mnist", 1, NULL, &ds) == CT_ERR_INVALID_ARG);
  }
  tdata_rm_rf(dir);
  return test_summary("test_data_idx");
}
