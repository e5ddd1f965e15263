/*
 * libFuzzer harness for the IDX reader. Each input is read three ways: parsed
 * from memory, read from a plain file and read from a gzip file holding the
 * same bytes. Beyond what the sanitizers catch, the three must agree: the
 * file reader's chunked, growing reads and its early size checks may not
 * change the verdict or the values.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "castor.h"
#include "src/dataset.h"

/* Small enough that a lying header cannot cost real memory or time. */
#define FUZZ_MAX_COUNT ((size_t)1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bytes in an anonymous file: returns its descriptor, its path in path. */
static int write_memfd(const void *bytes, size_t len, char *path, size_t path_len)
{
    int fd = memfd_create("fuzz_idx", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    const unsigned char *p = bytes;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

static unsigned char *gzip_bytes(const uint8_t *bytes, size_t len, size_t *out_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    size_t cap = deflateBound(&zs, (uLong)len) + 64;
    unsigned char *out = malloc(cap);
    if (out) {
        zs.next_in = (Bytef *)(uintptr_t)bytes;
        zs.avail_in = (uInt)len;
        zs.next_out = out;
        zs.avail_out = (uInt)cap;
        if (deflate(&zs, Z_FINISH) != Z_STREAM_END) {
            free(out);
            out = NULL;
        }
        *out_len = cap - zs.avail_out;
    }
    deflateEnd(&zs);
    return out;
}

static void must_agree(const castor__idx *want, int want_rc, const void *file_bytes,
                       size_t file_len)
{
    char path[64], err[512] = "";
    int fd = write_memfd(file_bytes, file_len, path, sizeof path);
    if (fd < 0)
        return;
    castor__idx got;
    int rc = castor__idx_read(path, FUZZ_MAX_COUNT, &got, err, sizeof err);
    close(fd);
    if (rc == CASTOR_NOMEM || want_rc == CASTOR_NOMEM) {
        castor__idx_free(&got);
        return;
    }
    if ((rc == CASTOR_OK) != (want_rc == CASTOR_OK) || (rc && !err[0]) ||
        strchr(err, '\n')) {
        fprintf(stderr, "parse says %d, read says %d (%s)\n", want_rc, rc, err);
        abort();
    }
    if (rc == CASTOR_OK) {
        if (got.count != want->count || got.type != want->type || got.rank != want->rank ||
            memcmp(got.dims, want->dims, sizeof got.dims) != 0 ||
            memcmp(got.values, want->values, got.count * sizeof(float)) != 0) {
            fprintf(stderr, "parse and read disagree on the contents\n");
            abort();
        }
    }
    castor__idx_free(&got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    castor__idx idx;
    char err[512] = "";
    int rc = castor__idx_parse(data, size, "fuzz", FUZZ_MAX_COUNT, &idx, err, sizeof err);
    if (rc != CASTOR_OK && (!err[0] || idx.values || strchr(err, '\n')))
        abort();
    must_agree(&idx, rc, data, size);
    size_t gz_len;
    unsigned char *gz = gzip_bytes(data, size, &gz_len);
    if (gz) {
        must_agree(&idx, rc, gz, gz_len);
        free(gz);
    }
    castor__idx_free(&idx);
    return 0;
}
