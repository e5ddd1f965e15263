/* The IDX reader and the dataset layer on good, truncated, lying and hostile
 * input. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "castor.h"
#include "src/dataset.h"
#include "src/util.h"
#include "support.h"

TestSuite(idx, .init = support_dir_init, .fini = support_dir_fini);
TestSuite(dataset, .init = support_dir_init, .fini = support_dir_fini);

/* ---- building files ------------------------------------------------------ */

/* An IDX header of `type` and dims, then payload_len bytes of payload. */
static size_t build_typed(unsigned char *buf, int type, int rank, const uint32_t *dims,
                          const void *payload, size_t payload_len)
{
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = (unsigned char)type;
    buf[3] = (unsigned char)rank;
    size_t p = 4;
    for (int i = 0; i < rank; i++)
        p += support_put_be32(buf + p, dims[i]);
    if (payload_len)
        memcpy(buf + p, payload, payload_len);
    return p + payload_len;
}

/* A ubyte IDX header and data_len bytes of a counting pattern. */
static size_t build(unsigned char *buf, int rank, const uint32_t *dims, size_t data_len)
{
    size_t p = build_typed(buf, 0x08, rank, dims, NULL, 0);
    for (size_t i = 0; i < data_len; i++)
        buf[p++] = (unsigned char)(i * 7);
    return p;
}

static const char *write_gz(char *path, const char *name, const void *bytes, size_t len)
{
    size_t gz_len;
    unsigned char *gz = support_gzip(bytes, len, &gz_len);
    support_write_in(path, name, gz, gz_len);
    free(gz);
    return path;
}

/* ---- checking results ---------------------------------------------------- */

static int read_idx(const char *path, castor__idx *idx, char *err)
{
    return castor__idx_read(path, 0, idx, err, 512);
}

static void expect_error(const char *path, int code, const char *words)
{
    castor__idx idx;
    char err[512] = "";
    int rc = read_idx(path, &idx, err);
    cr_assert_eq(rc, code, "%s: got %d, want %d (%s)", path, rc, code, err);
    cr_assert(strncmp(err, path, strlen(path)) == 0 && strncmp(err + strlen(path), ": ", 2) == 0,
              "message starts with 'PATH: ': %s", err);
    cr_assert(strstr(err, words), "message says '%s': %s", words, err);
    cr_assert_null(strchr(err, '\n'), "one line: %s", err);
    cr_assert_null(idx.values);
    cr_assert_eq(idx.count, 0);
}

static void expect_parse_error(const unsigned char *bytes, size_t len, size_t max_count,
                               const char *words)
{
    castor__idx idx;
    char err[512] = "";
    int rc = castor__idx_parse(bytes, len, "mem.idx", max_count, &idx, err, sizeof err);
    cr_assert_eq(rc, CASTOR_FORMAT, "got %d (%s)", rc, err);
    cr_assert(strncmp(err, "mem.idx: ", 9) == 0, "%s", err);
    cr_assert(strstr(err, words), "message says '%s': %s", words, err);
    cr_assert_null(idx.values);
}

/* Limits this test process's address space to what it uses now plus
 * `extra`, so that an allocation sized by a lying header fails loudly
 * instead of being quietly overcommitted. ASan reserves terabytes of shadow
 * memory and cannot run under such a limit, so there this does nothing. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

static void limit_address_space(size_t extra)
{
#ifdef UNDER_ASAN
    (void)extra;
#else
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f)
        return;
    if (fscanf(f, "%lu", &pages) != 1)
        pages = 0;
    fclose(f);
    if (!pages)
        return;
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + extra;
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0, "setrlimit: %s", strerror(errno));
#endif
}

/* ---- good files ------------------------------------------------------------ */

Test(idx, good_plain_and_gzip)
{
    unsigned char buf[256];
    uint32_t dims[3] = {3, 4, 5};
    size_t len = build(buf, 3, dims, 60);
    char plain[SUPPORT_PATH_LEN], gz[SUPPORT_PATH_LEN];
    const char *paths[2] = {support_write_in(plain, "good", buf, len),
                            write_gz(gz, "good.gz", buf, len)};
    for (int k = 0; k < 2; k++) {
        castor__idx idx;
        char err[512] = "";
        cr_assert_eq(read_idx(paths[k], &idx, err), CASTOR_OK, "%s", err);
        cr_assert_eq(idx.type, 0x08);
        cr_assert_eq(idx.rank, 3);
        cr_assert_eq(idx.count, 60);
        cr_assert_eq(idx.dims[0], 3);
        cr_assert_eq(idx.dims[1], 4);
        cr_assert_eq(idx.dims[2], 5);
        for (size_t i = 0; i < 60; i++)
            cr_assert_eq(idx.values[i], (float)(unsigned char)(i * 7), "value %zu", i);
        castor__idx_free(&idx);
        cr_assert_null(idx.values);
    }
    castor__idx_free(NULL);
}

Test(idx, every_element_type_decodes_big_endian)
{
    static const struct {
        int type;
        unsigned char payload[16];
        size_t len;
        float want[2];
    } cases[] = {
        {0x08, {0x00, 0xFF}, 2, {0.0f, 255.0f}},
        {0x09, {0x80, 0x7F}, 2, {-128.0f, 127.0f}},
        {0x0B, {0xFF, 0xFE, 0x01, 0x00}, 4, {-2.0f, 256.0f}},
        {0x0C, {0xFF, 0xFE, 0xEE, 0x90, 0x00, 0x01, 0x00, 0x00}, 8, {-70000.0f, 65536.0f}},
        {0x0D, {0x3F, 0xC0, 0x00, 0x00, 0xC2, 0x28, 0x00, 0x00}, 8, {1.5f, -42.0f}},
        {0x0E, {0xC0, 0x02, 0, 0, 0, 0, 0, 0, 0x3F, 0xD0, 0, 0, 0, 0, 0, 0}, 16,
         {-2.25f, 0.25f}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unsigned char buf[64];
        uint32_t dims[1] = {2};
        size_t len = build_typed(buf, cases[k].type, 1, dims, cases[k].payload, cases[k].len);
        char name[32], path[SUPPORT_PATH_LEN];
        snprintf(name, sizeof name, "type%02x.gz", cases[k].type);
        write_gz(path, name, buf, len);
        castor__idx from_file, from_memory;
        char err[512] = "";
        cr_assert_eq(read_idx(path, &from_file, err), CASTOR_OK, "%s", err);
        cr_assert_eq(castor__idx_parse(buf, len, "mem", 0, &from_memory, err, sizeof err),
                     CASTOR_OK, "%s", err);
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(from_file.values[i], cases[k].want[i], "type 0x%02x value %d: %g",
                         cases[k].type, i, (double)from_file.values[i]);
            cr_assert_eq(from_memory.values[i], cases[k].want[i]);
        }
        castor__idx_free(&from_file);
        castor__idx_free(&from_memory);
    }
}

Test(idx, max_count_is_inclusive)
{
    unsigned char buf[64];
    uint32_t dims[2] = {2, 3};
    size_t len = build(buf, 2, dims, 6);
    castor__idx idx;
    char err[512];
    cr_assert_eq(castor__idx_parse(buf, len, "mem.idx", 6, &idx, err, sizeof err), CASTOR_OK);
    castor__idx_free(&idx);
    expect_parse_error(buf, len, 5, "too large");
    /* 0 means the default cap, not "nothing allowed". */
    cr_assert_eq(castor__idx_parse(buf, len, "mem.idx", 0, &idx, err, sizeof err), CASTOR_OK);
    castor__idx_free(&idx);
}

/* ---- truncated, trailing and corrupt files -------------------------------- */

Test(idx, truncated)
{
    unsigned char buf[256];
    uint32_t dims[2] = {10, 10};
    size_t len = build(buf, 2, dims, 100);
    char path[SUPPORT_PATH_LEN];
    expect_error(support_write_in(path, "trunc", buf, len - 1), CASTOR_FORMAT,
                 "truncated: header says 100 bytes of data, file has 99");
    expect_error(write_gz(path, "trunc.gz", buf, len - 30), CASTOR_FORMAT,
                 "truncated: header says 100 bytes of data, file has 70");
    expect_error(support_write_in(path, "short-header", buf, 9), CASTOR_FORMAT, "truncated");
    expect_error(write_gz(path, "short-header.gz", buf, 9), CASTOR_FORMAT, "truncated");
    expect_error(support_write_in(path, "three-bytes", buf, 3), CASTOR_FORMAT, "truncated");
    expect_parse_error(buf, len - 1, 0, "truncated: header says 100 bytes of data, file has 99");
    expect_parse_error(buf, 11, 0, "truncated");
    expect_parse_error(buf, 2, 0, "truncated");
}

Test(idx, gzip_stream_cut_off)
{
    unsigned char buf[4096];
    uint32_t dims[2] = {40, 100};
    size_t len = build(buf, 2, dims, 4000);
    size_t gz_len;
    unsigned char *gz = support_gzip(buf, len, &gz_len);
    char path[SUPPORT_PATH_LEN];
    /* Cut in the middle of the compressed data. */
    expect_error(support_write_in(path, "cut.gz", gz, gz_len / 2), CASTOR_FORMAT, "truncated");
    /* Cut in the 8-byte trailer: every data byte arrives, the checksum does not. */
    expect_error(support_write_in(path, "no-crc.gz", gz, gz_len - 4), CASTOR_FORMAT, "truncated");
    free(gz);
}

Test(idx, corrupt_gzip)
{
    unsigned char buf[256];
    uint32_t dims[2] = {10, 10};
    size_t len = build(buf, 2, dims, 100);
    size_t gz_len;
    unsigned char *gz = support_gzip(buf, len, &gz_len);
    gz[gz_len - 6] ^= 0x01; /* inside the CRC-32 */
    char path[SUPPORT_PATH_LEN];
    expect_error(support_write_in(path, "crc.gz", gz, gz_len), CASTOR_FORMAT, "gzip");
    free(gz);
}

Test(idx, trailing_bytes)
{
    unsigned char buf[256];
    uint32_t dims[2] = {10, 10};
    size_t len = build(buf, 2, dims, 101);
    char path[SUPPORT_PATH_LEN];
    expect_error(support_write_in(path, "trailing", buf, len), CASTOR_FORMAT,
                 "trailing bytes after the data: header says 100 bytes of data, file has 101");
    expect_error(write_gz(path, "trailing.gz", buf, len), CASTOR_FORMAT, "trailing");
    expect_parse_error(buf, len, 0, "trailing");
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
    char path[SUPPORT_PATH_LEN];
    write_gz(path, "bomb.gz", buf, len + big);
    free(buf);
    double start = castor__now();
    expect_error(path, CASTOR_FORMAT, "trailing");
    /* Inflating all 64 MiB would take tens of milliseconds at least. */
    cr_assert_lt(castor__now() - start, 0.5);
}

/* ---- lying and malformed headers ------------------------------------------ */

Test(idx, wrong_magic_type_rank)
{
    unsigned char buf[256];
    uint32_t dims[2] = {2, 2};
    size_t len = build(buf, 2, dims, 4);
    char path[SUPPORT_PATH_LEN];
    buf[1] = 1;
    expect_error(support_write_in(path, "magic", buf, len), CASTOR_FORMAT, "magic");
    buf[1] = 0;
    buf[0] = 0x1f;
    expect_error(write_gz(path, "magic.gz", buf, len), CASTOR_FORMAT, "magic");
    buf[0] = 0;
    buf[2] = 0x07;
    expect_error(support_write_in(path, "type", buf, len), CASTOR_FORMAT, "type");
    buf[2] = 0x0A;
    expect_error(support_write_in(path, "type0a", buf, len), CASTOR_FORMAT, "type");
    buf[2] = 0x08;
    buf[3] = 0;
    expect_error(support_write_in(path, "rank0", buf, len), CASTOR_FORMAT, "rank 0");
    buf[3] = 5;
    expect_error(support_write_in(path, "rank5", buf, len), CASTOR_FORMAT, "rank 5");
    buf[3] = 255;
    expect_error(support_write_in(path, "rank255", buf, len), CASTOR_FORMAT, "rank 255");
}

Test(idx, zero_and_oversized_dimensions)
{
    unsigned char buf[64];
    char path[SUPPORT_PATH_LEN];
    uint32_t zero[2] = {3, 0};
    size_t len = build(buf, 2, zero, 0);
    expect_error(support_write_in(path, "zero", buf, len), CASTOR_FORMAT, "zero");
    uint32_t zero_first[3] = {0, 5, 5};
    len = build(buf, 3, zero_first, 0);
    expect_error(support_write_in(path, "zero-first", buf, len), CASTOR_FORMAT, "zero");

    limit_address_space((size_t)512 << 20);
    /* 2^128 elements: must fail on the header alone. */
    uint32_t huge[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    len = build(buf, 4, huge, 8);
    expect_error(support_write_in(path, "huge", buf, len), CASTOR_FORMAT, "too large");
    expect_error(write_gz(path, "huge.gz", buf, len), CASTOR_FORMAT, "too large");
    expect_parse_error(buf, len, 0, "too large");
    expect_parse_error(buf, len, SIZE_MAX, "too large");
    /* One element over the default cap of 2^31. */
    uint32_t over[2] = {0x80000000u, 2};
    len = build(buf, 2, over, 8);
    expect_error(support_write_in(path, "over-cap", buf, len), CASTOR_FORMAT, "too large");
    /* Exactly the cap (8 GiB of floats if believed), with 16 bytes behind
     * it: plain and gzip, the reader must find out without allocating for
     * the claim, which the address-space limit would refuse. */
    uint32_t at_cap[2] = {0x8000u, 0x10000u};
    len = build(buf, 2, at_cap, 16);
    expect_error(support_write_in(path, "lying", buf, len), CASTOR_FORMAT,
                 "truncated: header says 2147483648 bytes of data, file has 16");
    expect_error(write_gz(path, "lying.gz", buf, len), CASTOR_FORMAT,
                 "truncated: header says 2147483648 bytes of data, file has 16");
    expect_parse_error(buf, len, 0, "truncated");
    /* float64 at the cap: the byte count (16 GiB) must not be believed either. */
    buf[2] = 0x0E;
    expect_error(write_gz(path, "lying-f64.gz", buf, len), CASTOR_FORMAT, "truncated");
}

/* ---- files that are not there, not files, or empty ----------------------- */

Test(idx, empty_missing_directory_unreadable)
{
    char path[SUPPORT_PATH_LEN];
    expect_error(support_write_in(path, "empty", "", 0), CASTOR_FORMAT, "empty");
    expect_error(write_gz(path, "empty.gz", "", 0), CASTOR_FORMAT, "empty");
    expect_parse_error((const unsigned char *)"", 0, 0, "empty");
    expect_error(support_dir, CASTOR_IO, "directory");
    expect_error(support_path_in(path, "nope"), CASTOR_IO, "No such file");
    /* A path through a regular file. */
    support_write_in(path, "plain-file", "x", 1);
    strcat(path, "/child");
    expect_error(path, CASTOR_IO, "Not a directory");
    /* Permissions do not stop root, so this part only runs for other users. */
    if (geteuid() != 0) {
        unsigned char buf[64];
        uint32_t dims[1] = {4};
        size_t len = build(buf, 1, dims, 4);
        support_write_in(path, "locked", buf, len);
        cr_assert_eq(chmod(path, 0), 0);
        expect_error(path, CASTOR_IO, "Permission denied");
    }
    castor__idx idx;
    char err[512] = "";
    cr_assert_neq(castor__idx_read(NULL, 0, &idx, err, sizeof err), CASTOR_OK);
    cr_assert_null(idx.values);
}

Test(idx, small_error_buffer_is_safe)
{
    castor__idx idx;
    char err[8];
    memset(err, 'z', sizeof err);
    cr_assert_eq(castor__idx_read(support_dir, 0, &idx, err, sizeof err), CASTOR_IO);
    cr_assert_eq(err[sizeof err - 1], '\0');
    cr_assert_eq(castor__idx_read(support_dir, 0, &idx, NULL, 0), CASTOR_IO);
}

/* ---- the dataset from IDX files ------------------------------------------- */

static const char *write_labels(char *path, const char *name, int type, const void *payload,
                                uint32_t count, size_t payload_len)
{
    unsigned char buf[256];
    uint32_t dims[1] = {count};
    size_t len = build_typed(buf, type, 1, dims, payload, payload_len);
    return support_write_in(path, name, buf, len);
}

Test(dataset, load_idx_scales_pixels_and_counts_classes)
{
    unsigned char img[256];
    uint32_t idims[3] = {4, 2, 2};
    size_t ilen = build(img, 3, idims, 16);
    img[ilen - 1] = 255;
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    write_gz(ip, "img.gz", img, ilen);
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

Test(dataset, load_idx_keeps_other_types_unscaled)
{
    unsigned char img[256];
    uint32_t idims[2] = {2, 2};
    const unsigned char f32[16] = {0x3F, 0xC0, 0, 0, 0xC2, 0x28, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0};
    size_t ilen = build_typed(img, 0x0D, 2, idims, f32, sizeof f32);
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
    size_t ilen = build(img, 3, idims, 16);
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
    support_write_in(lp, "rank2", lab2, build_typed(lab2, 0x08, 2, ldims, four, 4));
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "1 dimension");

    write_labels(lp, "negative", 0x09, (const unsigned char[4]){1, 0xFF, 2, 3}, 4, 4);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "label 1 is -1");

    /* 1.5f, 0, 0, 0 */
    const unsigned char half[16] = {0x3F, 0xC0, 0, 0};
    write_labels(lp, "fraction", 0x0D, half, 4, sizeof half);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "label 0 is 1.5");

    /* 2^24 + 1 would round to 2^24 on the way through float: refused. */
    const unsigned char big[16] = {0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0x01, 0, 0, 0x01};
    write_labels(lp, "too-big", 0x0C, big, 4, sizeof big);
    expect_load_error(ip, lp, CASTOR_FORMAT, lp, "label 3 is");

    write_labels(lp, "good", 0x08, four, 4, 4);
    unsigned char img1[64];
    uint32_t one_dim[1] = {4};
    char ip1[SUPPORT_PATH_LEN];
    support_write_in(ip1, "img-rank1", img1, build(img1, 1, one_dim, 4));
    expect_load_error(ip1, lp, CASTOR_FORMAT, ip1, "2 dimensions");

    /* A NaN pixel in a float file. */
    unsigned char imgf[128];
    unsigned char f32[16] = {0};
    f32[8] = 0x7F;
    f32[9] = 0xC0;
    uint32_t fdims[2] = {4, 1};
    char ipf[SUPPORT_PATH_LEN];
    support_write_in(ipf, "img-nan", imgf, build_typed(imgf, 0x0D, 2, fdims, f32, sizeof f32));
    expect_load_error(ipf, lp, CASTOR_FORMAT, ipf, "sample 2");

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
    size_t ilen = build(img, 3, idims, 4 * n), llen = build(lab, 1, ldims, n);
    for (uint32_t i = 0; i < n; i++)
        lab[llen - n + i] = (unsigned char)i;
    char name[64], path[SUPPORT_PATH_LEN];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
    gz ? write_gz(path, name, img, ilen) : support_write_in(path, name, img, ilen);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
    gz ? write_gz(path, name, lab, llen) : support_write_in(path, name, lab, llen);
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

    /* Only the labels missing: only they are named. */
    char path[SUPPORT_PATH_LEN];
    support_write_in(path, "train-images-idx3-ubyte", "", 0);
    cr_assert_eq(castor_dataset_load_mnist_dir(&ds, support_dir, "train"), CASTOR_IO);
    msg = castor_dataset_errmsg(ds);
    cr_assert(strstr(msg, "train-labels-idx1-ubyte") && !strstr(msg, "train-images"), "%s", msg);
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
        {NULL, 3, 2, y, NULL, 0, "x non-NULL"},
        {x, 0, 2, y, NULL, 0, "n > 0"},
        {x, 3, 0, y, NULL, 0, "features > 0"},
        {x, 3, -1, y, NULL, 0, "features > 0"},
        {x, 3, 2, NULL, NULL, 0, "exactly one"},
        {x, 3, 2, y, t, 1, "exactly one"},
        {x, 3, 2, NULL, t, 0, "target_dim"},
        {x, 3, 2, (const int32_t[3]){0, -1, 1}, NULL, 0, "label 1 is -1"},
        {x, 3, 2, (const int32_t[3]){0, 1, INT32_MAX}, NULL, 0, "label 2 is 2147483647"},
        {x, SIZE_MAX / 2, 2, y, NULL, 0, "too many"},
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
