/*
 * safetensors files (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of a JSON object (UTF-8, starting
 * with '{', possibly padded at the end with spaces)
 *
 *   {"name": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [b, e]},
 *    ..., "__metadata__": {"key": "value", ...}}
 *
 * then the data section. Offsets are bytes from the start of the data
 * section; the tensors must cover it exactly, without overlaps or holes.
 * Data is little-endian, row-major.
 *
 * The reader treats the file as untrusted: the header length is checked
 * against the file size and a cap before anything is allocated for it, and
 * every entry (dtype, shape, offsets, names, metadata) is checked before the
 * caller sees it; a file that passes is safe to index with its offsets.
 * Only F32 tensors are accepted (castor writes nothing else).
 */
#ifndef CASTOR_SAFETENSORS_H
#define CASTOR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Headers larger than this are refused (the reference implementation's cap). */
#define CASTOR__ST_MAX_HEADER ((uint64_t)100 << 20)
/* Tensors of higher rank are refused. */
#define CASTOR__ST_MAX_RANK 8
/* 2^53: integers above it are not exact in a JSON number (a double). */
#define CASTOR__ST_JSON_MAX_EXACT 9007199254740992.0

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; this reads and writes it in place");
_Static_assert(sizeof(float) == 4, "F32 is a 4-byte IEEE float");

/* Whether s[0..len) is valid UTF-8 with no NUL; else *bad = first bad offset.
 * Shared by the reader (header text) and the writer (names and metadata). */
int castor__st_utf8_ok(const unsigned char *s, size_t len, size_t *bad);

/*
 * Text from a file (a tensor name, a metadata key or value) made fit for a
 * one-line message: bytes below 0x20, DEL (0x7F), the C1 controls
 * (U+0080..U+009F) and bytes that are not UTF-8 become "\xNN", a backslash
 * "\\"; other UTF-8 passes as it is. At most len-1 bytes are written; text
 * that does not fit is cut between characters (never inside an escape or a
 * UTF-8 sequence) and ends with "...". Writes into buf and returns it ("" if
 * len is 0); s NULL prints as "(null)". Use it for every file-supplied string
 * printed into an error message:
 *
 *   char shown[CASTOR__ST_SHOWN];
 *   castor__errf(err, errlen, "%s: unexpected tensor '%s'", path,
 *                castor__st_printable(name, shown, sizeof shown));
 */
const char *castor__st_printable(const char *s, char *buf, size_t len);
/* A buffer size for castor__st_printable that shows about 80 bytes. */
#define CASTOR__ST_SHOWN 84

typedef struct castor__st_tensor {
    char *name;                        /* NUL-terminated, no NUL inside */
    int rank;                          /* 0 (a scalar) .. CASTOR__ST_MAX_RANK */
    size_t shape[CASTOR__ST_MAX_RANK];
    size_t count;                      /* product of the shape (1 for a scalar) */
    size_t begin, end;                 /* bytes in the data section; end-begin = 4*count */
} castor__st_tensor;

typedef struct castor__st_meta {
    char *key, *value;
} castor__st_meta;

typedef struct castor__st_file {
    unsigned char *owned;              /* the whole file when read by castor__st_read */
    const unsigned char *data;         /* the data section (not necessarily aligned) */
    size_t data_len;
    size_t n_tensors;
    castor__st_tensor *tensors;        /* in header order */
    size_t n_meta;
    castor__st_meta *meta;             /* __metadata__, in header order */
} castor__st_file;

/*
 * Parse and validate a safetensors image held in memory (bytes, len); name is
 * used in messages. The result points into bytes (which must outlive it) for
 * the data. On failure returns CASTOR_FORMAT (or CASTOR_NOMEM) with
 * "NAME: what is wrong" in err, and *out is empty (castor__st_free is still
 * safe to call).
 */
int castor__st_parse(const unsigned char *bytes, size_t len, const char *name,
                     castor__st_file *out, char *err, size_t errlen);

/* Read a file and parse it; the file's bytes are owned by *out. CASTOR_IO for
 * a file that cannot be opened or read, or is no regular file (a directory,
 * a FIFO, a device: refused without waiting on it or reading it),
 * CASTOR_FORMAT for bad contents (including an empty file). */
int castor__st_read(const char *path, castor__st_file *out, char *err, size_t errlen);

void castor__st_free(castor__st_file *f);

/* The tensor or metadata value of that name, or NULL. */
const castor__st_tensor *castor__st_find(const castor__st_file *f, const char *name);
const char *castor__st_meta_get(const castor__st_file *f, const char *key);

/* A metadata entry to write. */
typedef struct castor__st_kv {
    const char *key, *value;
} castor__st_kv;

/* A tensor to write: count F32 values (the product of shape) from data. */
typedef struct castor__st_out {
    const char *name;
    int rank;
    size_t shape[CASTOR__ST_MAX_RANK];
    const float *data;
} castor__st_out;

/*
 * Write a safetensors file atomically: a temporary file "PATH.tmp.XXXXXX" in
 * the same directory, written, fsync'ed and renamed over path, then the
 * directory fsync'ed. The tensors are laid out in the order given, one after
 * another; the header is padded with spaces so that the data section starts
 * at a multiple of 8 bytes. A new file's mode is 0666 less the umask (or
 * what the directory's default ACL gives); a file replaced keeps its mode.
 * On failure the temporary file is removed, an existing file at path is
 * untouched, and CASTOR_IO (CASTOR_INVALID for bad arguments, CASTOR_NOMEM)
 * is returned with "PATH: what is wrong" in err; CASTOR_NOT_DURABLE when
 * the file is in place but the directory's fsync failed.
 */
int castor__st_write(const char *path, const castor__st_out *tensors, size_t n_tensors,
                     const castor__st_kv *meta, size_t n_meta, char *err, size_t errlen);

#endif
