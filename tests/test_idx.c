/* The IDX reader on good, truncated, lying and hostile files. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "castor.h"
#include "src/dataset.h"
#include "support.h"

static char *dir;

static void setup(void)
{
    dir = support_tmpdir();
}

static void teardown(void)
{
    support_rmrf(dir);
    free(dir);
}

TestSuite(idx, .init = setup, .fini = teardown);

/* An IDX header for ubyte data of the given dims, followed by `data_len`
 * bytes of a counting pattern. */
static size_t build(unsigned char *buf, int rank, const uint32_t *dims, size_t data_len)
{
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = 0x08;
    buf[3] = (unsigned char)rank;
    size_t p = 4;
    for (int i = 0; i < rank; i++) {
        buf[p++] = (unsigned char)(dims[i] >> 24);
        buf[p++] = (unsigned char)(dims[i] >> 16);
        buf[p++] = (unsigned char)(dims[i] >> 8);
        buf[p++] = (unsigned char)dims[i];
    }
    for (size_t i = 0; i < data_len; i++)
        buf[p++] = (unsigned char)(i * 7);
    return p;
}

static char *write_file(const char *name, const void *bytes, size_t len)
{
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    cr_assert_eq(support_write_file(path, bytes, len), 0);
    return path;
}

static char *write_gz(const char *name, const void *bytes, size_t len)
{
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    gzFile f = gzopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(gzwrite(f, bytes, (unsigned)len), (int)len);
    gzclose(f);
    return path;
}

static int read_idx(const char *path, castor__idx *idx, char *err)
{
    return castor__idx_read(path, 0, idx, err, 512);
}

Test(idx, good_plain_and_gzip)
{
    unsigned char buf[256];
    uint32_t dims[3] = {3, 4, 5};
    size_t len = build(buf, 3, dims, 60);
    const char *paths[2] = {write_file("good", buf, len), write_gz("good.gz", buf, len)};
    for (int k = 0; k < 2; k++) {
        castor__idx idx;
        char err[512] = "";
        cr_assert_eq(read_idx(paths[k], &idx, err), CASTOR_OK, "%s", err);
        cr_assert_eq(idx.rank, 3);
        cr_assert_eq(idx.count, 60);
        cr_assert_eq(idx.dims[2], 5);
        for (size_t i = 0; i < 60; i++)
            cr_assert_eq(idx.values[i], (float)(unsigned char)(i * 7));
        castor__idx_free(&idx);
        free((void *)paths[k]);
    }
}

static void expect_error(const char *path, int code, const char *words)
{
    castor__idx idx;
    char err[512] = "";
    int rc = read_idx(path, &idx, err);
    cr_assert_eq(rc, code, "%s: got %d (%s)", path, rc, err);
    cr_assert(strstr(err, path), "message names the file: %s", err);
    cr_assert(strstr(err, words), "message says '%s': %s", words, err);
    cr_assert_null(strchr(err, '\n'), "one line: %s", err);
    cr_assert_null(idx.values);
}

Test(idx, truncated)
{
    unsigned char buf[256];
    uint32_t dims[2] = {10, 10};
    size_t len = build(buf, 2, dims, 100);
    char *p = write_file("trunc", buf, len - 1);
    expect_error(p, CASTOR_FORMAT, "truncated");
    free(p);
    p = write_gz("trunc.gz", buf, len - 30);
    expect_error(p, CASTOR_FORMAT, "truncated");
    free(p);
    p = write_file("short-header", buf, 9);
    expect_error(p, CASTOR_FORMAT, "truncated");
    free(p);
}

Test(idx, trailing_bytes)
{
    unsigned char buf[256];
    uint32_t dims[2] = {10, 10};
    size_t len = build(buf, 2, dims, 101);
    char *p = write_file("trailing", buf, len);
    expect_error(p, CASTOR_FORMAT, "trailing");
    free(p);
}

Test(idx, wrong_magic_type_rank)
{
    unsigned char buf[256];
    uint32_t dims[2] = {2, 2};
    size_t len = build(buf, 2, dims, 4);
    buf[1] = 1;
    char *p = write_file("magic", buf, len);
    expect_error(p, CASTOR_FORMAT, "magic");
    free(p);
    buf[1] = 0;
    buf[2] = 0x07;
    p = write_file("type", buf, len);
    expect_error(p, CASTOR_FORMAT, "type");
    free(p);
    buf[2] = 0x08;
    buf[3] = 0;
    p = write_file("rank0", buf, len);
    expect_error(p, CASTOR_FORMAT, "rank");
    free(p);
    buf[3] = 5;
    p = write_file("rank5", buf, len);
    expect_error(p, CASTOR_FORMAT, "rank");
    free(p);
}

Test(idx, zero_and_oversized_dimensions)
{
    unsigned char buf[64];
    uint32_t zero[2] = {3, 0};
    size_t len = build(buf, 2, zero, 0);
    char *p = write_file("zero", buf, len);
    expect_error(p, CASTOR_FORMAT, "zero");
    free(p);
    /* 2^128 elements: must fail on the header alone, allocating nothing. */
    uint32_t huge[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    len = build(buf, 4, huge, 8);
    p = write_file("huge", buf, len);
    expect_error(p, CASTOR_FORMAT, "too large");
    free(p);
    /* Under the overflow limit but far beyond the bytes present. */
    uint32_t big[2] = {60000, 784};
    len = build(buf, 2, big, 16);
    p = write_file("lying", buf, len);
    expect_error(p, CASTOR_FORMAT, "truncated");
    free(p);
}

Test(idx, empty_missing_directory)
{
    char *p = write_file("empty", "", 0);
    expect_error(p, CASTOR_FORMAT, "empty");
    free(p);
    expect_error(dir, CASTOR_IO, "directory");
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    expect_error(missing, CASTOR_IO, "No such file");
}

Test(idx, gzip_bomb_is_not_read_whole)
{
    /* A header promising 4 bytes followed by 64 MiB of zeros, compressed to
     * a few KiB: rejected as trailing data after reading only what the
     * header allows. */
    size_t big = (size_t)64 << 20;
    unsigned char *buf = calloc(1, big + 16);
    uint32_t dims[1] = {4};
    size_t len = build(buf, 1, dims, 4);
    char *p = write_gz("bomb.gz", buf, len + big);
    expect_error(p, CASTOR_FORMAT, "trailing");
    free(p);
    free(buf);
}

Test(idx, dataset_label_count_mismatch)
{
    unsigned char img[256], lab[64];
    uint32_t idims[3] = {4, 2, 2}, ldims[1] = {3};
    size_t ilen = build(img, 3, idims, 16), llen = build(lab, 1, ldims, 3);
    char *ip = write_file("img", img, ilen), *lp = write_file("lab", lab, llen);
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_load_idx(&ds, ip, lp), CASTOR_FORMAT);
    cr_assert(strstr(castor_dataset_errmsg(ds), "lab"), "%s", castor_dataset_errmsg(ds));
    castor_dataset_free(ds);
    /* labels right: pixels scaled to [0, 1] */
    ldims[0] = 4;
    llen = build(lab, 1, ldims, 4);
    free(lp);
    lp = write_file("lab2", lab, llen);
    cr_assert_eq(castor_dataset_load_idx(&ds, ip, lp), CASTOR_OK, "%s", castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_size(ds), 4);
    cr_assert_eq(castor_dataset_features(ds), 4);
    cr_assert_float_eq(castor_dataset_x(ds)[1], 7.0f / 255.0f, 1e-7);
    castor_dataset_free(ds);
    free(ip);
    free(lp);
}

Test(idx, fashion_mnist)
{
    const char *fm = support_fashion_dir();
    cr_assert(fm, "Fashion-MNIST missing: install dataset-fashion-mnist");
    castor_dataset *train = NULL, *test = NULL;
    cr_assert_eq(castor_dataset_load_mnist_dir(&train, fm, "train"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(train));
    cr_assert_eq(castor_dataset_load_mnist_dir(&test, fm, "test"), CASTOR_OK);
    cr_assert_eq(castor_dataset_size(train), 60000);
    cr_assert_eq(castor_dataset_size(test), 10000);
    cr_assert_eq(castor_dataset_features(train), 784);
    const float *x = castor_dataset_x(train);
    float lo = 1, hi = 0;
    for (size_t i = 0; i < 60000u * 784u; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    cr_assert(lo == 0.0f && hi == 1.0f, "pixels in [%g, %g]", lo, hi);
    const int32_t *y = castor_dataset_labels(test);
    int counts[10] = {0};
    for (int i = 0; i < 10000; i++) {
        cr_assert(y[i] >= 0 && y[i] < 10);
        counts[y[i]]++;
    }
    for (int c = 0; c < 10; c++)
        cr_assert_eq(counts[c], 1000, "class %d has %d test samples", c, counts[c]);
    castor_dataset *bad = NULL;
    cr_assert_eq(castor_dataset_load_mnist_dir(&bad, dir, "train"), CASTOR_IO);
    cr_assert(strstr(castor_dataset_errmsg(bad), "dataset-fashion-mnist"));
    castor_dataset_free(bad);
    castor_dataset_free(train);
    castor_dataset_free(test);
}
