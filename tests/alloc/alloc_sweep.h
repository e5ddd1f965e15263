/*
 * The allocation-failure sweep: one API call run again and again from a
 * fresh start, with its first allocation failing, then its second, ...,
 * until it runs with none failing (and each time also with every
 * allocation from that one on failing). Every round the call must fail with
 * CASTOR_NOMEM and a message that says so, or succeed; the case's check
 * then holds the handles to what castor.h promises after such a call
 * (most often: a later call, allocations allowed, succeeds as if nothing
 * had failed); and freeing every handle must give back every block the
 * call took.
 */
#ifndef CASTOR_TESTS_ALLOC_SWEEP_H
#define CASTOR_TESTS_ALLOC_SWEEP_H

typedef struct alloc_case {
    const char *what;                    /* the call and where it runs, for messages */
    void *state;                         /* handed to every function below */
    void (*setup)(void *state);          /* the handles the call needs (nothing fails) */
    int (*call)(void *state);            /* the call under test: the armed part */
    const char *(*errmsg)(void *state);  /* the message of the handle the call failed on */
    /* After the call (nothing fails any more): rc is what it returned; in
     * the first round, where nothing failed, the case keeps the results it
     * compares the later rounds with. */
    void (*check)(void *state, int rc);
    void (*teardown)(void *state);       /* free every handle */
} alloc_case;

/* Runs c: first with no allocation failing, then failing its n-th
 * allocation, and then its n-th and every one after it, for n = 1, 2, ...
 * until a round makes no allocation fail. Returns how many allocations the
 * call made in the first round. */
long alloc_sweep(const alloc_case *c);

/* The round in progress, for messages: "fit on central cpu:2, allocation 7
 * failing (FILE+0xOFFSET)", or "..., no allocation failing". */
const char *alloc_where(void);
/* Whether the round in progress is the first, with nothing failing. */
int alloc_first_round(void);

#endif
