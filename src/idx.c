/*
 * IDX files (the MNIST format), plain or gzip, read as untrusted input.
 *
 * The header is checked field by field and the element count against
 * overflow and a cap before anything is allocated for the data. The data is
 * then read in bounded chunks and the value array grows only as decompressed
 * bytes actually arrive, so a header that lies costs no more memory than the
 * file really holds; reading stops one byte past what the header promises,
 * so a gzip bomb costs no more time than an honest file either.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* O_CLOEXEC, GNU strerror_r: also when built alone (tests/fuzz) */
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dataset.h"
#include "util.h"

#define DEFAULT_MAX_COUNT ((size_t)1 << 31)
#define MAX_RANK 4
#define HEADER_MAX (4 + 4 * MAX_RANK)
/* Bytes asked for at a time; a multiple of every element size so that no
 * element straddles two chunks. */
#define READ_CHUNK ((size_t)1 << 20)

_Static_assert(sizeof(float) == 4, "float32 elements are copied bit for bit");

static size_t elem_size(int type)
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

/* n big-endian elements of `type` at src into floats at dst. */
static void decode(float *dst, const unsigned char *src, size_t n, int type)
{
    switch (type) {
    case 0x08:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)src[i];
        break;
    case 0x09:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)(int8_t)src[i];
        break;
    case 0x0B:
        for (size_t i = 0; i < n; i++, src += 2)
            dst[i] = (float)(int16_t)(uint16_t)((unsigned)src[0] << 8 | src[1]);
        break;
    case 0x0C:
        for (size_t i = 0; i < n; i++, src += 4)
            dst[i] = (float)(int32_t)be32(src);
        break;
    case 0x0D:
        for (size_t i = 0; i < n; i++, src += 4) {
            uint32_t bits = be32(src);
            memcpy(&dst[i], &bits, sizeof bits);
        }
        break;
    default:
        for (size_t i = 0; i < n; i++, src += 8) {
            uint64_t bits = (uint64_t)be32(src) << 32 | be32(src + 4);
            double d;
            memcpy(&d, &bits, sizeof d);
            dst[i] = (float)d;
        }
        break;
    }
}

/* Checks the header in bytes[0..len) and fills out's shape and *data_bytes
 * (what must follow the header). len may be short of the full header: that
 * is reported as truncation, after the fields that are present. */
static int parse_header(const unsigned char *bytes, size_t len, const char *name,
                        size_t max_count, castor__idx *out, size_t *header_bytes,
                        size_t *data_bytes, char *err, size_t errlen)
{
    if (len < 4) {
        castor__errf(err, errlen, "%s: truncated: %zu bytes, too short for an IDX header", name,
                     len);
        return CASTOR_FORMAT;
    }
    if (bytes[0] != 0 || bytes[1] != 0) {
        castor__errf(err, errlen,
                     "%s: not an IDX file: bad magic %02x %02x (an IDX file starts with 00 00)",
                     name, bytes[0], bytes[1]);
        return CASTOR_FORMAT;
    }
    int type = bytes[2], rank = bytes[3];
    if (!elem_size(type)) {
        castor__errf(err, errlen,
                     "%s: unknown IDX element type code 0x%02x (known: 08 09 0b 0c 0d 0e)", name,
                     type);
        return CASTOR_FORMAT;
    }
    if (rank < 1 || rank > MAX_RANK) {
        castor__errf(err, errlen, "%s: IDX rank %d not supported (1..%d)", name, rank, MAX_RANK);
        return CASTOR_FORMAT;
    }
    size_t hdr = 4 + 4 * (size_t)rank;
    if (len < hdr) {
        castor__errf(err, errlen, "%s: truncated: the header needs %zu bytes, file has %zu", name,
                     hdr, len);
        return CASTOR_FORMAT;
    }
    size_t count = 1, bytes_needed = 0, value_bytes = 0;
    for (int i = 0; i < rank; i++) {
        uint32_t d = be32(bytes + 4 + 4 * i);
        if (d == 0) {
            if (i == 0)  /* the count of samples (or labels) */
                castor__errf(err, errlen, "%s: holds no samples (its first dimension is 0)",
                             name);
            else
                castor__errf(err, errlen, "%s: dimension %d of %d is zero", name, i + 1, rank);
            return CASTOR_FORMAT;
        }
        if (!castor__mul_ok(count, d, &count) || count > max_count) {
            castor__errf(err, errlen,
                         "%s: dimensions too large: the first %d already hold more than the "
                         "%zu elements allowed",
                         name, i + 1, max_count);
            return CASTOR_FORMAT;
        }
        out->dims[i] = d;
    }
    /* A caller's max_count may be near SIZE_MAX: the byte counts can still overflow. */
    if (!castor__mul_ok(count, elem_size(type), &bytes_needed) ||
        !castor__mul_ok(count, sizeof(float), &value_bytes) || bytes_needed > SIZE_MAX - hdr - 1) {
        castor__errf(err, errlen, "%s: dimensions too large: %zu elements do not fit in memory",
                     name, count);
        return CASTOR_FORMAT;
    }
    out->type = type;
    out->rank = rank;
    out->count = count;
    *header_bytes = hdr;
    *data_bytes = bytes_needed;
    return CASTOR_OK;
}

int castor__idx_parse(const unsigned char *bytes, size_t len, const char *name,
                      size_t max_count, castor__idx *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!name)
        name = "(memory)";
    if (len == 0) {
        castor__errf(err, errlen, "%s: empty file", name);
        return CASTOR_FORMAT;
    }
    castor__idx shape;
    memset(&shape, 0, sizeof shape);
    size_t hdr, need;
    int rc = parse_header(bytes, len, name, max_count ? max_count : DEFAULT_MAX_COUNT, &shape,
                          &hdr, &need, err, errlen);
    if (rc)
        return rc;
    if (len - hdr != need) {
        castor__errf(err, errlen, "%s: %s: header says %zu bytes of data, file has %zu", name,
                     len - hdr < need ? "truncated" : "trailing bytes after the data", need,
                     len - hdr);
        return CASTOR_FORMAT;
    }
    shape.values = malloc(shape.count * sizeof(float));
    if (!shape.values) {
        castor__errf(err, errlen, "%s: out of memory for %zu values", name, shape.count);
        return CASTOR_NOMEM;
    }
    decode(shape.values, bytes + hdr, shape.count, shape.type);
    *out = shape;
    return CASTOR_OK;
}

/* ---- the bytes of a file: as they are, or inflated --------------------------
 *
 * A file that starts with the gzip magic 1f 8b is gzip; anything else is
 * read as it is. A gzip file may hold several members one after another
 * (RFC 1952; what `cat a.gz b.gz` makes), read as one stream, as gzip -d
 * does. Anything else after the last member is refused: zlib's gzread would
 * drop it silently, while a plain file with bytes after its data is refused. */

#define IN_SIZE ((size_t)1 << 17)

typedef struct idx_src {
    int fd;
    const char *path;
    int gzip;           /* 1: inflating */
    int zlive;          /* zs needs inflateEnd */
    int raw_eof;        /* read() has said end of file */
    int member_end;     /* a gzip member is done; what follows is still to judge */
    int cut_short;      /* the file ended inside a gzip member */
    z_stream zs;        /* next_in/avail_in: raw bytes read ahead, also when plain */
    unsigned char *in;  /* IN_SIZE bytes */
} idx_src;

/* More raw bytes after those still pending; at the end, raw_eof. */
static int refill(idx_src *s, int *rc, char *err, size_t errlen)
{
    if (s->zs.avail_in && s->zs.next_in != s->in)
        memmove(s->in, s->zs.next_in, s->zs.avail_in);
    s->zs.next_in = s->in;
    for (;;) {
        ssize_t r = read(s->fd, s->in + s->zs.avail_in, IN_SIZE - s->zs.avail_in);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            char ebuf[128];
            castor__errf(err, errlen, "%s: read error: %s", s->path,
                         castor__strerror(errno, ebuf, sizeof ebuf));
            *rc = CASTOR_IO;
            return -1;
        }
        if (r == 0)
            s->raw_eof = 1;
        s->zs.avail_in += (uInt)r;
        return 0;
    }
}

/* Takes fd (closed by src_close, also on failure); looks at the first bytes
 * to tell gzip from plain. */
static int src_open(idx_src *s, int fd, const char *path, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->path = path;
    s->in = malloc(IN_SIZE);
    if (!s->in) {
        castor__errf(err, errlen, "%s: out of memory opening the file", path);
        return CASTOR_NOMEM;
    }
    s->zs.next_in = s->in;
    int rc = CASTOR_OK;
    while (s->zs.avail_in < 2 && !s->raw_eof)
        if (refill(s, &rc, err, errlen))
            return rc;
    if (s->zs.avail_in >= 2 && s->in[0] == 0x1f && s->in[1] == 0x8b) {
        s->gzip = 1;
        int z = inflateInit2(&s->zs, 15 + 16);  /* gzip only */
        if (z != Z_OK) {
            castor__errf(err, errlen, "%s: %s starting to decompress", path,
                         z == Z_MEM_ERROR ? "out of memory" : "zlib failed");
            return z == Z_MEM_ERROR ? CASTOR_NOMEM : CASTOR_IO;
        }
        s->zlive = 1;
    }
    return CASTOR_OK;
}

static void src_close(idx_src *s)
{
    if (s->zlive)
        inflateEnd(&s->zs);
    free(s->in);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->zlive = 0;
    s->in = NULL;
}

/* Reads up to len bytes (decompressed); returns how many were read, or -1
 * with the error in err and its code in *rc. A short count means the end of
 * the data; for gzip, cut_short tells whether the stream was cut off. */
static long read_full(idx_src *s, void *buf, size_t len, int *rc, char *err, size_t errlen)
{
    unsigned char *out = buf;
    size_t got = 0;
    if (!s->gzip) {
        while (got < len) {
            if (s->zs.avail_in == 0) {
                if (s->raw_eof)
                    break;
                if (refill(s, rc, err, errlen))
                    return -1;
                continue;
            }
            size_t n = len - got < s->zs.avail_in ? len - got : s->zs.avail_in;
            memcpy(out + got, s->zs.next_in, n);
            s->zs.next_in += n;
            s->zs.avail_in -= (uInt)n;
            got += n;
        }
        return (long)got;
    }
    while (got < len) {
        if (s->member_end) {
            /* Another member, the end of the file, or garbage. */
            if (s->zs.avail_in < 2 && !s->raw_eof) {
                if (refill(s, rc, err, errlen))
                    return -1;
                continue;
            }
            if (s->zs.avail_in == 0)
                break;
            if (s->zs.avail_in < 2 || s->zs.next_in[0] != 0x1f || s->zs.next_in[1] != 0x8b) {
                castor__errf(err, errlen, "%s: trailing garbage after the gzip stream (bytes that "
                             "are not another gzip member)", s->path);
                *rc = CASTOR_FORMAT;
                return -1;
            }
            inflateReset(&s->zs);
            s->member_end = 0;
        }
        if (s->zs.avail_in == 0 && !s->raw_eof && refill(s, rc, err, errlen))
            return -1;
        s->zs.next_out = out + got;
        s->zs.avail_out = (uInt)(len - got);
        int z = inflate(&s->zs, Z_NO_FLUSH);
        got = len - s->zs.avail_out;
        if (z == Z_STREAM_END) {
            s->member_end = 1;
        } else if (z == Z_BUF_ERROR && s->zs.avail_in == 0 && s->raw_eof) {
            /* No progress, no input left: the file ends inside a member. */
            s->cut_short = 1;
            break;
        } else if (z == Z_MEM_ERROR) {
            castor__errf(err, errlen, "%s: out of memory decompressing", s->path);
            *rc = CASTOR_NOMEM;
            return -1;
        } else if (z != Z_OK && z != Z_BUF_ERROR) {
            castor__errf(err, errlen, "%s: corrupt gzip data: %s", s->path,
                         s->zs.msg ? s->zs.msg : "unknown error");
            *rc = CASTOR_FORMAT;
            return -1;
        }
    }
    return (long)got;
}

/* The values after a checked header: chunk by chunk, the array growing only
 * as far as the data that has really arrived. */
static int read_values(idx_src *src, const char *path, castor__idx *idx, size_t data_bytes,
                       int size_known, char *err, size_t errlen)
{
    size_t es = elem_size(idx->type);
    unsigned char *chunk = malloc(READ_CHUNK);
    /* With the size known (a plain regular file) the values are there to
     * read; otherwise start small and double. */
    size_t capacity = size_known ? idx->count : idx->count < 65536 ? idx->count : 65536;
    float *values = chunk ? malloc(capacity * sizeof(float)) : NULL;
    int rc = CASTOR_OK;
    if (!values) {
        castor__errf(err, errlen, "%s: out of memory for %zu values", path, capacity);
        rc = CASTOR_NOMEM;
    }
    size_t done = 0;
    while (!rc && done < idx->count) {
        size_t want = (idx->count - done) * es;
        if (want > READ_CHUNK)
            want = READ_CHUNK;
        long got = read_full(src, chunk, want, &rc, err, errlen);
        if (got < 0)
            break;
        size_t whole = (size_t)got / es;
        if (done + whole > capacity) {
            size_t grown_cap = capacity * 2 < idx->count ? capacity * 2 : idx->count;
            if (grown_cap < done + whole)
                grown_cap = done + whole;
            float *grown = realloc(values, grown_cap * sizeof(float));
            if (!grown) {
                castor__errf(err, errlen, "%s: out of memory for %zu values", path, grown_cap);
                rc = CASTOR_NOMEM;
                break;
            }
            values = grown;
            capacity = grown_cap;
        }
        decode(values + done, chunk, whole, idx->type);
        done += whole;
        if ((size_t)got < want) {
            castor__errf(err, errlen,
                         "%s: truncated: header says %zu bytes of data, file has %zu%s", path,
                         data_bytes, (done - whole) * es + (size_t)got,
                         src->cut_short ? " (the gzip stream is cut off)" : "");
            rc = CASTOR_FORMAT;
        }
    }
    if (!rc) {
        unsigned char extra;
        long got = read_full(src, &extra, 1, &rc, err, errlen);
        if (got > 0) {
            castor__errf(err, errlen,
                         "%s: trailing bytes after the data: header says %zu bytes of data, file "
                         "has more",
                         path, data_bytes);
            rc = CASTOR_FORMAT;
        } else if (got == 0 && src->cut_short) {
            /* All the data came, but not the checksum that vouches for it. */
            castor__errf(err, errlen, "%s: truncated: the gzip stream ends before its checksum",
                         path);
            rc = CASTOR_FORMAT;
        }
    }
    free(chunk);
    if (rc) {
        free(values);
        return rc;
    }
    idx->values = values;
    return CASTOR_OK;
}

int castor__idx_read(const char *path, size_t max_count, castor__idx *out, char *err,
                     size_t errlen)
{
    return castor__idx_read_samples(path, max_count, 0, out, err, errlen);
}

int castor__idx_read_samples(const char *path, size_t max_count, size_t max_sample,
                             castor__idx *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!path) {
        castor__errf(err, errlen, "(null): no IDX path given");
        return CASTOR_MISUSE;
    }
    struct stat st;
    int fd = castor__open_regular(path, "an IDX file", &st, err, errlen);
    if (fd < 0)
        return CASTOR_IO;
    idx_src src;
    int rc = src_open(&src, fd, path, err, errlen);
    if (rc) {
        src_close(&src);
        return rc;
    }

    /* The fixed part first: the rank says how much more header there is. */
    unsigned char header[HEADER_MAX];
    long got = read_full(&src, header, 4, &rc, err, errlen);
    size_t have = got > 0 ? (size_t)got : 0;
    if (got == 4 && header[3] >= 1 && header[3] <= MAX_RANK) {
        long more = read_full(&src, header + 4, 4 * (size_t)header[3], &rc, err, errlen);
        if (more < 0)
            got = -1;
        else
            have += (size_t)more;
    }
    if (got < 0) {
        src_close(&src);
        return rc;
    }
    if (have == 0) {
        castor__errf(err, errlen, "%s: %s", path,
                     src.cut_short ? "truncated: the gzip stream is cut off" : "empty file");
        src_close(&src);
        return CASTOR_FORMAT;
    }
    size_t hdr, need;
    rc = parse_header(header, have, path, max_count ? max_count : DEFAULT_MAX_COUNT, out, &hdr,
                      &need, err, errlen);
    if (rc) {
        memset(out, 0, sizeof *out);
        src_close(&src);
        return rc;
    }
    /* Known from the header: a sample too large for the caller is refused
     * before its data is read, not after (a 2 MB gzip of 1 x 65536 x 32768
     * zeros inflated to 2 GiB and took 8 GiB of floats first). */
    size_t per_sample = out->count / out->dims[0];
    if (max_sample && out->rank > 1 && per_sample > max_sample) {
        castor__errf(err, errlen, "%s: %zu features per sample, more than a model takes (%zu)", path,
                     per_sample,
                     max_sample);
        memset(out, 0, sizeof *out);
        src_close(&src);
        return CASTOR_FORMAT;
    }
    /* A plain file tells its size up front: a lying header is caught with
     * exact numbers before anything is read or allocated. */
    int size_known = 0;
    if (!src.gzip) {
        size_t file_data = (size_t)st.st_size > hdr ? (size_t)st.st_size - hdr : 0;
        if (file_data != need) {
            castor__errf(err, errlen, "%s: %s: header says %zu bytes of data, file has %zu",
                         path, file_data < need ? "truncated" : "trailing bytes after the data",
                         need, file_data);
            memset(out, 0, sizeof *out);
            src_close(&src);
            return CASTOR_FORMAT;
        }
        size_known = 1;
    }
    rc = read_values(&src, path, out, need, size_known, err, errlen);
    src_close(&src);
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}

void castor__idx_free(castor__idx *idx)
{
    if (!idx)
        return;
    free(idx->values);
    memset(idx, 0, sizeof *idx);
}
