/*
 * castor_strategy_create with each thread it starts failing in turn, as
 * pthread_create fails over a limit (EAGAIN: RLIMIT_NPROC, the system's
 * thread count, or no memory for a stack) or by policy (EPERM): the
 * message names the threads and the reason, a failed create leaves no
 * thread behind, and a create right after it works.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "castor.h"
#include "thread_fail.h"

/* Threads of this process, from /proc/self/task. */
static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert(d, "/proc/self/task: %s", strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

Test(threads, a_thread_the_system_does_not_start_is_named_with_its_reason)
{
    castor_strategy_options o = CASTOR_STRATEGY_OPTIONS_INIT;
    o.host_threads = 3;
    castor_strategy *s = NULL;
    thread_fail_arm(0, 0);
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", &o), CASTOR_OK,
                 "%s", castor_strategy_errmsg(s));
    long calls = thread_fail_disarm();
    castor_strategy_free(s);
    cr_assert_eq(calls, 2 + 3, "threads started: 2 replica, 3 host");

    static const int errs[] = {EAGAIN, EPERM};
    for (size_t e = 0; e < sizeof errs / sizeof *errs; e++)
        for (long at = 1; at <= calls; at++) {
            int before = threads_now();
            thread_fail_arm(at, errs[e]);
            int rc = castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", &o);
            thread_fail_disarm();
            char want[256];
            snprintf(want, sizeof want, "cannot start %d %s threads: %s%s", at <= 2 ? 2 : 3,
                     at <= 2 ? "replica" : "host", strerror(errs[e]),
                     errs[e] == EAGAIN ? " (raise ulimit -u?)" : "");
            cr_assert_eq(rc, CASTOR_ERROR, "thread %ld failing: %d", at, rc);
            cr_assert_str_eq(castor_strategy_errmsg(s), want, "thread %ld failing", at);
            cr_assert_eq(castor_strategy_replicas(s), 0);
            castor_strategy_free(s);
            cr_assert_eq(threads_now(), before, "thread %ld failing: threads left running", at);
        }
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", &o), CASTOR_OK,
                 "%s", castor_strategy_errmsg(s));
    castor_strategy_free(s);
}
