/* The sweep of alloc_sweep.h. */
#include "alloc_sweep.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>  /* strcasestr: _GNU_SOURCE, from the Makefile */

#include "alloc_fail.h"
#include "castor.h"

/* No call of these sweeps makes nearly this many allocations: a sweep
 * that gets here is not converging (a call that allocates more the more
 * often it is retried). */
#define MAX_ROUNDS 5000

static char where[1024];
static long round_no;

const char *alloc_where(void)
{
    return where;
}

int alloc_first_round(void)
{
    return round_no == 0;
}

/* A failed call's message must say that memory ran out: not be empty, not
 * be left over from before ("no error" on a fresh handle), and not blame
 * something else as well (the caller's arguments, a file). */
static void check_message(const alloc_case *c)
{
    static const char *const blame[] = {"bad ", "corrupt", "malformed", "invalid", "missing",
                                        "truncated"};
    const char *msg = c->errmsg(c->state);
    cr_assert(msg && *msg, "%s: CASTOR_NOMEM with an empty message", where);
    cr_assert(strcasestr(msg, "memory"),
              "%s: CASTOR_NOMEM, but the message does not say memory ran out: '%s'", where, msg);
    for (size_t i = 0; i < sizeof blame / sizeof *blame; i++)
        cr_assert(!strcasestr(msg, blame[i]),
                  "%s: CASTOR_NOMEM, but the message blames something else ('%s'): '%s'", where,
                  blame[i], msg);
}

static void run_round(const alloc_case *c, long fail_at, int and_after, long *counted)
{
    snprintf(where, sizeof where, "%s, %s", c->what,
             fail_at ? "allocations being made to fail" : "no allocation failing");
    c->setup(c->state);
    alloc_arm(fail_at, and_after);
    int rc = c->call(c->state);
    *counted = alloc_disarm();
    int fired = alloc_fired();
    if (fired)
        snprintf(where, sizeof where, "%s, allocation %ld%s failing (%s; the call made %ld)",
                 c->what, fail_at, and_after ? " and all after it" : "", alloc_fired_site(),
                 *counted);
    else
        snprintf(where, sizeof where, "%s, no allocation failing (%ld made)", c->what,
                 *counted);
    if (!fired)
        cr_assert_eq(rc, CASTOR_OK, "%s: %s: %s", where, castor_errstr(rc), c->errmsg(c->state));
    else if (rc != CASTOR_OK)
        cr_assert_eq(rc, CASTOR_NOMEM, "%s: returned %s (%d), not CASTOR_NOMEM: %s", where,
                     castor_errstr(rc), rc, c->errmsg(c->state));
    if (rc)
        check_message(c);
    c->check(c->state, rc);
    c->teardown(c->state);
    char site[600];
    size_t live = alloc_live(site, sizeof site);
    cr_assert_eq(live, 0, "%s: %zu block(s) the call took are still held after every handle "
                 "was freed; the first taken at %s", where, live, site);
}

long alloc_sweep(const alloc_case *c)
{
    long clean = 0, counted = 0;
    round_no = 0;
    run_round(c, 0, 0, &clean);
    for (long n = 1;; n++) {
        cr_assert_lt(n, MAX_ROUNDS, "%s: still failing allocations after %d rounds", c->what,
                     MAX_ROUNDS);
        round_no = n;
        run_round(c, n, 0, &counted);
        if (!alloc_fired())
            break;
        /* Memory that stays short: the paths that handle a failure and
         * allocate again (for a message, say) must cope too. */
        run_round(c, n, 1, &counted);
    }
    round_no = 0;
    cr_log_info("%s: %ld allocations, each made to fail", c->what, clean);
    return clean;
}
