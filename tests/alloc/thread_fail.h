/*
 * Failing the threads castor starts, one at a time. The alloc test binary is
 * also linked with -Wl,--wrap=pthread_create (the Makefile's THREAD_WRAP):
 * castor's objects (and the tests') start their threads through the
 * wrapper here; OpenBLAS, libc and Criterion, shared libraries, do not.
 */
#ifndef CASTOR_TESTS_THREAD_FAIL_H
#define CASTOR_TESTS_THREAD_FAIL_H

#include <pthread.h>

int __wrap_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                          void *(*start)(void *), void *arg);

/* Count pthread_create calls from now on, failing the fail_at-th (1-based;
 * 0: none) with the error number err, as pthread_create returns it. */
void thread_fail_arm(long fail_at, int err);
/* Stop counting and failing; the number of calls counted since the arm. */
long thread_fail_disarm(void);

#endif
