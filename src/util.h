/* Small shared helpers of the runtime core. */
#ifndef CASTOR_UTIL_H
#define CASTOR_UTIL_H

#include <stddef.h>

/* The room for a handle's message: a path or two of up to PATH_MAX (4096)
 * bytes, and the reason, which comes after them, whole. */
#define CASTOR__MSG_MAX 10240

/* snprintf into an error buffer; never overflows, always terminates. */
void castor__errf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The text for errno value e (GNU strerror_r: thread-safe, maybe in buf). */
const char *castor__strerror(int e, char *buf, size_t len);

/* Monotonic seconds. */
double castor__now(void);

/*
 * Opens path for reading if it is a regular file; else -1 with
 * "PATH: is a directory, not KIND" (or a FIFO, a device, ...) in err.
 * Anything but a regular file is refused before a byte is read: a FIFO
 * would block the open until a writer came, a device would read for ever.
 * st receives the file's status.
 */
struct stat;
int castor__open_regular(const char *path, const char *kind, struct stat *st, char *err,
                         size_t errlen);

/* Numbers in files are written and read in the C locale whatever locale
 * the application set (setlocale is process-wide; these switch only the
 * calling thread, for the call): "%.9g" of v into buf, and strtof. */
void castor__format_g9(char *buf, size_t size, double v);
float castor__strtof_c(const char *s, char **end);

/* a and b equal but for the case of ASCII letters, whatever the locale
 * (strcasecmp follows it: in a Turkish locale "I" is not "i"). */
int castor__ascii_ieq(const char *a, const char *b);
/* The first n characters of a and b likewise (no NUL needed within them). */
int castor__ascii_ieqn(const char *a, const char *b, size_t n);

/* v for a message's %g: a NaN without its sign, since printf writes a NaN
 * whose sign bit is set (what 0/0 and most NaNs from files have) as
 * "-nan", which reads as a value. */
double castor__shown(double v);

/* Whether each of the n floats at v is finite (no NaN, no inf). */
int castor__all_finite(const float *v, size_t n);

/* a * b into *out unless it overflows size_t; returns 0 on overflow. */
int castor__mul_ok(size_t a, size_t b, size_t *out);

#endif
