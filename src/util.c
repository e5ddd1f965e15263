#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void castor__errf(char *buf, size_t len, const char *fmt, ...)
{
    if (!buf || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

double castor__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int castor__all_finite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}

int castor__mul_ok(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

const char *castor__strerror(int e, char *buf, size_t len)
{
    return strerror_r(e, buf, len);
}

/* What a file that is not a regular one is, for messages. */
static const char *not_regular(mode_t mode)
{
    return S_ISDIR(mode)    ? "is a directory"
           : S_ISFIFO(mode) ? "is a FIFO (named pipe)"
           : S_ISCHR(mode)  ? "is a character device"
           : S_ISBLK(mode)  ? "is a block device"
           : S_ISSOCK(mode) ? "is a socket"
                            : "is not a regular file";
}

/* stat first, so that what is plainly no regular file is not even opened;
 * O_NONBLOCK, so that the open returns at once should the path turn into a
 * FIFO in between; fstat to decide, then O_NONBLOCK off for the reads. */
int castor__open_regular(const char *path, const char *kind, struct stat *st, char *err,
                         size_t errlen)
{
    char ebuf[128];
    if (stat(path, st) == 0 && !S_ISREG(st->st_mode)) {
        castor__errf(err, errlen, "%s: %s, not %s", path, not_regular(st->st_mode), kind);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        castor__errf(err, errlen, "%s: cannot open: %s", path,
                     castor__strerror(errno, ebuf, sizeof ebuf));
        return -1;
    }
    int flags;
    if (fstat(fd, st) != 0) {
        castor__errf(err, errlen, "%s: cannot stat: %s", path,
                     castor__strerror(errno, ebuf, sizeof ebuf));
    } else if (!S_ISREG(st->st_mode)) {
        castor__errf(err, errlen, "%s: %s, not %s", path, not_regular(st->st_mode), kind);
    } else if ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        castor__errf(err, errlen, "%s: cannot set up the file for reading (fcntl): %s", path,
                     castor__strerror(errno, ebuf, sizeof ebuf));
    } else {
        return fd;
    }
    close(fd);
    return -1;
}

/* glibc hands out its one static C locale object for newlocale(..., "C",
 * 0): nothing is allocated and nothing can fail (checked: the same pointer
 * every call, no heap growth over 1000 calls). The fallbacks below are for a
 * C library that allocates; there a failure leaves the caller's locale. */
void castor__format_g9(char *buf, size_t size, double v)
{
    locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    locale_t old = c ? uselocale(c) : (locale_t)0;
    snprintf(buf, size, "%.9g", v);
    if (c) {
        uselocale(old);
        freelocale(c);
    }
}

float castor__strtof_c(const char *s, char **end)
{
    locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!c)
        return strtof(s, end);  /* see castor__format_g9 */
    float v = strtof_l(s, end, c);
    freelocale(c);
    return v;
}

static int ascii_lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

int castor__ascii_ieqn(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int x = ascii_lower((unsigned char)a[i]), y = ascii_lower((unsigned char)b[i]);
        if (x != y)
            return 0;
        if (!x)
            return 1;
    }
    return 1;
}

int castor__ascii_ieq(const char *a, const char *b)
{
    return castor__ascii_ieqn(a, b, SIZE_MAX);
}

double castor__shown(double v)
{
    return isnan(v) ? fabs(v) : v;
}
