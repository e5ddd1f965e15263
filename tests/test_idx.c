/* The IDX reader (src/idx.c) on good, truncated, lying and hostile input;
 * the data sets built from it are test_dataset.c's. */
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
    size_t len = support_idx_build_ubyte(buf, 3, dims, 60);
    char plain[SUPPORT_PATH_LEN], gz[SUPPORT_PATH_LEN];
    const char *paths[2] = {support_write_in(plain, "good", buf, len),
                            support_write_gz_in(gz, "good.gz", buf, len)};
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
        size_t len = support_idx_build(buf, cases[k].type, 1, dims, cases[k].payload, cases[k].len);
        char name[32], path[SUPPORT_PATH_LEN];
        snprintf(name, sizeof name, "type%02x.gz", cases[k].type);
        support_write_gz_in(path, name, buf, len);
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
    size_t len = support_idx_build_ubyte(buf, 2, dims, 6);
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
    size_t len = support_idx_build_ubyte(buf, 2, dims, 100);
    char path[SUPPORT_PATH_LEN];
    expect_error(support_write_in(path, "trunc", buf, len - 1), CASTOR_FORMAT,
                 "truncated: header says 100 bytes of data, file has 99");
    expect_error(support_write_gz_in(path, "trunc.gz", buf, len - 30), CASTOR_FORMAT,
                 "truncated: header says 100 bytes of data, file has 70");
    expect_error(support_write_in(path, "short-header", buf, 9), CASTOR_FORMAT, "truncated");
    expect_error(support_write_gz_in(path, "short-header.gz", buf, 9), CASTOR_FORMAT, "truncated");
    expect_error(support_write_in(path, "three-bytes", buf, 3), CASTOR_FORMAT, "truncated");
    expect_parse_error(buf, len - 1, 0, "truncated: header says 100 bytes of data, file has 99");
    expect_parse_error(buf, 11, 0, "truncated");
    expect_parse_error(buf, 2, 0, "truncated");
}

Test(idx, gzip_stream_cut_off)
{
    unsigned char buf[4096];
    uint32_t dims[2] = {40, 100};
    size_t len = support_idx_build_ubyte(buf, 2, dims, 4000);
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
    size_t len = support_idx_build_ubyte(buf, 2, dims, 100);
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
    size_t len = support_idx_build_ubyte(buf, 2, dims, 101);
    char path[SUPPORT_PATH_LEN];
    expect_error(support_write_in(path, "trailing", buf, len), CASTOR_FORMAT,
                 "trailing bytes after the data: header says 100 bytes of data, file has 101");
    expect_error(support_write_gz_in(path, "trailing.gz", buf, len), CASTOR_FORMAT, "trailing");
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
    size_t len = support_idx_build_ubyte(buf, 1, dims, 4);
    char path[SUPPORT_PATH_LEN];
    support_write_gz_in(path, "bomb.gz", buf, len + big);
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
    size_t len = support_idx_build_ubyte(buf, 2, dims, 4);
    char path[SUPPORT_PATH_LEN];
    buf[1] = 1;
    expect_error(support_write_in(path, "magic", buf, len), CASTOR_FORMAT, "magic");
    buf[1] = 0;
    buf[0] = 0x1f;
    expect_error(support_write_gz_in(path, "magic.gz", buf, len), CASTOR_FORMAT, "magic");
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
    size_t len = support_idx_build_ubyte(buf, 2, zero, 0);
    expect_error(support_write_in(path, "zero", buf, len), CASTOR_FORMAT,
                 "dimension 2 of 2 is zero");
    /* No samples at all: said so ("dimension 1 of 3 is zero" before). */
    uint32_t zero_first[3] = {0, 5, 5};
    len = support_idx_build_ubyte(buf, 3, zero_first, 0);
    expect_error(support_write_in(path, "zero-first", buf, len), CASTOR_FORMAT,
                 "holds no samples (its first dimension is 0)");

    limit_address_space((size_t)512 << 20);
    /* 2^128 elements: must fail on the header alone. */
    uint32_t huge[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    len = support_idx_build_ubyte(buf, 4, huge, 8);
    expect_error(support_write_in(path, "huge", buf, len), CASTOR_FORMAT, "too large");
    expect_error(support_write_gz_in(path, "huge.gz", buf, len), CASTOR_FORMAT, "too large");
    expect_parse_error(buf, len, 0, "too large");
    expect_parse_error(buf, len, SIZE_MAX, "too large");
    /* One element over the default cap of 2^31. */
    uint32_t over[2] = {0x80000000u, 2};
    len = support_idx_build_ubyte(buf, 2, over, 8);
    expect_error(support_write_in(path, "over-cap", buf, len), CASTOR_FORMAT, "too large");
    /* Exactly the cap (8 GiB of floats if believed), with 16 bytes behind
     * it: plain and gzip, the reader must find out without allocating for
     * the claim, which the address-space limit would refuse. */
    uint32_t at_cap[2] = {0x8000u, 0x10000u};
    len = support_idx_build_ubyte(buf, 2, at_cap, 16);
    expect_error(support_write_in(path, "lying", buf, len), CASTOR_FORMAT,
                 "truncated: header says 2147483648 bytes of data, file has 16");
    expect_error(support_write_gz_in(path, "lying.gz", buf, len), CASTOR_FORMAT,
                 "truncated: header says 2147483648 bytes of data, file has 16");
    expect_parse_error(buf, len, 0, "truncated");
    /* float64 at the cap: the byte count (16 GiB) must not be believed either. */
    buf[2] = 0x0E;
    expect_error(support_write_gz_in(path, "lying-f64.gz", buf, len), CASTOR_FORMAT, "truncated");
}

/* ---- files that are not there, not files, or empty ----------------------- */

Test(idx, empty_missing_directory_unreadable)
{
    char path[SUPPORT_PATH_LEN];
    expect_error(support_write_in(path, "empty", "", 0), CASTOR_FORMAT, "empty");
    expect_error(support_write_gz_in(path, "empty.gz", "", 0), CASTOR_FORMAT, "empty");
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
        size_t len = support_idx_build_ubyte(buf, 1, dims, 4);
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
