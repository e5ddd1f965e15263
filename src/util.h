/* Small shared helpers of the runtime core. */
#ifndef CASTOR_UTIL_H
#define CASTOR_UTIL_H

#include <stddef.h>

/* snprintf into an error buffer; never overflows, always terminates. */
void castor__errf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The text for errno value e (GNU strerror_r: thread-safe, maybe in buf). */
const char *castor__strerror(int e, char *buf, size_t len);

/* Monotonic seconds. */
double castor__now(void);

/* a * b into *out unless it overflows size_t; returns 0 on overflow. */
int castor__mul_ok(size_t a, size_t b, size_t *out);

#endif
