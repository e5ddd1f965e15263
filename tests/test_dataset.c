/*
 * Data sets (src/dataset.c): loaded from IDX files (pixels scaled, classes
 * counted, bad labels and images refused), found in an MNIST-style
 * directory, Fashion-MNIST itself, made from memory, and split.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "castor.h"
#include "src/dataset.h"
#include "src/util.h"
#include "support.h"

TestSuite(dataset, .init = support_dir_init, .fini = support_dir_fini);

/* ---- the dataset from IDX files ------------------------------------------- */

static const char *write_labels(char *path, const char *name, int type, const void *payload,
                                uint32_t count, size_t payload_len)
{
    unsigned char buf[256];
    uint32_t dims[1] = {count};
    size_t len = support_idx_build(buf, type, 1, dims, payload, payload_len);
    return support_write_in(path, name, buf, len);
}

Test(dataset, load_idx_scales_pixels_and_counts_classes)
{
    unsigned char img[256];
    uint32_t idims[3] = {4, 2, 2};
    size_t ilen = support_idx_build_ubyte(img, 3, idims, 16);
    img[ilen - 1] = 255;
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    support_write_gz_in(ip, "img.gz", img, ilen);
    unsigned char labels[4] = {3, 0, 6, 1};
    write_labels(lp, "lab", 0x08, labels, 4, 4);
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_load_idx(&ds, ip, lp), CASTOR_OK, "%s", castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_size(ds), 4);
    cr_assert_eq(castor_dataset_features(ds), 4);
    cr_assert_eq(ds->num_classes, 7);
    const float *x = castor_dataset_x(ds);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(x[i], (float)img[ilen - 16 + (size_t)i] / 255.0f, "pixel %d", i);
    cr_assert_eq(x[15], 1.0f);
    cr_assert_eq(x[0], 0.0f);
    const int32_t *y = castor_dataset_labels(ds);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(y[i], labels[i]);
    cr_assert_null(ds->targets);
    castor_dataset_free(ds);
}

/* The command line compares a test set's shape and element type with the
 * training set's: the loader keeps them, a split's tail carries them, and
 * a set made from memory has none. */
Test(dataset, sample_shape_and_type_are_kept)
{
    unsigned char img[256];
    uint32_t idims[3] = {4, 2, 3};
    size_t ilen = support_idx_build_ubyte(img, 3, idims, 24);
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    support_write_in(ip, "img-2x3", img, ilen);
    unsigned char labels[4] = {0, 1, 2, 1};
    write_labels(lp, "lab-2x3", 0x08, labels, 4, 4);
    castor_dataset *ds = NULL, *tail = NULL, *mem = NULL;
    cr_assert_eq(castor_dataset_load_idx(&ds, ip, lp), CASTOR_OK, "%s", castor_dataset_errmsg(ds));
    uint32_t dims[3] = {0, 0, 0};
    int type = -1;
    cr_assert_eq(castor__dataset_sample_shape(ds, dims, &type), 2);
    cr_assert(dims[0] == 2 && dims[1] == 3 && type == 0x08, "%ux%u, type %d", dims[0], dims[1],
              type);
    cr_assert_eq(castor_dataset_split_tail(ds, 1, &tail), CASTOR_OK);
    memset(dims, 0, sizeof dims);
    cr_assert_eq(castor__dataset_sample_shape(tail, dims, &type), 2);
    cr_assert(dims[0] == 2 && dims[1] == 3 && type == 0x08, "the tail: %ux%u, type %d", dims[0],
              dims[1], type);
    const int32_t y[1] = {0};
    cr_assert_eq(castor_dataset_from_memory(&mem, castor_dataset_x(ds), 1, 6, y, NULL, 0),
                 CASTOR_OK);
    cr_assert_eq(castor__dataset_sample_shape(mem, dims, &type), 0);
    cr_assert_eq(type, 0);
    castor_dataset_free(ds);
    castor_dataset_free(tail);
    castor_dataset_free(mem);
}

Test(dataset, load_idx_keeps_other_types_unscaled)
{
    unsigned char img[256];
    uint32_t idims[2] = {2, 2};
    const unsigned char f32[16] = {0x3F, 0xC0, 0, 0, 0xC2, 0x28, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0};
    size_t ilen = support_idx_build(img, 0x0D, 2, idims, f32, sizeof f32);
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    support_write_in(ip, "img-f32", img, ilen);
    /* Labels as int32 are fine too. */
    const unsigned char lab32[8] = {0, 0, 0, 1, 0, 0, 0, 9};
    write_labels(lp, "lab-i32", 0x0C, lab32, 2, sizeof lab32);
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_load_idx(&ds, ip, lp), CASTOR_OK, "%s", castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_x(ds)[0], 1.5f);
    cr_assert_eq(castor_dataset_x(ds)[1], -42.0f);
    cr_assert_eq(castor_dataset_x(ds)[3], 2.0f);
    cr_assert_eq(castor_dataset_labels(ds)[1], 9);
    cr_assert_eq(ds->num_classes, 10);
    castor_dataset_free(ds);
}

/* 2^24 - 1, the largest label a float carries exactly, is a class like any
 * other: the bound is inclusive. */
Test(dataset, load_idx_takes_the_largest_label)
{
    unsigned char img[64];
    uint32_t idims[2] = {2, 1};
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    support_write_in(ip, "img", img, support_idx_build_ubyte(img, 2, idims, 2));
    const unsigned char lab32[8] = {0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF};
    write_labels(lp, "lab-max", 0x0C, lab32, 2, sizeof lab32);
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_load_idx(&ds, ip, lp), CASTOR_OK, "%s", castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_labels(ds)[1], (1 << 24) - 1);
    cr_assert_eq(ds->num_classes, 1 << 24);
    castor_dataset_free(ds);
}

/* load_idx must fail with `code`, a one-line message naming `names_path`
 * and saying `words`, and still hand out a handle that holds no data. */
static void expect_load_error(const char *ip, const char *lp, int code, const char *names_path,
                              const char *words)
{
    castor_dataset *ds = NULL;
    int rc = castor_dataset_load_idx(&ds, ip, lp);
    const char *msg = castor_dataset_errmsg(ds);
    cr_assert_eq(rc, code, "got %d: %s", rc, msg);
    cr_assert_not_null(ds, "the handle comes out on failure too");
    cr_assert(strstr(msg, names_path), "message names %s: %s", names_path, msg);
    cr_assert(strstr(msg, words), "message says '%s': %s", words, msg);
    cr_assert_null(strchr(msg, '\n'), "one line: %s", msg);
    cr_assert_eq(castor_dataset_size(ds), 0);
    cr_assert_null(castor_dataset_x(ds));
    cr_assert_null(castor_dataset_labels(ds));
    castor_dataset_free(ds);
}

Test(dataset, load_idx_rejects_bad_labels_and_images)
{
    unsigned char img[256];
    uint32_t idims[3] = {4, 2, 2};
    size_t ilen = support_idx_build_ubyte(img, 3, idims, 16);
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    support_write_in(ip, "img", img, ilen);
    const unsigned char four[4] = {1, 2, 3, 4};

    write_labels(lp, "three", 0x08, four, 3, 3);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "3 labels for the 4 images");
    cr_assert(strstr(lp, "three"));
    write_labels(lp, "five", 0x08, (const unsigned char[5]){1, 2, 3, 4, 5}, 5, 5);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "5 labels for the 4 images");

    unsigned char lab2[64];
    uint32_t ldims[2] = {2, 2};
    support_write_in(lp, "rank2", lab2, support_idx_build(lab2, 0x08, 2, ldims, four, 4));
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "1 dimension");

    write_labels(lp, "negative", 0x09, (const unsigned char[4]){1, 0xFF, 2, 3}, 4, 4);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "sample 1's label is -1");

    /* 1.5f, 0, 0, 0 */
    const unsigned char half[16] = {0x3F, 0xC0, 0, 0};
    write_labels(lp, "fraction", 0x0D, half, 4, sizeof half);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "sample 0's label is 1.5");

    /* 2^24 + 1 would round to 2^24 on the way through float: refused. */
    const unsigned char big[16] = {0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0x01, 0, 0, 0x01};
    write_labels(lp, "too-big", 0x0C, big, 4, sizeof big);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "sample 3's label is");
    /* Labels 0, 1, 2, 3 written little-endian, as numpy's tofile writes
     * them on x86: 1 reads as 16777216, which the message showed as
     * 1.67772e+07, with no word of the byte order. */
    const unsigned char le[16] = {0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0};
    write_labels(lp, "little-endian", 0x0C, le, 4, sizeof le);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp,
                      "sample 1's label is 16777216, not a class number 0..");
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "IDX numbers are big-endian");

    write_labels(lp, "good", 0x08, four, 4, 4);
    unsigned char img1[64];
    uint32_t one_dim[1] = {4};
    char ip1[SUPPORT_PATH_LEN];
    support_write_in(ip1, "img-rank1", img1, support_idx_build_ubyte(img1, 1, one_dim, 4));
    expect_load_error(ip1, lp, CASTOR_FORMAT, ip1, "2 dimensions");

    /* A NaN pixel in a float file, its sign bit set (as 0/0 makes it on
     * x86): "nan", not "-nan", which reads as a value. */
    unsigned char imgf[128];
    unsigned char f32[16] = {0};
    f32[8] = 0xFF;
    f32[9] = 0xC0;
    uint32_t fdims[2] = {4, 1};
    char ipf[SUPPORT_PATH_LEN];
    size_t flen = support_idx_build(imgf, 0x0D, 2, fdims, f32, sizeof f32);
    support_write_in(ipf, "img-nan", imgf, flen);
    expect_load_error(ipf, lp, CASTOR_FORMAT, ipf, "sample 2, value 0 is nan, not a finite");
    /* And an infinity in a float64 file: the other type that can hold one. */
    unsigned char f64[32] = {0};
    f64[8] = 0x7F;
    f64[9] = 0xF0;
    flen = support_idx_build(imgf, 0x0E, 2, fdims, f64, sizeof f64);
    support_write_in(ipf, "img-inf64", imgf, flen);
    expect_load_error(ipf, lp, CASTOR_FORMAT, ipf, "sample 1, value 0 is inf");
    /* A finite float64 past float32's range is inf only once converted:
     * the message said "is inf" of a value the file holds as 1e300. */
    const unsigned char e300[8] = {0x7E, 0x37, 0xE4, 0x3C, 0x88, 0x00, 0x75, 0x9C};
    memcpy(f64 + 8, e300, sizeof e300);
    flen = support_idx_build(imgf, 0x0E, 2, fdims, f64, sizeof f64);
    support_write_in(ipf, "img-1e300", imgf, flen);
    expect_load_error(ipf, lp, CASTOR_FORMAT, ipf,
                      "sample 1, value 0 is inf as float32, not a finite number (a float64 value "
                      "past +-3.4e38 becomes inf in castor's float32)");

    /* The reader's own errors come through with the right file named. */
    char missing[SUPPORT_PATH_LEN];
    support_path_in(missing, "missing-labels");
    expect_load_error(ip, missing, CASTOR_IO, missing, "No such file");
    support_path_in(missing, "missing-images");
    expect_load_error(missing, lp, CASTOR_IO, missing, "No such file");
    char trunc[SUPPORT_PATH_LEN];
    support_write_in(trunc, "trunc-img", img, ilen - 1);
    expect_load_error(trunc, lp, CASTOR_FORMAT, trunc, "truncated");

    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_load_idx(&ds, NULL, lp), CASTOR_MISUSE);
    cr_assert(strstr(castor_dataset_errmsg(ds), "images"), "%s", castor_dataset_errmsg(ds));
    castor_dataset_free(ds);
    cr_assert_eq(castor_dataset_load_idx(NULL, ip, lp), CASTOR_MISUSE);
}

/* A 2-image (or 3-image) MNIST-style pair named for `prefix` in support_dir. */
static void write_mnist_pair(const char *prefix, uint32_t n, int gz)
{
    unsigned char img[256], lab[64];
    uint32_t idims[3] = {n, 2, 2}, ldims[1] = {n};
    size_t ilen = support_idx_build_ubyte(img, 3, idims, 4 * n);
    size_t llen = support_idx_build_ubyte(lab, 1, ldims, n);
    for (uint32_t i = 0; i < n; i++)
        lab[llen - n + i] = (unsigned char)i;
    char name[64], path[SUPPORT_PATH_LEN];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
    gz ? support_write_gz_in(path, name, img, ilen) : support_write_in(path, name, img, ilen);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
    gz ? support_write_gz_in(path, name, lab, llen) : support_write_in(path, name, lab, llen);
}

/* A sample of more features than a model takes (CASTOR_MAX_UNITS) is
 * refused from the header: a 2 MB gzip of 1 x 65536 x 32768 zero bytes was
 * inflated and held as 8 GiB of floats before its 2^31 features per sample
 * were refused (under a 4 GB address-space limit the message was "out of
 * memory for 1073741824 values"), and one of 2 x 2^30 bytes took 4.3 GB
 * before the model refused its width. Here the header alone: no data
 * follows it. */
Test(dataset, load_idx_refuses_too_wide_samples_before_reading_them)
{
    static const uint32_t dims[][3] = {{1, 65536, 32768}, {2, 4097, 4096}};
    static const char *const want[] = {
        "2147483648 features per sample, more than a model takes (16777216)",
        "16781312 features per sample, more than a model takes (16777216)",
    };
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    write_labels(lp, "two", 0x08, (const unsigned char[2]){0, 1}, 2, 2);
    for (int k = 0; k < 2; k++) {
        unsigned char img[64];
        size_t ilen = support_idx_build(img, 0x08, 3, dims[k], NULL, 0);
        support_write_gz_in(ip, "wide.gz", img, ilen);
        expect_load_error(ip, lp, CASTOR_FORMAT, ip, want[k]);
        support_write_in(ip, "wide", img, ilen);
        expect_load_error(ip, lp, CASTOR_FORMAT, ip, want[k]);
    }
}

/* The bound is CASTOR_MAX_UNITS itself: a feature more is refused from the
 * header, as many as that pass it (and this header-only file is then
 * refused for its missing data, not its width). */
Test(dataset, load_idx_width_bound_is_max_units)
{
    static const uint32_t over[2] = {1, CASTOR_MAX_UNITS + 1}, at[2] = {1, CASTOR_MAX_UNITS};
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    unsigned char img[64];
    write_labels(lp, "one", 0x08, (const unsigned char[1]){0}, 1, 1);
    support_write_in(ip, "over", img, support_idx_build(img, 0x08, 2, over, NULL, 0));
    expect_load_error(ip, lp, CASTOR_FORMAT, ip,
                      "16777217 features per sample, more than a model takes (16777216)");
    support_write_in(ip, "at", img, support_idx_build(img, 0x08, 2, at, NULL, 0));
    expect_load_error(ip, lp, CASTOR_FORMAT, ip, "truncated");
}

Test(dataset, mnist_dir_finds_plain_or_gzip)
{
    castor_dataset *ds = NULL;
    /* Nothing there yet: both names in the message, with the directory. */
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "train"), CASTOR_IO);
    const char *msg = castor_dataset_errmsg(ds);
    cr_assert(strstr(msg, support_dir) && strstr(msg, "train-images-idx3-ubyte") &&
                  strstr(msg, "train-labels-idx1-ubyte"),
              "%s", msg);
    castor_dataset_free(ds);

    write_mnist_pair("t10k", 3, 1);
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "test"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_size(ds), 3);
    castor_dataset_free(ds);
    /* With both present the plain file wins. */
    write_mnist_pair("t10k", 2, 0);
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "test"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_size(ds), 2);
    castor_dataset_free(ds);
    /* The set's name in any case, as castor.h's other names ("Test" was
     * CASTOR_INVALID). */
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "Test"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_size(ds), 2);
    castor_dataset_free(ds);

    /* Only the labels missing: only they are named. */
    char path[SUPPORT_PATH_LEN];
    support_write_in(path, "train-images-idx3-ubyte", "", 0);
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "train"), CASTOR_IO);
    msg = castor_dataset_errmsg(ds);
    cr_assert(strstr(msg, "train-labels-idx1-ubyte") && !strstr(msg, "train-images"), "%s", msg);
    castor_dataset_free(ds);
    /* A directory given with a trailing slash: no '//' in the file's path
     * when the (empty) file is refused. */
    support_write_in(path, "train-labels-idx1-ubyte", "", 0);
    char slash[SUPPORT_PATH_LEN + 1];
    snprintf(slash, sizeof slash, "%s/", support_dir);
    cr_assert_neq(castor_dataset_load_mnist_dir(&ds, slash, "train"), CASTOR_OK);
    msg = castor_dataset_errmsg(ds);
    cr_assert(strstr(msg, "-idx") && !strstr(msg, "//"), "%s", msg);
    castor_dataset_free(ds);

    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "validation"), CASTOR_INVALID);
    cr_assert(strstr(castor_dataset_errmsg(ds), "validation"), "%s", castor_dataset_errmsg(ds));
    castor_dataset_free(ds);
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, NULL, "train"), CASTOR_MISUSE);
    castor_dataset_free(ds);
    cr_assert_eq(castor_dataset_load_mnist_dir(NULL, support_dir, "train"), CASTOR_MISUSE);
}

Test(dataset, fashion_mnist)
{
    const char *fm = support_fashion_dir();
    if (!fm)
        cr_skip_test("Fashion-MNIST missing: install the Debian package dataset-fashion-mnist");
    castor_dataset *train = NULL, *test = NULL;
    cr_assert_eq(castor_dataset_load_mnist_dir(&train, fm, "train"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(train));
    cr_assert_eq(castor_dataset_load_mnist_dir(&test, fm, "test"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(test));
    cr_assert_eq(castor_dataset_size(train), 60000);
    cr_assert_eq(castor_dataset_size(test), 10000);
    cr_assert_eq(castor_dataset_features(train), 784);
    cr_assert_eq(castor_dataset_features(test), 784);
    cr_assert_eq(train->num_classes, 10);
    const float *x = castor_dataset_x(train);
    float lo = 1, hi = 0;
    for (size_t i = 0; i < 60000u * 784u; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    cr_assert(lo == 0.0f && hi == 1.0f, "pixels in [%g, %g]", (double)lo, (double)hi);
    const int32_t *y = castor_dataset_labels(test);
    int counts[10] = {0};
    for (int i = 0; i < 10000; i++) {
        cr_assert(y[i] >= 0 && y[i] < 10, "test label %d is %d", i, y[i]);
        counts[y[i]]++;
    }
    for (int c = 0; c < 10; c++)
        cr_assert_eq(counts[c], 1000, "class %d has %d test samples", c, counts[c]);
    y = castor_dataset_labels(train);
    for (int i = 0; i < 60000; i++)
        cr_assert(y[i] >= 0 && y[i] < 10, "train label %d is %d", i, y[i]);
    castor_dataset_free(train);
    castor_dataset_free(test);
}

/* ---- the dataset from memory, and splitting -------------------------------- */

Test(dataset, from_memory_validates_and_copies)
{
    float x[6] = {1, 2, 3, 4, 5, 6};
    int32_t y[3] = {0, 2, 1};
    float t[3] = {0.5f, 1.5f, 2.5f};
    castor_dataset *ds = NULL;
    struct {
        const float *x;
        size_t n;
        int features;
        const int32_t *labels;
        const float *targets;
        int target_dim;
        const char *words;
    } bad[] = {
        {x, 0, 2, y, NULL, 0, "n > 0"},
        {x, 3, 0, y, NULL, 0, "features > 0"},
        {x, 3, -1, y, NULL, 0, "features > 0"},
        {x, 3, 2, NULL, NULL, 0, "exactly one"},
        {x, 3, 2, y, t, 1, "exactly one"},
        {x, 3, 2, NULL, t, 0, "target_dim"},
        {x, 3, 2, (const int32_t[3]){0, -1, 1}, NULL, 0, "sample 1's label is -1"},
        {x, 3, 2, (const int32_t[3]){0, 1, INT32_MAX}, NULL, 0, "sample 2's label is 2147483647"},
        {x, SIZE_MAX / 2, 2, y, NULL, 0, "too many"},
        {x, 1, CASTOR_MAX_UNITS + 1, y, NULL, 0, "more than a model takes (16777216)"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int rc = castor_dataset_from_memory(&ds, bad[k].x, bad[k].n, bad[k].features,
                                            bad[k].labels, bad[k].targets, bad[k].target_dim);
        cr_assert_eq(rc, CASTOR_INVALID, "case %zu: %d", k, rc);
        cr_assert(strstr(castor_dataset_errmsg(ds), bad[k].words), "case %zu: %s", k,
                  castor_dataset_errmsg(ds));
        cr_assert_eq(castor_dataset_size(ds), 0);
        castor_dataset_free(ds);
    }
    cr_assert_eq(castor_dataset_from_memory(NULL, x, 3, 2, y, NULL, 0), CASTOR_MISUSE);
    /* A NULL pointer argument is a misuse, as castor.h says (it was INVALID). */
    cr_assert_eq(castor_dataset_from_memory(&ds, NULL, 3, 2, y, NULL, 0), CASTOR_MISUSE);
    cr_assert(strstr(castor_dataset_errmsg(ds), "x is NULL"), "%s", castor_dataset_errmsg(ds));
    castor_dataset_free(ds);

    cr_assert_eq(castor_dataset_from_memory(&ds, x, 3, 2, y, NULL, 0), CASTOR_OK);
    x[0] = 99;
    y[0] = 7;
    cr_assert_eq(castor_dataset_x(ds)[0], 1.0f, "x is copied");
    cr_assert_eq(castor_dataset_labels(ds)[0], 0, "labels are copied");
    cr_assert_eq(ds->num_classes, 3);
    cr_assert_str_eq(castor_dataset_errmsg(ds), "no error");
    castor_dataset_free(ds);

    cr_assert_eq(castor_dataset_from_memory(&ds, x, 3, 2, NULL, t, 1), CASTOR_OK);
    cr_assert_null(castor_dataset_labels(ds));
    cr_assert_eq(ds->targets[2], 2.5f);
    cr_assert_eq(ds->target_dim, 1);
    cr_assert_eq(ds->num_classes, 0);
    castor_dataset_free(ds);

    /* NULL handles: no crash, empty answers, a static message. */
    castor_dataset_free(NULL);
    cr_assert_eq(castor_dataset_size(NULL), 0);
    cr_assert_eq(castor_dataset_features(NULL), 0);
    cr_assert_null(castor_dataset_x(NULL));
    cr_assert_null(castor_dataset_labels(NULL));
    cr_assert(strstr(castor_dataset_errmsg(NULL), "out of memory"));
}

Test(dataset, split_tail)
{
    float x[10 * 3];
    for (int i = 0; i < 30; i++)
        x[i] = (float)i;
    /* Class 5 only in the head. */
    const int32_t y[10] = {0, 1, 5, 0, 1, 2, 0, 1, 2, 0};
    castor_dataset *ds = NULL, *tail = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, x, 10, 3, y, NULL, 0), CASTOR_OK);
    cr_assert_eq(castor_dataset_split_tail(ds, 0, &tail), CASTOR_INVALID);
    cr_assert_null(tail);
    cr_assert_eq(castor_dataset_split_tail(ds, 10, &tail), CASTOR_INVALID);
    cr_assert(strstr(castor_dataset_errmsg(ds), "split_tail"), "%s", castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_split_tail(ds, 11, &tail), CASTOR_INVALID);
    cr_assert_eq(castor_dataset_split_tail(ds, 3, NULL), CASTOR_MISUSE);
    cr_assert_eq(castor_dataset_split_tail(NULL, 3, &tail), CASTOR_MISUSE);
    cr_assert_eq(castor_dataset_size(ds), 10, "failed splits leave the set alone");

    cr_assert_eq(castor_dataset_split_tail(ds, 3, &tail), CASTOR_OK, "%s",
                 castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_size(ds), 7);
    cr_assert_eq(castor_dataset_size(tail), 3);
    cr_assert_eq(castor_dataset_features(tail), 3);
    for (int i = 0; i < 21; i++)
        cr_assert_eq(castor_dataset_x(ds)[i], (float)i);
    for (int i = 0; i < 9; i++)
        cr_assert_eq(castor_dataset_x(tail)[i], (float)(21 + i));
    for (int i = 0; i < 3; i++)
        cr_assert_eq(castor_dataset_labels(tail)[i], y[7 + i]);
    cr_assert_eq(castor_dataset_labels(ds)[2], 5);
    cr_assert_eq(tail->num_classes, 6, "the tail keeps the whole set's classes");
    castor_dataset_free(tail);

    /* Down to one sample, then no further. */
    cr_assert_eq(castor_dataset_split_tail(ds, 6, &tail), CASTOR_OK);
    cr_assert_eq(castor_dataset_size(ds), 1);
    castor_dataset_free(tail);
    cr_assert_eq(castor_dataset_split_tail(ds, 1, &tail), CASTOR_INVALID);
    castor_dataset_free(ds);

    /* Regression targets travel with their samples. */
    float t[4 * 2];
    for (int i = 0; i < 8; i++)
        t[i] = (float)(100 + i);
    cr_assert_eq(castor_dataset_from_memory(&ds, x, 4, 3, NULL, t, 2), CASTOR_OK);
    cr_assert_eq(castor_dataset_split_tail(ds, 1, &tail), CASTOR_OK);
    cr_assert_eq(tail->target_dim, 2);
    cr_assert_eq(tail->targets[0], 106.0f);
    cr_assert_eq(tail->targets[1], 107.0f);
    cr_assert_eq(ds->targets[5], 105.0f);
    castor_dataset_free(tail);
    castor_dataset_free(ds);

    /* A handle that failed to load has nothing to split. */
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "train"), CASTOR_IO);
    cr_assert_eq(castor_dataset_split_tail(ds, 1, &tail), CASTOR_INVALID);
    castor_dataset_free(ds);
}

Test(dataset, one_hot_in_place)
{
    const float x[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int32_t y[4] = {2, 0, 1, 2};
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, x, 4, 2, y, NULL, 0), CASTOR_OK);
    const float *samples = castor_dataset_x(ds);

    /* Too few units, or none: refused, the set as it was. */
    cr_assert_eq(castor__dataset_one_hot(ds, 2), CASTOR_INVALID);
    cr_assert(strstr(castor_dataset_errmsg(ds), "labels up to 2"), "%s",
              castor_dataset_errmsg(ds));
    cr_assert_eq(castor__dataset_one_hot(ds, 0), CASTOR_INVALID);
    cr_assert_not_null(castor_dataset_labels(ds));
    cr_assert_null(ds->targets);
    cr_assert_eq(ds->num_classes, 3);

    /* As many units as classes, the usual case (10 classes, 10 outputs). */
    cr_assert_eq(castor__dataset_one_hot(ds, 3), CASTOR_OK, "%s", castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_x(ds), samples, "the samples stay where they were");
    cr_assert_null(castor_dataset_labels(ds));
    cr_assert_eq(ds->target_dim, 3);
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 3; k++)
            cr_assert_eq(ds->targets[i * 3 + k], k == y[i] ? 1.0f : 0.0f, "sample %d unit %d",
                         i, k);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(castor_dataset_x(ds)[i], x[i]);
    /* Now without labels: nothing to turn into targets. */
    cr_assert_eq(castor__dataset_one_hot(ds, 4), CASTOR_INVALID);
    cr_assert_eq(castor__dataset_one_hot(NULL, 4), CASTOR_MISUSE);
    castor_dataset_free(ds);
}
