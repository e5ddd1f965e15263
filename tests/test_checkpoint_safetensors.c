/*
 * Checkpoints: the safetensors reader on its own, on valid headers and on
 * hostile ones (bad JSON, dtypes, shapes, offsets, lengths, non-files).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "checkpoint_support.h"
#include "src/safetensors.h"
#include "support.h"

static int parse_text(const char *header, size_t data_len, char *err, size_t errlen)
{
    unsigned char zeros[64] = {0};
    cr_assert(data_len <= sizeof zeros);
    size_t len;
    unsigned char *b = ckpt_image(header, zeros, data_len, &len);
    castor__st_file f;
    int rc = castor__st_parse(b, len, "mem.safetensors", &f, err, errlen);
    castor__st_free(&f);
    free(b);
    return rc;
}

Test(checkpoint, st_accepts_valid)
{
    char err[256] = "";
    cr_assert_eq(parse_text("{}", 0, err, sizeof err), CASTOR_OK, "%s", err);
    cr_assert_eq(parse_text("{\"__metadata__\":{\"a\":\"b\"}}", 0, err, sizeof err), CASTOR_OK,
                 "%s", err);
    /* A scalar, a zero-size tensor and trailing padding. */
    cr_assert_eq(parse_text("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                            "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
                            "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}  ",
                            12, err, sizeof err),
                 CASTOR_OK, "%s", err);
}

static void expect_reject(const char *header, size_t data_len, const char *fragment)
{
    char err[256] = "";
    cr_assert_eq(parse_text(header, data_len, err, sizeof err), CASTOR_FORMAT,
                 "accepted: %s", header);
    cr_assert(strncmp(err, "mem.safetensors: ", 17) == 0, "message: %s", err);
    cr_assert(strstr(err, fragment), "'%s' not in: %s", fragment, err);
}

Test(checkpoint, st_rejects_bad_headers)
{
    expect_reject("[1,2]", 0, "does not start with '{'");
    expect_reject("{\"a\":", 0, "not valid JSON");
    expect_reject("{} x", 0, "after its JSON object");
    expect_reject("{\"a\":1}", 0, "not a JSON object");
    expect_reject("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                  "dtype 'F16'");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                  "dimension 0");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                  "dimension 0");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                  "\"data_offsets\":[0,0]}}", 0, "overflows");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                  "end before");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                  "past the end");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                  "its shape needs 8");
    /* more bytes than the shape, too: the rest would be read by no one */
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                  "its shape needs 4");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                  "overlap");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                  "belong to no tensor");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                  "belong to no tensor");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
                  "appears twice");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[0],"
                  "\"data_offsets\":[0,0]}}", 0, "twice");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":1}}", 0,
                  "unknown field");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[0]}}", 0, "no 'data_offsets'");
    expect_reject("{\"__metadata__\":{\"n\":1}}", 0, "not a string");
    expect_reject("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "appears twice");
    expect_reject("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "appears twice");
    expect_reject("{\"\xff\":1}", 0, "UTF-8");
    expect_reject("{\"\xc0\x80\":1}", 0, "UTF-8");  /* overlong NUL */
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                  "\"data_offsets\":[0,4]}}", 4, "dimensions");
}

Test(checkpoint, st_rejects_bad_lengths)
{
    char err[256];
    castor__st_file f;
    unsigned char small[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(castor__st_parse(small, 0, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "empty"), "%s", err);
    cr_assert_eq(castor__st_parse(small, sizeof small, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "truncated"), "%s", err);
    unsigned char huge[16] = {0};
    huge[7] = 0x80;  /* 2^63 */
    cr_assert_eq(castor__st_parse(huge, sizeof huge, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "limit"), "%s", err);
    unsigned char over[16] = {9, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    cr_assert_eq(castor__st_parse(over, 10, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "larger than"), "%s", err);
    unsigned char zero[16] = {0};
    cr_assert_eq(castor__st_parse(zero, sizeof zero, "x", &f, err, sizeof err), CASTOR_FORMAT);
    castor__st_free(&f);
}

Test(checkpoint, st_read_rejects_non_files)
{
    char *dir = support_tmpdir();
    char err[512];
    castor__st_file f;
    cr_assert_eq(castor__st_read(dir, &f, err, sizeof err), CASTOR_IO);
    cr_assert(strstr(err, dir) && strstr(err, "directory"), "%s", err);
    char *missing = ckpt_path_in(dir, "missing.safetensors");
    cr_assert_eq(castor__st_read(missing, &f, err, sizeof err), CASTOR_IO);
    cr_assert(strstr(err, missing), "%s", err);
    char *empty = ckpt_path_in(dir, "empty.safetensors");
    cr_assert_eq(support_write_file(empty, "", 0), 0);
    cr_assert_eq(castor__st_read(empty, &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, empty) && strstr(err, "empty"), "%s", err);
    free(missing);
    free(empty);
    support_rmrf(dir);
    free(dir);
}

/* The writer on its own: names and values with JSON's special characters
 * come back as they went in, the tensors follow one another, and the data
 * section starts at a multiple of 8 bytes (as safetensors.h promises, for
 * readers that map the data in place) whatever the header's length. */
Test(checkpoint, st_write_round_trips_and_aligns)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "w.safetensors");
    const float one[1] = {1.5f}, three[3] = {-1.0f, 0.0f, 2.0f};
    const char *names[2] = {"a\\\"b", "c\\\\d\ne"};  /* a\"b and c\\d<newline>e */
    castor__st_kv meta[1] = {{NULL, "v\\\"\t\x1f"}};
    char err[512] = "";
    for (size_t pad = 0; pad < 8; pad++) {
        char key[16] = "k\\";
        memset(key + 2, 'x', pad);  /* headers of 8 different lengths */
        key[2 + pad] = '\0';
        meta[0].key = key;
        castor__st_out outs[2] = {{names[0], 1, {1}, one}, {names[1], 2, {1, 3}, three}};
        cr_assert_eq(castor__st_write(path, outs, 2, meta, 1, err, sizeof err), CASTOR_OK, "%s",
                     err);
        size_t len;
        unsigned char *b = ckpt_slurp(path, &len);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = hl << 8 | b[i];
        cr_assert_eq((8 + hl) % 8, 0, "pad %zu: the data starts at byte %llu", pad,
                     (unsigned long long)(8 + hl));
        cr_assert_eq(len, 8 + hl + 16);
        /* JSON takes no raw control character, 0x1f the last of them (the
         * header stops at the data's first NUL: 1.5f starts 00 00) */
        cr_assert(strstr((const char *)b + 8, "\\u001f"), "pad %zu: 0x1f not escaped", pad);
        free(b);
        castor__st_file f;
        cr_assert_eq(castor__st_read(path, &f, err, sizeof err), CASTOR_OK, "%s", err);
        cr_assert_eq(f.n_tensors, 2);
        for (int i = 0; i < 2; i++) {
            const castor__st_tensor *t = castor__st_find(&f, names[i]);
            cr_assert(t, "pad %zu: tensor %d's name did not come back", pad, i);
            cr_assert_eq(t->begin, i ? 4u : 0u);
            cr_assert_eq(t->count, i ? 3u : 1u);
            cr_assert(memcmp(f.data + t->begin, i ? three : one, 4 * t->count) == 0);
        }
        const char *v = castor__st_meta_get(&f, key);
        cr_assert(v && strcmp(v, "v\\\"\t\x1f") == 0, "'%s'", v ? v : "(none)");
        castor__st_free(&f);
    }
    free(path);
    support_rmrf(dir);
    free(dir);
}
