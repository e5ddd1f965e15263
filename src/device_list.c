/* The device list's syntax (device_list.h). */
#include "device_list.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "castor.h"
#include "util.h"

static int list_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int list_fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return CASTOR_INVALID;
}

/* The first len characters of text as a whole non-negative decimal number
 * in [lo, hi], or -1. Digits only: no sign, no spaces; leading zeros are
 * fine, however many. */
static long parse_count_n(const char *text, size_t len, long lo, long hi)
{
    if (!text || len == 0)
        return -1;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -1;
        v = v * 10 + (text[i] - '0');
        if (v > hi)
            return -1;
    }
    return v < lo ? -1 : v;
}

/* Whether the len characters at tok start with word (wlen characters), in
 * either ASCII case, as the strategies' names are read. */
static int starts_with(const char *tok, size_t len, const char *word, size_t wlen)
{
    return len >= wlen && castor__ascii_ieqn(tok, word, wlen);
}

enum { TIMES_OK, TIMES_BAD_N, TIMES_BAD_K };

/* "N" or "NxK" (x in either case) at text: N in [n_lo, n_hi] into *n, K
 * (1..CASTOR__MAX_REPLICAS, 1 when absent) into *k; or which is bad. */
static int parse_times(const char *text, size_t len, long n_lo, long n_hi, long *n, long *k)
{
    const char *end = text + len, *x = memchr(text, 'x', len);
    if (!x)
        x = memchr(text, 'X', len);
    *k = x ? parse_count_n(x + 1, (size_t)(end - x - 1), 1, CASTOR__MAX_REPLICAS) : 1;
    if (*k < 0)
        return TIMES_BAD_K;
    *n = parse_count_n(text, (size_t)((x ? x : end) - text), n_lo, n_hi);
    return *n < 0 ? TIMES_BAD_N : TIMES_OK;
}

/* One entry, the len characters at tok (not NUL-terminated there). */
static int parse_entry(const char *tok, size_t len, castor__device_entry *e, char *err,
                       size_t errlen)
{
    static const char *forms = "expected cpu, cpu:N, cpu:NxK, cuda, cuda:I or cuda:IxK";
    char shown[80];  /* the entry as the message quotes it, cut if very long */
    snprintf(shown, sizeof shown, "%.*s%s", len < 64 ? (int)len : 64, tok, len < 64 ? "" : "...");
    memset(e, 0, sizeof *e);
    e->replicas = e->shared = 1;
    long n, k;
    int bad;
    if (len == 3 && starts_with(tok, len, "cpu", 3))
        return CASTOR_OK;
    int cpu = starts_with(tok, len, "cpu:", 4);
    if (cpu || starts_with(tok, len, "cuda:", 5)) {
        size_t skip = cpu ? 4 : 5;
        bad = parse_times(tok + skip, len - skip, cpu ? 1 : 0, cpu ? CASTOR__MAX_REPLICAS : 1023,
                          &n, &k);
        if (bad == TIMES_BAD_K)
            return list_fail(err, errlen,
                             "bad device '%s': the replica count after x must be 1..%d", shown,
                             CASTOR__MAX_REPLICAS);
        if (bad && cpu)
            return list_fail(err, errlen, "bad device '%s': the count after cpu: must be 1..%d",
                             shown, CASTOR__MAX_REPLICAS);
        if (bad)
            return list_fail(err, errlen, "bad device '%s': %s", shown, forms);
        if (cpu && n * k > CASTOR__MAX_REPLICAS)
            return list_fail(err, errlen, "bad device '%s': %ld replicas, at most %d", shown,
                             n * k, CASTOR__MAX_REPLICAS);
        e->cuda = !cpu;
        e->ordinal = cpu ? 0 : (int)n;
        e->replicas = cpu ? (int)n : (int)k;
        e->shared = cpu ? (int)k : 1;
        return CASTOR_OK;
    }
    if (len == 4 && starts_with(tok, len, "cuda", 4)) {
        e->cuda = 1;
        e->ordinal = -1;
        return CASTOR_OK;
    }
    return list_fail(err, errlen, "unknown device '%s' (%s)", shown, forms);
}

int castor__device_list_parse(const char *spec, castor__device_entry *entries, int *n_out,
                              char *err, size_t errlen)
{
    *n_out = 0;
    if (!spec || !*spec)
        return list_fail(err, errlen, "no devices given (e.g. cpu:2 or cuda:0)");
    int n = 0;
    for (const char *p = spec;;) {
        size_t len = strcspn(p, ",");
        if (!len)  /* ",cpu", "cpu,,cpu", "cpu,": a slip, not a device */
            return list_fail(err, errlen, "empty entry in the device list '%.64s%s'", spec,
                             strlen(spec) > 64 ? "..." : "");
        if (n == CASTOR__MAX_REPLICAS)
            return list_fail(err, errlen, "too many replicas: at most %d",
                             CASTOR__MAX_REPLICAS);
        castor__device_entry *e = &entries[n];
        int rc = parse_entry(p, len, e, err, errlen);
        if (rc)
            return rc;
        for (int j = 0; j < n && e->cuda; j++) {
            const castor__device_entry *o = &entries[j];
            if (o->cuda && (o->ordinal < 0 || e->ordinal < 0 || o->ordinal == e->ordinal))
                return list_fail(err, errlen,
                                 "'%.*s' names a GPU already in the list; for several "
                                 "replicas on one GPU write cuda:IxK",
                                 len < 64 ? (int)len : 64, p);
        }
        n++;
        p += len;
        if (*p != ',')
            break;
        p++;
    }
    *n_out = n;
    return CASTOR_OK;
}
