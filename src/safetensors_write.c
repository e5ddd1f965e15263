/* safetensors: the atomic writer (temporary file, fsync, rename, directory
 * fsync). See safetensors.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* getrandom, GNU strerror_r */
#endif
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "castor.h"
#include "util.h"

/* ---- writing --------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        char *grown = realloc(b->p, cap);
        if (!grown) {
            b->oom = 1;
            return;
        }
        b->p = grown;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_size(sbuf *b, size_t v)
{
    char num[32];
    int w = snprintf(num, sizeof num, "%zu", v);
    sb_put(b, num, (size_t)w);
}

/* A JSON string: quotes, backslashes and control characters escaped; the
 * rest (checked UTF-8) as it is. */
static void sb_json_str(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, p, 1);
        }
    }
    sb_put(b, "\"", 1);
}


/* Build the header; fills *header (padded so that 8 + length is a multiple
 * of 8) and *data_len. */
static int build_header(const char *path, const castor__st_out *tensors, size_t n_tensors,
                        const castor__st_kv *meta, size_t n_meta, sbuf *hb, size_t *data_len,
                        char *err, size_t errlen)
{
    size_t bad;
    char shown[CASTOR__ST_SHOWN];
    sb_str(hb, "{");
    int first = 1;
    if (n_meta) {
        sb_str(hb, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            if (!meta[i].key || !meta[i].value ||
                !castor__st_utf8_ok((const unsigned char *)meta[i].key, strlen(meta[i].key), &bad) ||
                !castor__st_utf8_ok((const unsigned char *)meta[i].value, strlen(meta[i].value), &bad)) {
                castor__errf(err, errlen, "%s: metadata entry %zu is missing or not UTF-8", path,
                             i);
                return CASTOR_INVALID;
            }
            if (i)
                sb_str(hb, ",");
            sb_json_str(hb, meta[i].key);
            sb_str(hb, ":");
            sb_json_str(hb, meta[i].value);
        }
        sb_str(hb, "}");
        first = 0;
    }
    size_t offset = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        const castor__st_out *t = &tensors[i];
        if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0 ||
            !castor__st_utf8_ok((const unsigned char *)t->name, strlen(t->name), &bad) || t->rank < 0 ||
            t->rank > CASTOR__ST_MAX_RANK) {
            castor__errf(err, errlen, "%s: tensor %zu has a bad name or rank", path, i);
            return CASTOR_INVALID;
        }
        size_t count = 1, bytes, end;
        for (int d = 0; d < t->rank; d++)
            if (!castor__mul_ok(count, t->shape[d], &count)) {
                castor__errf(err, errlen, "%s: tensor '%s' is too large", path,
                             castor__st_printable(t->name, shown, sizeof shown));
                return CASTOR_INVALID;
            }
        if (!castor__mul_ok(count, sizeof(float), &bytes) || (end = offset + bytes) < offset ||
            (double)end > CASTOR__ST_JSON_MAX_EXACT || (count && !t->data)) {
            castor__errf(err, errlen, "%s: tensor '%s' is too large or has no data", path,
                         castor__st_printable(t->name, shown, sizeof shown));
            return CASTOR_INVALID;
        }
        if (!first)
            sb_str(hb, ",");
        first = 0;
        sb_json_str(hb, t->name);
        sb_str(hb, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t->rank; d++) {
            if (d)
                sb_str(hb, ",");
            sb_size(hb, t->shape[d]);
        }
        sb_str(hb, "],\"data_offsets\":[");
        sb_size(hb, offset);
        sb_str(hb, ",");
        sb_size(hb, end);
        sb_str(hb, "]}");
        offset = end;
    }
    sb_str(hb, "}");
    while (!hb->oom && (8 + hb->len) % 8)
        sb_str(hb, " ");
    if (hb->oom) {
        castor__errf(err, errlen, "%s: out of memory for the header", path);
        return CASTOR_NOMEM;
    }
    *data_len = offset;
    return CASTOR_OK;
}

int castor__st_write(const char *path, const castor__st_out *tensors, size_t n_tensors,
                     const castor__st_kv *meta, size_t n_meta, char *err, size_t errlen)
{
    if (!path || !*path) {
        castor__errf(err, errlen, "no file name given");
        return CASTOR_INVALID;
    }
    if ((n_tensors && !tensors) || (n_meta && !meta)) {
        castor__errf(err, errlen, "%s: no tensors or metadata given", path);
        return CASTOR_INVALID;
    }
    sbuf hb = {0};
    size_t data_len = 0;
    int rc = build_header(path, tensors, n_tensors, meta, n_meta, &hb, &data_len, err, errlen);
    if (rc) {
        free(hb.p);
        return rc;
    }

    castor__atomic_file af;
    if ((rc = castor__atomic_begin(&af, path, err, errlen))) {
        free(hb.p);
        return rc;
    }
    unsigned char lenbuf[8];
    uint64_t hlen = hb.len;
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)(hlen >> (8 * i));
    int failed = castor__atomic_write(&af, lenbuf, 8) || castor__atomic_write(&af, hb.p, hb.len);
    for (size_t i = 0; i < n_tensors && !failed; i++) {
        size_t count = 1;
        for (int d = 0; d < tensors[i].rank; d++)
            count *= tensors[i].shape[d];  /* checked in build_header */
        failed = count && castor__atomic_write(&af, tensors[i].data, count * sizeof(float));
    }
    /* (errno still the write's when abort reads it) */
    rc = failed ? castor__atomic_abort(&af, "write failed", err, errlen)
                : castor__atomic_commit(&af, err, errlen);
    free(hb.p);
    return rc;
}
