/* The device list's syntax, and opening the devices it names (device_list.h). */
#include "device_list.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "castor.h"
#include "device/device.h"
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
        /* The part found bad is quoted: "must be 1..64" alone, of "cpu:2abc",
         * names a range that 2 is in. */
        const char *num = tok + skip, *end = tok + len, *x = memchr(num, 'x', len - skip);
        if (!x)
            x = memchr(num, 'X', len - skip);
        int k_len = x ? (int)(end - x - 1 < 32 ? end - x - 1 : 32) : 0;
        int n_len = (int)((x ? x : end) - num < 32 ? (x ? x : end) - num : 32);
        if (bad == TIMES_BAD_K)
            return list_fail(err, errlen,
                             "bad device '%s': the replica count after x must be a whole number "
                             "1..%d, not '%.*s'",
                             shown, CASTOR__MAX_REPLICAS, k_len, x + 1);
        if (bad && cpu)
            return list_fail(err, errlen,
                             "bad device '%s': the count after cpu: must be a whole number 1..%d, "
                             "not '%.*s'",
                             shown, CASTOR__MAX_REPLICAS, n_len, num);
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

/* dev into devs[*n], or destroyed when there is no room. */
static int add_device(cdev **devs, int *n, cdev *dev, char *err, size_t errlen)
{
    if (*n >= CASTOR__MAX_REPLICAS) {
        castor__cdev_destroy(dev);
        return list_fail(err, errlen, "too many replicas: at most %d", CASTOR__MAX_REPLICAS);
    }
    devs[(*n)++] = dev;
    return CASTOR_OK;
}

static int open_cpu(const castor__device_entry *e, size_t budget, int *next_ordinal, cdev **devs,
                    int *n, char *err, size_t errlen)
{
    /* Replicas sharing an emulated device share its budget, as logical
     * replicas share a GPU's memory. */
    budget /= (size_t)e->shared;
    for (int i = 0; i < e->replicas; i++, (*next_ordinal)++)
        for (int k = 0; k < e->shared; k++) {
            cdev *dev = NULL;
            int rc = castor__cdev_cpu_create(*next_ordinal, k, budget, &dev, err, errlen);
            if (rc || (rc = add_device(devs, n, dev, err, errlen)))
                return rc;
        }
    return CASTOR_OK;
}

static int open_cuda(const castor__device_entry *e, size_t budget, int tf32, cdev **devs, int *n,
                     char *err, size_t errlen)
{
    const char *why = NULL;
    int count = castor__cdev_cuda_count(&why);
    if (count <= 0) {
        if (err && errlen)
            snprintf(err, errlen, "no CUDA GPU can be used: %s", why ? why : "none found");
        return CASTOR_UNSUPPORTED;
    }
    if (e->ordinal >= count)
        return list_fail(err, errlen, "no GPU cuda:%d: this machine has %d (cuda:0..%d)",
                         e->ordinal, count, count - 1);
    int first = e->ordinal < 0 ? 0 : e->ordinal;
    int last = e->ordinal < 0 ? count - 1 : e->ordinal;
    for (int g = first; g <= last; g++) {
        int first_replica = *n;
        /* Each opened with the GPU's free memory (less headroom) as its
         * budget, then held to its even share of it: without that, K logical
         * replicas each counted the whole GPU as theirs, and a budget given
         * larger than a share passed every replica's check that the GPU
         * together could not hold (cudaMalloc failed instead). A budget
         * given is each replica's own, where it is below the share. */
        for (int k = 0; k < e->replicas; k++) {
            cdev *dev = NULL;
            int rc = castor__cdev_cuda_create(g, k, 0, tf32, &dev, err, errlen);
            if (rc || (rc = add_device(devs, n, dev, err, errlen)))
                return rc;
        }
        for (int i = first_replica; i < *n; i++) {
            size_t share = devs[i]->budget / (size_t)e->replicas;
            devs[i]->budget = budget && budget < share ? budget : share;
        }
    }
    return CASTOR_OK;
}

int castor__devices_open(const castor__device_entry *entries, int n_entries, size_t cpu_budget,
                         size_t cuda_budget, int tf32, cdev **devs, int *n_out, char *err,
                         size_t errlen)
{
    int next_cpu = 0, rc = CASTOR_OK;
    *n_out = 0;
    for (int i = 0; i < n_entries && !rc; i++)
        rc = entries[i].cuda
                 ? open_cuda(&entries[i], cuda_budget, tf32, devs, n_out, err, errlen)
                 : open_cpu(&entries[i], cpu_budget, &next_cpu, devs, n_out, err, errlen);
    return rc;
}

castor__placement castor__devices_placement(cdev *const *devs, int n)
{
    castor__placement p = {1, 1};
    for (int i = 0; i < n; i++) {
        if (strcmp(devs[i]->iface->backend, "cuda") != 0)
            p.distinct_gpus = 0;
        if (devs[i]->ordinal != devs[0]->ordinal ||
            strcmp(devs[i]->iface->backend, devs[0]->iface->backend) != 0)
            p.same_device = 0;
        for (int j = 0; j < i; j++)
            if (devs[j]->ordinal == devs[i]->ordinal)
                p.distinct_gpus = 0;
    }
    return p;
}
