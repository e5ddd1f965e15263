/* safetensors: the untrusting reader (parse and validate; read a file). See safetensors.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* GNU strerror_r: also when built alone (tests/fuzz) */
#endif
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "castor.h"
#include "util.h"

/* ---- UTF-8 ---------------------------------------------------------------- */

/* The length of the valid UTF-8 sequence (no NUL, no surrogate, no overlong
 * form) at s[0..avail), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    size_t need;
    unsigned min;
    if (c == 0)
        return 0;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        min = 0x10000;
    } else {
        return 0;
    }
    if (avail <= need)
        return 0;
    unsigned cp = c & (0x3Fu >> need);
    for (size_t k = 1; k <= need; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return need + 1;
}

int castor__st_utf8_ok(const unsigned char *s, size_t len, size_t *bad)
{
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_seq(s + i, len - i);
        if (!n) {
            *bad = i;
            return 0;
        }
        i += n;
    }
    return 1;
}

/* ---- text from a file, for messages ---------------------------------------- */

const char *castor__st_printable(const char *s, char *buf, size_t len)
{
    if (!buf || len == 0)
        return "";
    if (!s)
        s = "(null)";
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, fit = 0, room = len - 1;
    int cut = 0;
    while (*p) {
        char piece[16];
        size_t n, adv;
        unsigned c = *p;
        /* NUL ends s, and is never a continuation byte: utf8_seq stops there. */
        size_t seq = c >= 0x80 ? utf8_seq(p, 5) : 0;  /* 5: more than any sequence needs */
        if (c == '\\') {
            memcpy(piece, "\\\\", 2);
            n = 2;
            adv = 1;
        } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && !seq)) {
            snprintf(piece, sizeof piece, "\\x%02x", c);
            n = 4;
            adv = 1;
        } else if (c == 0xC2 && seq == 2 && p[1] < 0xA0) {
            /* U+0080..U+009F, the C1 controls (0x9B is a terminal's CSI) */
            snprintf(piece, sizeof piece, "\\x%02x\\x%02x", c, p[1]);
            n = 8;
            adv = 2;
        } else {
            n = adv = c < 0x80 ? 1 : seq;
            memcpy(piece, p, n);
        }
        if (n > room - o) {
            cut = 1;
            break;
        }
        memcpy(buf + o, piece, n);
        o += n;
        p += adv;
        if (room - o >= 3)
            fit = o;  /* "..." would still fit after this */
    }
    if (cut) {
        o = fit;
        for (int k = 0; k < 3 && o < room; k++)
            buf[o++] = '.';
    }
    buf[o] = '\0';
    return buf;
}

/* ---- reading --------------------------------------------------------------- */

void castor__st_free(castor__st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->tensors);
    free(f->meta);
    free(f->owned);
    memset(f, 0, sizeof *f);
}

/* A JSON number that is a whole number in [0, 2^53] (and fits size_t). */
static int json_size(const cJSON *v, size_t *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > CASTOR__ST_JSON_MAX_EXACT || d != floor(d) || d > (double)SIZE_MAX)
        return 0;
    *out = (size_t)d;
    return 1;
}

/* A name from the file, escaped and cut for a message (see safetensors.h). */
#define SHOW(s, buf) castor__st_printable((s), (buf), sizeof(buf))

static int parse_tensor(const cJSON *item, const char *name, size_t data_len,
                        castor__st_tensor *t, char *err, size_t errlen)
{
    const char *key = item->string;
    char k[CASTOR__ST_SHOWN], v[CASTOR__ST_SHOWN];
    if (!cJSON_IsObject(item)) {
        castor__errf(err, errlen, "%s: tensor '%s' is not a JSON object", name, SHOW(key, k));
        return CASTOR_FORMAT;
    }
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (const cJSON *f = item->child; f; f = f->next) {
        const cJSON **slot = NULL;
        if (strcmp(f->string, "dtype") == 0)
            slot = &dtype;
        else if (strcmp(f->string, "shape") == 0)
            slot = &shape;
        else if (strcmp(f->string, "data_offsets") == 0)
            slot = &offsets;
        else {
            castor__errf(err, errlen, "%s: tensor '%s' has an unknown field '%s'", name,
                         SHOW(key, k), SHOW(f->string, v));
            return CASTOR_FORMAT;
        }
        if (*slot) {
            castor__errf(err, errlen, "%s: tensor '%s' has field '%s' twice", name, SHOW(key, k),
                         f->string);
            return CASTOR_FORMAT;
        }
        *slot = f;
    }
    if (!dtype || !shape || !offsets) {
        castor__errf(err, errlen, "%s: tensor '%s' has no '%s'", name, SHOW(key, k),
                     !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
        return CASTOR_FORMAT;
    }
    if (!cJSON_IsString(dtype)) {
        castor__errf(err, errlen, "%s: tensor '%s': dtype is not a string", name, SHOW(key, k));
        return CASTOR_FORMAT;
    }
    if (strcmp(dtype->valuestring, "F32") != 0) {
        castor__errf(err, errlen, "%s: tensor '%s' has dtype '%s'; castor reads only F32", name,
                     SHOW(key, k), SHOW(dtype->valuestring, v));
        return CASTOR_FORMAT;
    }
    if (!cJSON_IsArray(shape)) {
        castor__errf(err, errlen, "%s: tensor '%s': shape is not an array", name, SHOW(key, k));
        return CASTOR_FORMAT;
    }
    int rank = 0;
    size_t count = 1;
    for (const cJSON *d = shape->child; d; d = d->next) {
        if (rank == CASTOR__ST_MAX_RANK) {
            castor__errf(err, errlen, "%s: tensor '%s' has more than %d dimensions", name,
                         SHOW(key, k), CASTOR__ST_MAX_RANK);
            return CASTOR_FORMAT;
        }
        size_t dim;
        if (!json_size(d, &dim)) {
            castor__errf(err, errlen, "%s: tensor '%s': dimension %d of its shape is not a whole "
                         "number >= 0", name, SHOW(key, k), rank);
            return CASTOR_FORMAT;
        }
        if (!castor__mul_ok(count, dim, &count)) {
            castor__errf(err, errlen, "%s: tensor '%s': the shape's element count overflows",
                         name, SHOW(key, k));
            return CASTOR_FORMAT;
        }
        t->shape[rank++] = dim;
    }
    size_t bytes;
    if (!castor__mul_ok(count, sizeof(float), &bytes)) {
        castor__errf(err, errlen, "%s: tensor '%s': the shape's byte count overflows", name,
                     SHOW(key, k));
        return CASTOR_FORMAT;
    }
    size_t begin, end;
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_size(offsets->child, &begin) || !json_size(offsets->child->next, &end)) {
        castor__errf(err, errlen, "%s: tensor '%s': data_offsets is not a pair of whole numbers "
                     ">= 0", name, SHOW(key, k));
        return CASTOR_FORMAT;
    }
    if (begin > end) {
        castor__errf(err, errlen, "%s: tensor '%s': data_offsets [%zu, %zu] end before they "
                     "begin", name, SHOW(key, k), begin, end);
        return CASTOR_FORMAT;
    }
    if (end > data_len) {
        castor__errf(err, errlen, "%s: tensor '%s': data_offsets [%zu, %zu] go past the end of "
                     "the %zu-byte data section (truncated file?)", name, SHOW(key, k), begin, end,
                     data_len);
        return CASTOR_FORMAT;
    }
    if (end - begin != bytes) {
        castor__errf(err, errlen, "%s: tensor '%s': data_offsets [%zu, %zu] hold %zu bytes, its "
                     "shape needs %zu", name, SHOW(key, k), begin, end, end - begin, bytes);
        return CASTOR_FORMAT;
    }
    t->rank = rank;
    t->count = count;
    t->begin = begin;
    t->end = end;
    t->name = strdup(key);
    if (!t->name) {
        castor__errf(err, errlen, "%s: out of memory", name);
        return CASTOR_NOMEM;
    }
    return CASTOR_OK;
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_by_offset(const void *a, const void *b)
{
    const castor__st_tensor *x = *(const castor__st_tensor *const *)a;
    const castor__st_tensor *y = *(const castor__st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Names must be unique: sorted copies of the pointers, neighbours compared. */
static int check_unique(char **names, size_t n, const char *name, const char *what, char *err,
                        size_t errlen)
{
    char shown[CASTOR__ST_SHOWN];
    if (n < 2)
        return CASTOR_OK;
    qsort(names, n, sizeof *names, cmp_str_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            castor__errf(err, errlen, "%s: %s '%s' appears twice", name, what,
                         SHOW(names[i], shown));
            return CASTOR_FORMAT;
        }
    return CASTOR_OK;
}

/* The tensors must cover the data section exactly: sorted by offset, each
 * must begin where the previous one ended, and the last end at data_len. */
static int check_coverage(const castor__st_file *f, const char *name, char *err, size_t errlen)
{
    if (f->n_tensors == 0) {
        if (f->data_len) {
            castor__errf(err, errlen, "%s: the %zu-byte data section belongs to no tensor", name,
                         f->data_len);
            return CASTOR_FORMAT;
        }
        return CASTOR_OK;
    }
    const castor__st_tensor **order = malloc(f->n_tensors * sizeof *order);
    if (!order) {
        castor__errf(err, errlen, "%s: out of memory", name);
        return CASTOR_NOMEM;
    }
    for (size_t i = 0; i < f->n_tensors; i++)
        order[i] = &f->tensors[i];
    qsort(order, f->n_tensors, sizeof *order, cmp_by_offset);
    int rc = CASTOR_OK;
    size_t cursor = 0;
    const castor__st_tensor *prev = NULL;
    for (size_t i = 0; i < f->n_tensors && !rc; i++) {
        const castor__st_tensor *t = order[i];
        if (t->begin < cursor) {
            char a[CASTOR__ST_SHOWN], b[CASTOR__ST_SHOWN];
            castor__errf(err, errlen, "%s: tensors '%s' [%zu, %zu] and '%s' [%zu, %zu] overlap",
                         name, SHOW(prev->name, a), prev->begin, prev->end, SHOW(t->name, b),
                         t->begin, t->end);
            rc = CASTOR_FORMAT;
        } else if (t->begin > cursor) {
            castor__errf(err, errlen, "%s: bytes [%zu, %zu) of the data section belong to no "
                         "tensor", name, cursor, t->begin);
            rc = CASTOR_FORMAT;
        }
        cursor = t->end;
        prev = t;
    }
    if (!rc && cursor != f->data_len) {
        castor__errf(err, errlen, "%s: bytes [%zu, %zu) at the end of the data section belong "
                     "to no tensor", name, cursor, f->data_len);
        rc = CASTOR_FORMAT;
    }
    free(order);
    return rc;
}

static int parse_metadata(const cJSON *item, const char *name, castor__st_file *out, char *err,
                          size_t errlen)
{
    if (!cJSON_IsObject(item)) {
        castor__errf(err, errlen, "%s: __metadata__ is not a JSON object", name);
        return CASTOR_FORMAT;
    }
    size_t n = 0;
    for (const cJSON *v = item->child; v; v = v->next)
        n++;
    if (n == 0)
        return CASTOR_OK;
    out->meta = calloc(n, sizeof *out->meta);
    if (!out->meta) {
        castor__errf(err, errlen, "%s: out of memory", name);
        return CASTOR_NOMEM;
    }
    for (const cJSON *v = item->child; v; v = v->next) {
        if (!cJSON_IsString(v)) {
            char k[CASTOR__ST_SHOWN];
            castor__errf(err, errlen, "%s: __metadata__ value '%s' is not a string", name,
                         SHOW(v->string, k));
            return CASTOR_FORMAT;
        }
        castor__st_meta *kv = &out->meta[out->n_meta];
        kv->key = strdup(v->string);
        kv->value = strdup(v->valuestring);
        out->n_meta++;
        if (!kv->key || !kv->value) {
            castor__errf(err, errlen, "%s: out of memory", name);
            return CASTOR_NOMEM;
        }
    }
    return CASTOR_OK;
}

static int parse_header(const cJSON *root, const char *name, size_t data_len,
                        castor__st_file *out, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root)) {
        castor__errf(err, errlen, "%s: the header is not a JSON object", name);
        return CASTOR_FORMAT;
    }
    size_t n = 0;
    const cJSON *meta = NULL;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (meta) {
                castor__errf(err, errlen, "%s: __metadata__ appears twice", name);
                return CASTOR_FORMAT;
            }
            meta = it;
        } else {
            n++;
        }
    }
    out->data_len = data_len;
    if (n) {
        out->tensors = calloc(n, sizeof *out->tensors);
        if (!out->tensors) {
            castor__errf(err, errlen, "%s: out of memory", name);
            return CASTOR_NOMEM;
        }
    }
    int rc;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (it == meta)
            continue;
        if (it->string[0] == '\0') {
            castor__errf(err, errlen, "%s: a tensor has an empty name", name);
            return CASTOR_FORMAT;
        }
        if ((rc = parse_tensor(it, name, data_len, &out->tensors[out->n_tensors], err, errlen)))
            return rc;
        out->n_tensors++;
    }
    if (meta && (rc = parse_metadata(meta, name, out, err, errlen)))
        return rc;

    /* Duplicates (JSON allows them, safetensors does not). */
    size_t most = out->n_tensors > out->n_meta ? out->n_tensors : out->n_meta;
    char **names = most ? malloc(most * sizeof *names) : NULL;
    if (most && !names) {
        castor__errf(err, errlen, "%s: out of memory", name);
        return CASTOR_NOMEM;
    }
    for (size_t i = 0; i < out->n_tensors; i++)
        names[i] = out->tensors[i].name;
    rc = check_unique(names, out->n_tensors, name, "tensor name", err, errlen);
    if (!rc) {
        for (size_t i = 0; i < out->n_meta; i++)
            names[i] = out->meta[i].key;
        rc = check_unique(names, out->n_meta, name, "__metadata__ key", err, errlen);
    }
    free(names);
    if (rc)
        return rc;
    return check_coverage(out, name, err, errlen);
}

int castor__st_parse(const unsigned char *bytes, size_t len, const char *name,
                     castor__st_file *out, char *err, size_t errlen)
{
    if (!out)
        return CASTOR_MISUSE;
    memset(out, 0, sizeof *out);
    if (!name)
        name = "(memory)";
    if (!bytes && len)
        return CASTOR_MISUSE;
    if (len == 0) {
        castor__errf(err, errlen, "%s: empty file", name);
        return CASTOR_FORMAT;
    }
    if (len < 8) {
        castor__errf(err, errlen, "%s: truncated: %zu bytes, too short for the 8-byte header "
                     "length of a safetensors file", name, len);
        return CASTOR_FORMAT;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | bytes[i];
    if (hlen < 2) {
        castor__errf(err, errlen, "%s: header length %llu is too small for a JSON object", name,
                     (unsigned long long)hlen);
        return CASTOR_FORMAT;
    }
    if (hlen > CASTOR__ST_MAX_HEADER) {
        castor__errf(err, errlen, "%s: header length %llu is over the %llu-byte limit (not a "
                     "safetensors file?)", name, (unsigned long long)hlen,
                     (unsigned long long)CASTOR__ST_MAX_HEADER);
        return CASTOR_FORMAT;
    }
    if (hlen > len - 8) {
        castor__errf(err, errlen, "%s: header length %llu is larger than the %zu bytes after it "
                     "(truncated file?)", name, (unsigned long long)hlen, len - 8);
        return CASTOR_FORMAT;
    }
    const unsigned char *header = bytes + 8;
    size_t n = (size_t)hlen;
    if (header[0] != '{') {
        castor__errf(err, errlen, "%s: the header does not start with '{' (not a safetensors "
                     "file?)", name);
        return CASTOR_FORMAT;
    }
    size_t bad;
    if (!castor__st_utf8_ok(header, n, &bad)) {
        castor__errf(err, errlen, "%s: the header is not valid UTF-8 (byte %zu of it)", name,
                     bad);
        return CASTOR_FORMAT;
    }
    /* cJSON gets a copy of exactly the header, so that nothing it does can
     * reach the data section (and the fuzzer's ASan sees any over-read). */
    char *text = malloc(n);
    if (!text) {
        castor__errf(err, errlen, "%s: out of memory for a %zu-byte header", name, n);
        return CASTOR_NOMEM;
    }
    memcpy(text, header, n);
    const char *end = NULL;
    /* cJSON writes a process-wide error position on every parse: castor's
     * threads take turns, so that they never write it at once (the only
     * state castor shares between handles; see castor.h). */
    static pthread_mutex_t cjson_parse = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&cjson_parse);
    cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    pthread_mutex_unlock(&cjson_parse);
    if (!root) {
        size_t at = end && end >= text && end <= text + n ? (size_t)(end - text) : 0;
        free(text);
        castor__errf(err, errlen, "%s: the header is not valid JSON (near byte %zu of it)", name,
                     at);
        return CASTOR_FORMAT;
    }
    /* After the object only padding (whitespace) may follow. */
    for (const char *p = end; p < text + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            size_t at = (size_t)(p - text);
            cJSON_Delete(root);
            free(text);
            castor__errf(err, errlen, "%s: the header has bytes after its JSON object (byte %zu "
                         "of it)", name, at);
            return CASTOR_FORMAT;
        }
    free(text);
    int rc = parse_header(root, name, len - 8 - n, out, err, errlen);
    cJSON_Delete(root);
    if (rc) {
        castor__st_free(out);
        return rc;
    }
    out->data = bytes + 8 + n;
    return CASTOR_OK;
}

int castor__st_read(const char *path, castor__st_file *out, char *err, size_t errlen)
{
    char eb[128];
    if (!out)
        return CASTOR_MISUSE;
    memset(out, 0, sizeof *out);
    if (!path || !*path) {
        castor__errf(err, errlen, "no file name given");
        return CASTOR_INVALID;
    }
    struct stat st;
    int fd = castor__open_regular(path, "a safetensors file", &st, err, errlen);
    if (fd < 0)
        return CASTOR_IO;
    if (st.st_size == 0) {
        castor__errf(err, errlen, "%s: empty file", path);
        close(fd);
        return CASTOR_FORMAT;
    }
    if ((uintmax_t)st.st_size > (uintmax_t)SIZE_MAX / 2) {
        castor__errf(err, errlen, "%s: file too large (%jd bytes)", path, (intmax_t)st.st_size);
        close(fd);
        return CASTOR_FORMAT;
    }
    size_t size = (size_t)st.st_size;
    /* The whole file is read at once: its size is what is on disk, not what
     * a header claims, so a lying header cannot make this allocation grow. */
    unsigned char *buf = malloc(size);
    if (!buf) {
        castor__errf(err, errlen, "%s: out of memory for %zu bytes", path, size);
        close(fd);
        return CASTOR_NOMEM;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            castor__errf(err, errlen, "%s: read failed: %s", path, castor__strerror(errno, eb, sizeof eb));
            free(buf);
            close(fd);
            return CASTOR_IO;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        castor__errf(err, errlen, "%s: the file shrank while it was read (%zu of %zu bytes)",
                     path, got, size);
        free(buf);
        return CASTOR_IO;
    }
    int rc = castor__st_parse(buf, size, path, out, err, errlen);
    if (rc) {
        free(buf);
        return rc;
    }
    out->owned = buf;
    return CASTOR_OK;
}

const castor__st_tensor *castor__st_find(const castor__st_file *f, const char *name)
{
    for (size_t i = 0; f && name && i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *castor__st_meta_get(const castor__st_file *f, const char *key)
{
    for (size_t i = 0; f && key && i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}
