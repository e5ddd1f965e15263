/* Checkpoint files for the command line: see ckpt.h. */
#include "ckpt.h"

#include "src/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".safetensors"
#define CKPT_DIGITS 12
/* The library refuses headers above this (src/safetensors.h); so do we. */
#define CKPT_MAX_HEADER ((uint64_t)100 << 20)

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* What goes between dir and a name in it: "ck/" given as such gives
 * "ck/ckpt-...", not "ck//ckpt-...". */
static const char *dir_sep(const char *dir)
{
    size_t len = strlen(dir);
    return len && dir[len - 1] == '/' ? "" : "/";
}

int cli_ckpt_path(char *buf, size_t size, const char *dir, int64_t step)
{
    int n = snprintf(buf, size, "%s%s" CKPT_PREFIX "%0*" PRId64 CKPT_SUFFIX, dir, dir_sep(dir),
                     CKPT_DIGITS, step);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* The step of a name ckpt-<digits>.safetensors; -1 for any other name. With
 * exact, only names of exactly CKPT_DIGITS digits (the ones we write). */
static int64_t name_step(const char *name, int exact)
{
    size_t plen = strlen(CKPT_PREFIX), slen = strlen(CKPT_SUFFIX), len = strlen(name);
    if (len <= plen + slen || strncmp(name, CKPT_PREFIX, plen) != 0 ||
        strcmp(name + len - slen, CKPT_SUFFIX) != 0)
        return -1;
    size_t digits = len - plen - slen;
    if (digits > 18 || (exact && digits != CKPT_DIGITS))
        return -1;
    int64_t step = 0;
    for (size_t k = plen; k < plen + digits; k++) {
        if (name[k] < '0' || name[k] > '9')
            return -1;
        step = step * 10 + (name[k] - '0');
    }
    return step;
}

static int is_regular(int dfd, const char *name)
{
    struct stat st;
    return fstatat(dfd, name, &st, 0) == 0 && S_ISREG(st.st_mode);
}

int cli_ckpt_newest(const char *dir, char *buf, size_t size, int64_t *step_out, char *err,
                    size_t errlen)
{
    return cli_ckpt_newest_before(dir, INT64_MAX, buf, size, step_out, err, errlen);
}

int cli_ckpt_newest_before(const char *dir, int64_t before, char *buf, size_t size,
                           int64_t *step_out, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return fail(err, errlen, "%s: %s", dir, strerror(errno));
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step = name_step(e->d_name, 0);
        if (step <= best || step >= before || !is_regular(dirfd(d), e->d_name))
            continue;
        int n = snprintf(buf, size, "%s%s%s", dir, dir_sep(dir), e->d_name);
        if (n < 0 || (size_t)n >= size) {
            closedir(d);
            return fail(err, errlen, "%s%s%s: path too long", dir, dir_sep(dir), e->d_name);
        }
        best = step;
    }
    closedir(d);
    if (step_out)
        *step_out = best;
    return best >= 0 ? 1 : 0;
}

int cli_ckpt_lock(const char *dir, int *fd, char *err, size_t errlen)
{
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*fd < 0)
        return fail(err, errlen, "%s: %s", dir, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0)
        return 1;
    int held = errno == EWOULDBLOCK;
    close(*fd);
    *fd = -1;
    return held ? 0 : 1;
}

/* Whether name is a checkpoint's temporary file: a name cli_ckpt_path gives,
 * then ".tmp." and the six characters src/atomic_file.c picks. */
static int is_stale_name(const char *name)
{
    static const char tmp[] = ".tmp.";
    size_t len = strlen(name), base = strlen(CKPT_PREFIX) + CKPT_DIGITS + strlen(CKPT_SUFFIX);
    if (len != base + strlen(tmp) + 6 || strncmp(name + base, tmp, strlen(tmp)) != 0)
        return 0;
    char ckpt[64];
    memcpy(ckpt, name, base);
    ckpt[base] = '\0';
    if (name_step(ckpt, 1) < 0)
        return 0;
    for (const char *c = name + base + strlen(tmp); *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9')))
            return 0;
    return 1;
}

int cli_ckpt_remove_stale(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return fail(err, errlen, "%s: %s", dir, strerror(errno));
    int rc = 0, deleted = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_stale_name(e->d_name) || !is_regular(dirfd(d), e->d_name))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT)
            rc = fail(err, errlen, "cannot delete %s%s%s, left by a checkpoint write cut short: %s",
                      dir, dir_sep(dir), e->d_name, strerror(errno));
        else
            deleted++;
    }
    closedir(d);
    return rc ? rc : deleted;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int cli_ckpt_prune(const char *dir, int keep, const char *spare, char *err, size_t errlen)
{
    const char *spare_name = spare ? strrchr(spare, '/') : NULL;
    spare_name = spare_name ? spare_name + 1 : spare;
    DIR *d = opendir(dir);
    if (!d)
        return fail(err, errlen, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t count = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (name_step(e->d_name, 1) < 0 || !is_regular(dirfd(d), e->d_name))
            continue;
        if (count == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            char **grown = realloc(names, ncap * sizeof *grown);
            if (!grown) {
                rc = fail(err, errlen, "out of memory listing %s", dir);
                break;
            }
            names = grown;
            cap = ncap;
        }
        if (!(names[count] = strdup(e->d_name))) {
            rc = fail(err, errlen, "out of memory listing %s", dir);
            break;
        }
        count++;
    }
    int deleted = 0;
    if (rc == 0 && count > (size_t)keep) {
        /* Names sort as the steps do: the oldest come first. */
        qsort(names, count, sizeof *names, by_name);
        for (size_t k = 0; k < count - (size_t)keep; k++) {
            if (spare_name && strcmp(names[k], spare_name) == 0)
                continue;
            if (unlinkat(dirfd(d), names[k], 0) != 0 && errno != ENOENT)
                rc = fail(err, errlen, "cannot delete the old checkpoint %s%s%s: %s", dir,
                          dir_sep(dir), names[k], strerror(errno));
            else
                deleted++;
        }
    }
    for (size_t k = 0; k < count; k++)
        free(names[k]);
    free(names);
    closedir(d);
    return rc ? rc : deleted;
}

/* ---- __metadata__ --------------------------------------------------------------- */

static const char *meta_str(const cJSON *meta, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int meta_copy(const cJSON *meta, const char *key, char *dst, size_t size,
                     const char *path, char *err, size_t errlen)
{
    const char *v = meta_str(meta, key);
    if (!v)
        return fail(err, errlen, "%s: __metadata__ has no '%s'", path, key);
    if (strlen(v) >= size)
        return fail(err, errlen, "%s: __metadata__ '%s' is too long", path, key);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static int meta_i64(const cJSON *meta, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    const char *path, char *err, size_t errlen)
{
    const char *v = meta_str(meta, key);
    char *end = NULL;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || end == v || *end != '\0' || errno == ERANGE || x < lo || x > hi)
        return fail(err, errlen, "%s: __metadata__ '%s' is missing or not a whole number", path,
                    key);
    *out = (int64_t)x;
    return 0;
}

static int meta_f(const cJSON *meta, const char *key, double *out, const char *path, char *err,
                  size_t errlen)
{
    const char *v = meta_str(meta, key);
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || end == v || *end != '\0')
        return fail(err, errlen, "%s: __metadata__ '%s' is missing or not a number", path, key);
    *out = x;
    return 0;
}

/* src into dst (cut to fit), each byte outside printable ASCII as '?':
 * text from a file must not steer the terminal or break a line. */
static void copy_printable(char *dst, size_t size, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < size; i++)
        dst[i] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
    dst[i] = '\0';
}

static int parse_meta(const cJSON *meta, cli_ckpt_meta *m, const char *path, char *err,
                      size_t errlen)
{
    int64_t v;
    if (meta_i64(meta, "input_features", 1, INT32_MAX, &v, path, err, errlen))
        return -1;
    m->input_features = (int)v;
    if (meta_copy(meta, "layers", m->layers, sizeof m->layers, path, err, errlen) ||
        meta_copy(meta, "loss", m->loss, sizeof m->loss, path, err, errlen) ||
        meta_copy(meta, "optimizer", m->optimizer, sizeof m->optimizer, path, err, errlen) ||
        meta_f(meta, "learning_rate", &m->learning_rate, path, err, errlen) ||
        meta_f(meta, "momentum", &m->momentum, path, err, errlen) ||
        meta_f(meta, "weight_decay", &m->weight_decay, path, err, errlen))
        return -1;
    if (meta_i64(meta, "nesterov", 0, 1, &v, path, err, errlen))
        return -1;
    m->nesterov = (int)v;
    const char *seed = meta_str(meta, "seed");
    char *end = NULL;
    errno = 0;
    unsigned long long s = seed && seed[0] >= '0' && seed[0] <= '9' ? strtoull(seed, &end, 10) : 0;
    if (!seed || !end || *end != '\0' || errno == ERANGE)
        return fail(err, errlen, "%s: __metadata__ 'seed' is missing or not a whole number",
                    path);
    m->seed = (uint64_t)s;
    if (meta_i64(meta, "step", 0, INT64_MAX, &m->step, path, err, errlen) ||
        meta_i64(meta, "epoch", 0, INT64_MAX, &m->epoch, path, err, errlen) ||
        meta_i64(meta, "step_in_epoch", 0, INT64_MAX, &m->step_in_epoch, path, err, errlen) ||
        meta_i64(meta, "epoch_batch", 0, INT32_MAX, &v, path, err, errlen))
        return -1;
    m->epoch_batch = (int)v;
    /* Optional: files written before the keys lack them. */
    if (meta_str(meta, "epoch_samples") &&
        meta_i64(meta, "epoch_samples", 1, UINT32_MAX, &m->epoch_samples, path, err, errlen))
        return -1;
    m->epoch_shuffle = -1;
    if (meta_str(meta, "epoch_shuffle")) {
        if (meta_i64(meta, "epoch_shuffle", 0, 1, &v, path, err, errlen))
            return -1;
        m->epoch_shuffle = (int)v;
    }
    if (meta_str(meta, "target_epochs") &&
        meta_i64(meta, "target_epochs", 1, INT64_MAX, &m->target_epochs, path, err, errlen))
        return -1;
    /* Informational: absent or odd values are no reason to refuse the file.
     * They are printed, though, so only printable ASCII is kept. */
    copy_printable(m->strategy, sizeof m->strategy, meta_str(meta, "strategy"));
    copy_printable(m->devices, sizeof m->devices, meta_str(meta, "devices"));
    m->replicas = meta_i64(meta, "replicas", 0, INT32_MAX, &v, path, err, errlen) ? 0 : (int)v;
    m->blas_threads =
        meta_i64(meta, "blas_threads", 0, INT32_MAX, &v, path, err, errlen) ? 0 : (int)v;
    /* Checked by the library, which opened the file: read as it is. */
    const char *type = meta_str(meta, "input_type"), *shape = meta_str(meta, "input_shape");
    if (type && shape && (m->input_type = castor__ckpt_idx_type_parse(type)) != 0) {
        for (const char *p = shape; m->input_rank < 3 && *p >= '0' && *p <= '9';) {
            char *after;
            m->input_dims[m->input_rank++] = (uint32_t)strtoul(p, &after, 10);
            p = *after == 'x' ? after + 1 : after;
        }
    }
    err[0] = '\0';
    return 0;
}

int cli_ckpt_read_meta(const char *path, cli_ckpt_meta *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    unsigned char len8[8];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8 ||
        pread(fd, len8, 8, 0) != 8) {
        close(fd);
        return fail(err, errlen, "%s: not a safetensors file", path);
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--)
        hlen = hlen << 8 | len8[k];
    if (hlen == 0 || hlen > CKPT_MAX_HEADER || hlen > (uint64_t)st.st_size - 8) {
        close(fd);
        return fail(err, errlen, "%s: bad safetensors header length %" PRIu64, path, hlen);
    }
    char *text = malloc((size_t)hlen);
    if (!text) {
        close(fd);
        return fail(err, errlen, "%s: out of memory for the header", path);
    }
    size_t got = 0;
    while (got < hlen) {
        ssize_t r = pread(fd, text + got, (size_t)hlen - got, (off_t)(8 + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != hlen) {
        free(text);
        return fail(err, errlen, "%s: cannot read the header", path);
    }
    cJSON *root = cJSON_ParseWithLength(text, (size_t)hlen);
    free(text);
    const cJSON *meta = root ? cJSON_GetObjectItemCaseSensitive(root, "__metadata__") : NULL;
    int rc;
    if (!cJSON_IsObject(meta))
        rc = fail(err, errlen, "%s: no __metadata__ in the safetensors header", path);
    else
        rc = parse_meta(meta, out, path, err, errlen);
    cJSON_Delete(root);
    return rc;
}

/* What differs between two checkpoints' runs, or NULL: the settings a CLI
 * run keeps from its first step to its last. The learning rate is one (the
 * CLI never changes it): a program that changes it with
 * castor_model_set_learning_rate writes checkpoints the CLI takes for
 * another run's. */
static const char *run_differs(const cli_ckpt_meta *a, const cli_ckpt_meta *b)
{
    if (a->seed != b->seed)
        return "another seed";
    if (a->input_features != b->input_features || strcmp(a->layers, b->layers) != 0)
        return "another model";
    if (strcmp(a->loss, b->loss) != 0)
        return "another loss";
    if (strcmp(a->optimizer, b->optimizer) != 0 || a->learning_rate != b->learning_rate ||
        a->momentum != b->momentum || a->weight_decay != b->weight_decay ||
        a->nesterov != b->nesterov)
        return "another optimizer";
    return NULL;
}

int cli_ckpt_find_foreign(const char *dir, const cli_ckpt_meta *mine, char *found, size_t size,
                          char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return fail(err, errlen, "%s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (name_step(e->d_name, 1) < 0 || !is_regular(dirfd(d), e->d_name))
            continue;
        int n = snprintf(found, size, "%s%s%s", dir, dir_sep(dir), e->d_name);
        if (n < 0 || (size_t)n >= size) {
            rc = fail(err, errlen, "%s%s%s: path too long", dir, dir_sep(dir), e->d_name);
            break;
        }
        cli_ckpt_meta theirs;
        char why[CLI_PATH_MAX + 256];
        const char *differs;
        if (cli_ckpt_read_meta(found, &theirs, why, sizeof why) != 0) {
            snprintf(err, errlen, "%s", why);
            rc = 2;
        } else if ((differs = run_differs(mine, &theirs)) != NULL) {
            snprintf(err, errlen, "%s", differs);
            rc = 1;
        }
    }
    closedir(d);
    return rc;
}
