/* safetensors: the atomic writer (temporary file, fsync, rename, directory
 * fsync). See safetensors.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* getrandom, GNU strerror_r */
#endif
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

static int write_all(int fd, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
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

/* Creates tmp, whose last 6 bytes (after plen + 5 bytes of "PATH.tmp.") are
 * replaced by random letters and digits, as mkostemp would; but with
 * open(O_CREAT | O_EXCL, mode), so that the kernel applies the umask (or the
 * directory's default ACL) to mode, as for any file a program creates.
 * (mkostemp makes 0600; reading the umask to fchmod after is racy, umask()
 * sets it process-wide, or Linux-only, /proc/self/status, and blind to
 * default ACLs.) Returns the descriptor, or -1 with errno. */
static int create_temporary(char *tmp, size_t plen, mode_t mode)
{
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char *x = tmp + plen + 5;
    for (int attempt = 0; attempt < 1000; attempt++) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
            /* No entropy yet: time, process and attempt, mixed (splitmix64).
             * O_EXCL keeps a guessed name from doing harm. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 42) ^
                (uint64_t)(uintptr_t)&ts ^ ((uint64_t)attempt << 20);
            r += 0x9E3779B97F4A7C15ull;
            r = (r ^ (r >> 30)) * 0xBF58476D1CE4E5B9ull;
            r = (r ^ (r >> 27)) * 0x94D049BB133111EBull;
            r ^= r >> 31;
        }
        for (int i = 0; i < 6; i++, r /= 62)
            x[i] = digits[r % 62];
        int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

int castor__st_write(const char *path, const castor__st_out *tensors, size_t n_tensors,
                     const castor__st_kv *meta, size_t n_meta, char *err, size_t errlen)
{
    char eb[128];
    if (!path || !*path) {
        castor__errf(err, errlen, "no file name given");
        return CASTOR_INVALID;
    }
    if ((n_tensors && !tensors) || (n_meta && !meta)) {
        castor__errf(err, errlen, "%s: no tensors or metadata given", path);
        return CASTOR_INVALID;
    }
    /* A new file gets what open() makes of 0666 (the umask, or the
     * directory's default ACL), as any file a program creates. An existing
     * file keeps its permissions: the temporary file is made 0600, so that
     * no one it does not allow can open it meanwhile, then given them. */
    struct stat st;
    int keep_mode = 0;
    mode_t mode = 0;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            castor__errf(err, errlen, "%s: is a directory", path);
            return CASTOR_IO;
        }
        if (!S_ISREG(st.st_mode)) {
            castor__errf(err, errlen, "%s: exists and is not a regular file", path);
            return CASTOR_IO;
        }
        mode = st.st_mode & 07777;
        keep_mode = 1;
    }

    sbuf hb = {0};
    size_t data_len = 0;
    int rc = build_header(path, tensors, n_tensors, meta, n_meta, &hb, &data_len, err, errlen);
    if (rc) {
        free(hb.p);
        return rc;
    }

    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof ".tmp.XXXXXX");
    char *dir = malloc(plen + 2);
    if (!tmp || !dir) {
        free(tmp);
        free(dir);
        free(hb.p);
        castor__errf(err, errlen, "%s: out of memory", path);
        return CASTOR_NOMEM;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    /* The directory to fsync after the rename. */
    const char *slash = strrchr(path, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
    }

    const char *what = NULL;
    int created = 0;
    int fd = create_temporary(tmp, plen, keep_mode ? 0600 : 0666);
    if (fd < 0) {
        what = "cannot create the temporary file";
        goto fail;
    }
    created = 1;
    unsigned char lenbuf[8];
    uint64_t hlen = hb.len;
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)(hlen >> (8 * i));
    if (keep_mode && fchmod(fd, mode) != 0) {
        what = "cannot set the permissions of the temporary file";
        goto fail;
    }
    if (write_all(fd, lenbuf, 8) || write_all(fd, hb.p, hb.len)) {
        what = "write failed";
        goto fail;
    }
    for (size_t i = 0; i < n_tensors; i++) {
        size_t count = 1;
        for (int d = 0; d < tensors[i].rank; d++)
            count *= tensors[i].shape[d];  /* checked in build_header */
        if (count && write_all(fd, tensors[i].data, count * sizeof(float))) {
            what = "write failed";
            goto fail;
        }
    }
    if (fsync(fd) != 0) {
        what = "fsync failed";
        goto fail;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        what = "close failed";
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        what = "cannot rename the temporary file over it";
        goto fail;
    }
    /* The rename is durable once the directory is. A filesystem that cannot
     * fsync a directory (EINVAL) has nothing more to do. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL)) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        castor__errf(err, errlen, "%s: written, but fsync of the directory %s failed (the file "
                     "may not survive a crash): %s", path, dir, castor__strerror(e, eb, sizeof eb));
        free(tmp);
        free(dir);
        free(hb.p);
        return CASTOR_IO;
    }
    close(dfd);
    free(tmp);
    free(dir);
    free(hb.p);
    return CASTOR_OK;

fail: {
        int e = errno;
        if (fd >= 0)
            close(fd);
        if (created)
            unlink(tmp);
        /* The reason before the temporary file's name: with a long path the
         * message is cut at the end, and the reason is what matters. */
        castor__errf(err, errlen, "%s: %s: %s (the temporary file %s)", path, what,
                     castor__strerror(e, eb, sizeof eb), tmp);
        free(tmp);
        free(dir);
        free(hb.p);
        return CASTOR_IO;
    }
}
