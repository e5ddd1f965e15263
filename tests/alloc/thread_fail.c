/* The wrapped pthread_create of thread_fail.h. */
#include "thread_fail.h"

#include <stdatomic.h>

int __real_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                          void *(*start)(void *), void *arg);

static atomic_int armed;
static atomic_long counted;
static atomic_long fail_at;
static atomic_int fail_err;

int __wrap_pthread_create(pthread_t *thread, const pthread_attr_t *attr,
                          void *(*start)(void *), void *arg)
{
    if (atomic_load(&armed)) {
        long n = atomic_fetch_add(&counted, 1) + 1;
        if (n == atomic_load(&fail_at))
            return atomic_load(&fail_err);
    }
    return __real_pthread_create(thread, attr, start, arg);
}

void thread_fail_arm(long at, int err)
{
    atomic_store(&counted, 0);
    atomic_store(&fail_at, at);
    atomic_store(&fail_err, err);
    atomic_store(&armed, 1);
}

long thread_fail_disarm(void)
{
    atomic_store(&armed, 0);
    return atomic_load(&counted);
}
