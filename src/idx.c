/*
 * IDX files (the MNIST format), plain or gzip, read as untrusted input:
 * every field is checked, and the element count against overflow, against
 * a cap and against the bytes actually present, before the data is
 * allocated.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "dataset.h"
#include "util.h"

#define DEFAULT_MAX_COUNT ((size_t)1 << 31)

static int elem_size(int type)
{
    switch (type) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
    }
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static float decode(const unsigned char *p, int type)
{
    switch (type) {
    case 0x08: return (float)p[0];
    case 0x09: return (float)(int8_t)p[0];
    case 0x0B: return (float)(int16_t)(uint16_t)((unsigned)p[0] << 8 | p[1]);
    case 0x0C: return (float)(int32_t)be32(p);
    case 0x0D: {
        uint32_t u = be32(p);
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    default: {
        uint64_t u = (uint64_t)be32(p) << 32 | be32(p + 4);
        double d;
        memcpy(&d, &u, sizeof d);
        return (float)d;
    }
    }
}

/* Parse the header; on success *header_len and out's shape are set. */
static int parse_header(const unsigned char *bytes, size_t len, const char *name,
                        size_t max_count, castor__idx *out, size_t *header_len, char *err,
                        size_t errlen)
{
    if (len < 4) {
        castor__errf(err, errlen, "%s: not an IDX file: %zu bytes, too short for a header", name,
                     len);
        return CASTOR_FORMAT;
    }
    if (bytes[0] != 0 || bytes[1] != 0) {
        castor__errf(err, errlen, "%s: not an IDX file: bad magic %02x %02x (want 00 00)", name,
                     bytes[0], bytes[1]);
        return CASTOR_FORMAT;
    }
    int type = bytes[2], rank = bytes[3];
    if (!elem_size(type)) {
        castor__errf(err, errlen, "%s: unknown IDX element type 0x%02x", name, type);
        return CASTOR_FORMAT;
    }
    if (rank < 1 || rank > 4) {
        castor__errf(err, errlen, "%s: IDX rank %d not supported (1..4)", name, rank);
        return CASTOR_FORMAT;
    }
    size_t hdr = 4 + 4 * (size_t)rank;
    if (len < hdr) {
        castor__errf(err, errlen, "%s: truncated: the header needs %zu bytes, file has %zu",
                     name, hdr, len);
        return CASTOR_FORMAT;
    }
    size_t count = 1;
    for (int i = 0; i < rank; i++) {
        uint32_t d = be32(bytes + 4 + 4 * i);
        if (d == 0) {
            castor__errf(err, errlen, "%s: dimension %d is zero", name, i);
            return CASTOR_FORMAT;
        }
        if (!castor__mul_ok(count, d, &count) || count > max_count) {
            castor__errf(err, errlen, "%s: dimensions too large (more than %zu elements)", name,
                         max_count);
            return CASTOR_FORMAT;
        }
        out->dims[i] = d;
    }
    out->type = type;
    out->rank = rank;
    out->count = count;
    *header_len = hdr;
    return CASTOR_OK;
}

int castor__idx_parse(const unsigned char *bytes, size_t len, const char *name,
                      size_t max_count, castor__idx *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    size_t hdr;
    int rc = parse_header(bytes, len, name, max_count ? max_count : DEFAULT_MAX_COUNT, out, &hdr,
                          err, errlen);
    if (rc)
        return rc;
    size_t es = (size_t)elem_size(out->type), need = out->count * es;
    if (len - hdr != need) {
        castor__errf(err, errlen, "%s: %s: the header says %zu bytes of data, the file has %zu",
                     name, len - hdr < need ? "truncated" : "trailing bytes after the data",
                     need, len - hdr);
        memset(out, 0, sizeof *out);
        return CASTOR_FORMAT;
    }
    out->values = malloc(out->count * sizeof(float));
    if (!out->values) {
        castor__errf(err, errlen, "%s: out of memory for %zu values", name, out->count);
        memset(out, 0, sizeof *out);
        return CASTOR_NOMEM;
    }
    const unsigned char *p = bytes + hdr;
    for (size_t i = 0; i < out->count; i++, p += es)
        out->values[i] = decode(p, out->type);
    return CASTOR_OK;
}

/* Read at most `limit` bytes of the (decompressed) file. A file longer than
 * that is reported as such without reading the rest: a gzip bomb costs
 * nothing. */
static int read_bounded(const char *path, size_t limit, unsigned char **out, size_t *len,
                        int *longer, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        castor__errf(err, errlen, "%s: %s", path, strerror(errno));
        return CASTOR_IO;
    }
    if (S_ISDIR(st.st_mode)) {
        castor__errf(err, errlen, "%s: is a directory, not an IDX file", path);
        return CASTOR_IO;
    }
    gzFile f = gzopen(path, "rb");
    if (!f) {
        castor__errf(err, errlen, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
        return CASTOR_IO;
    }
    size_t cap = 1 << 16, used = 0;
    unsigned char *buf = malloc(cap);
    int rc = buf ? CASTOR_OK : CASTOR_NOMEM;
    *longer = 0;
    while (!rc) {
        if (used == cap) {
            if (cap > limit) {
                *longer = 1;
                break;
            }
            size_t ncap = cap * 2;
            unsigned char *grown = realloc(buf, ncap);
            if (!grown) {
                rc = CASTOR_NOMEM;
                break;
            }
            buf = grown;
            cap = ncap;
        }
        size_t want = cap - used;
        if (want > (1u << 30))
            want = 1u << 30;
        int n = gzread(f, buf + used, (unsigned)want);
        if (n < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            castor__errf(err, errlen, "%s: read error: %s", path,
                         zerr == Z_ERRNO ? strerror(errno) : msg);
            rc = CASTOR_IO;
            break;
        }
        if (n == 0)
            break;
        used += (size_t)n;
        if (used > limit) {
            *longer = 1;
            break;
        }
    }
    gzclose(f);
    if (rc) {
        if (rc == CASTOR_NOMEM)
            castor__errf(err, errlen, "%s: out of memory reading the file", path);
        free(buf);
        return rc;
    }
    *out = buf;
    *len = used;
    return CASTOR_OK;
}

int castor__idx_read(const char *path, size_t max_count, castor__idx *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!max_count)
        max_count = DEFAULT_MAX_COUNT;
    /* The header first, to learn how many bytes the file may hold at most. */
    unsigned char *bytes = NULL;
    size_t len = 0;
    int longer = 0;
    int rc = read_bounded(path, 4 + 16, &bytes, &len, &longer, err, errlen);
    if (rc)
        return rc;
    if (len == 0) {
        free(bytes);
        castor__errf(err, errlen, "%s: empty file", path);
        return CASTOR_FORMAT;
    }
    castor__idx shape;
    size_t hdr;
    memset(&shape, 0, sizeof shape);
    rc = parse_header(bytes, len, path, max_count, &shape, &hdr, err, errlen);
    free(bytes);
    if (rc)
        return rc;
    size_t need = hdr + shape.count * (size_t)elem_size(shape.type);
    if ((rc = read_bounded(path, need, &bytes, &len, &longer, err, errlen)))
        return rc;
    if (longer)
        len = need + 1;  /* enough for parse to report trailing bytes */
    if (len > need + 1)
        len = need + 1;
    rc = castor__idx_parse(bytes, len, path, max_count, out, err, errlen);
    free(bytes);
    return rc;
}

void castor__idx_free(castor__idx *idx)
{
    if (!idx)
        return;
    free(idx->values);
    memset(idx, 0, sizeof *idx);
}
