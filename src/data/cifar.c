/* CIFAR-10 / CIFAR-100 binary versions
 * (https://www.cs.toronto.edu/~kriz/cifar.html): fixed-size records of the
 * label byte(s) followed by 3072 bytes, the 32x32 red, green and blue planes
 * (already CHW). CIFAR-100 records carry a coarse and a fine label; the fine
 * label (100 classes) is the one used, as torchvision does. */
#include "core/file_open.h"
#include "data/dataset_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CIFAR_PIXELS 3072

static ct_status file_size(const char *path, long long *size) {
  struct stat st;
  if (stat(path, &st) != 0) return ct_error(CT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return ct_error(CT_ERR_IO, "%s: not a regular file", path);
  *size = (long long)st.st_size;
  return CT_OK;
}

/* Finds the folder holding `first` among dir and dir/sub. */
static const char *find_dir(const char *dir, const char *sub, const char *first, char *buf, size_t n) {
  struct stat st;
  snprintf(buf, n, "%s/%s", dir, first);
  if (stat(buf, &st) == 0) return dir;
  snprintf(buf, n, "%s/%s/%s", dir, sub, first);
  if (stat(buf, &st) == 0) {
    snprintf(buf, n, "%s/%s", dir, sub);
    return buf;
  }
  return NULL;
}

ct_status ct_cifar_load(ct_dataset *ds, const char *dir, int train, int hundred) {
  const char *files10[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                           "data_batch_4.bin", "data_batch_5.bin"};
  const char *test10[] = {"test_batch.bin"};
  const char *train100[] = {"train.bin"};
  const char *test100[] = {"test.bin"};
  const char **files = hundred ? (train ? train100 : test100) : (train ? files10 : test10);
  int nfiles = (!hundred && train) ? 5 : 1;
  const char *sub = hundred ? "cifar-100-binary" : "cifar-10-batches-bin";
  const int label_bytes = hundred ? 2 : 1, record = label_bytes + CIFAR_PIXELS;
  const int classes = hundred ? 100 : 10;
  char dirbuf[1024], path[1200];
  const char *base = find_dir(dir, sub, files[0], dirbuf, sizeof dirbuf);
  if (!base)
    return ct_error(CT_ERR_NOT_FOUND,
                    "CIFAR-%d %s split not found: looked for %s/%s and %s/%s/%s; download the binary version "
                    "(cifar-%s.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html) and extract it there",
                    classes, train ? "train" : "test", dir, files[0], dir, sub, files[0],
                    hundred ? "100-binary" : "10-binary");

  long long sizes[5], total = 0;
  for (int i = 0; i < nfiles; i++) {
    snprintf(path, sizeof path, "%s/%s", base, files[i]);
    ct_status s = file_size(path, &sizes[i]);
    if (s != CT_OK) return s;
    if (sizes[i] == 0 || sizes[i] % record)
      return ct_error(CT_ERR_PARSE, "%s: size %lld is not a positive multiple of the %d-byte record (%d label byte%s + %d pixels); truncated or not the binary version?",
                      path, sizes[i], record, label_bytes, hundred ? "s" : "", CIFAR_PIXELS);
    total += sizes[i] / record;
  }
  snprintf(ds->name, sizeof ds->name, "%s", hundred ? "cifar100" : "cifar10");
  ds->classes = classes;
  CT_TRY(ct_dataset_alloc(ds, hundred ? "cifar100" : "cifar10", total, 3, 32, 32));

  uint8_t *rec = malloc((size_t)record);
  if (!rec) return ct_error(CT_ERR_OUT_OF_MEMORY, "cifar: out of memory");
  int64_t at = 0;
  ct_status s = CT_OK;
  for (int i = 0; i < nfiles && s == CT_OK; i++) {
    snprintf(path, sizeof path, "%s/%s", base, files[i]);
    FILE *f;
    s = ct_fopen_regular(path, NULL, "rb", &f);
    if (s != CT_OK) break;
    long long n = sizes[i] / record;
    for (long long r = 0; r < n; r++, at++) {
      if (fread(rec, 1, (size_t)record, f) != (size_t)record) {
        s = ct_error(CT_ERR_IO, "%s: read of record %lld failed: %s", path, r, ferror(f) ? strerror(errno) : "short file");
        break;
      }
      int label = rec[label_bytes - 1];
      if (label >= classes) {
        s = ct_error(CT_ERR_PARSE, "%s: record %lld has %slabel %d, outside [0, %d)", path, r, hundred ? "fine " : "",
                     label, classes);
        break;
      }
      if (hundred && rec[0] >= 20) {
        s = ct_error(CT_ERR_PARSE, "%s: record %lld has coarse label %d, outside [0, 20)", path, r, rec[0]);
        break;
      }
      ds->labels[at] = label;
      memcpy(ds->pixels + (size_t)at * CIFAR_PIXELS, rec + label_bytes, CIFAR_PIXELS);
    }
    fclose(f);
  }
  free(rec);
  return s;
}
