#include "pool.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "castor.h"

/* pool_for chunks start on multiples of this many elements: 64 bytes of
 * floats, so two workers never write the same cache line. */
#define CHUNK_ALIGN 16u

typedef struct worker {
    castor__pool *pool;
    int index;
    pthread_t thread;
} worker;

struct castor__pool {
    int nthreads;
    worker *workers;
    pthread_mutex_t mutex;
    pthread_cond_t work_ready;  /* generation moved on, or stopping */
    pthread_cond_t work_done;   /* pending reached 0 */
    /* Guarded by mutex. A worker runs the job once for every generation it
     * has not seen yet; run() waits for pending to drop to 0 before the next
     * generation, so no worker can skip one. */
    uint64_t generation;
    int pending;
    int stopping;
    castor__pool_fn fn;
    void *ctx;
};

static void *worker_main(void *arg)
{
    worker *w = arg;
    castor__pool *pool = w->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mutex);
    for (;;) {
        while (pool->generation == seen && !pool->stopping)
            pthread_cond_wait(&pool->work_ready, &pool->mutex);
        if (pool->stopping)
            break;
        seen = pool->generation;
        castor__pool_fn fn = pool->fn;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->mutex);
        fn(ctx, w->index, pool->nthreads);
        pthread_mutex_lock(&pool->mutex);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->work_done);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
}

/* Stops and joins the first `started` workers, then releases everything. */
static void pool_destroy(castor__pool *pool, int started)
{
    pthread_mutex_lock(&pool->mutex);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 0; i < started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    pthread_cond_destroy(&pool->work_done);
    pthread_cond_destroy(&pool->work_ready);
    pthread_mutex_destroy(&pool->mutex);
    free(pool->workers);
    free(pool);
}

int castor__pool_create(int nthreads, castor__pool **out, int *why)
{
    *out = NULL;
    int dummy;
    if (!why)
        why = &dummy;
    *why = 0;
    if (nthreads < 1)
        return CASTOR_INVALID;
    castor__pool *pool = calloc(1, sizeof *pool);
    worker *workers = calloc((size_t)nthreads, sizeof *workers);
    if (!pool || !workers) {
        free(workers);
        free(pool);
        return CASTOR_NOMEM;
    }
    pool->workers = workers;
    pool->nthreads = nthreads;
    if ((*why = pthread_mutex_init(&pool->mutex, NULL)))
        goto fail_mutex;
    if ((*why = pthread_cond_init(&pool->work_ready, NULL)))
        goto fail_ready;
    if ((*why = pthread_cond_init(&pool->work_done, NULL)))
        goto fail_done;
    /* The workers start with every signal blocked (a thread inherits its
     * creator's mask): a signal meant for the application (SIGINT, or one it
     * waits for with sigwait) then goes to one of its own threads, never
     * runs a handler on a library thread. */
    sigset_t all, old;
    sigfillset(&all);
    /* Not the signals of a fault on the thread itself: blocked, the kernel
     * kills the process outright, past every handler (a sanitizer's
     * report, the application's crash handler). */
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof faults / sizeof *faults; i++)
        sigdelset(&all, faults[i]);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int made = 0;
    for (; made < nthreads; made++) {
        workers[made].pool = pool;
        workers[made].index = made;
        if ((*why = pthread_create(&workers[made].thread, NULL, worker_main, &workers[made])))
            break;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (made < nthreads) {
        pool_destroy(pool, made);
        return CASTOR_ERROR;
    }
    *out = pool;
    return CASTOR_OK;

fail_done:
    pthread_cond_destroy(&pool->work_ready);
fail_ready:
    pthread_mutex_destroy(&pool->mutex);
fail_mutex:
    free(workers);
    free(pool);
    return CASTOR_ERROR;
}

void castor__pool_free(castor__pool *pool)
{
    if (pool)
        pool_destroy(pool, pool->nthreads);
}

int castor__pool_size(const castor__pool *pool)
{
    return pool ? pool->nthreads : 1;
}

/* Not reentrant: fn must not run the same pool, which would wait for
 * itself. */
void castor__pool_run(castor__pool *pool, castor__pool_fn fn, void *ctx)
{
    if (!pool) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->pending = pool->nthreads;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_ready);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->work_done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}

typedef struct range_job {
    castor__range_fn fn;
    void *ctx;
    size_t count;
    size_t chunk;
} range_job;

static void range_task(void *arg, int index, int count)
{
    (void)count;
    const range_job *job = arg;
    size_t begin = (size_t)index * job->chunk;
    if (begin >= job->count)
        return;
    size_t end = job->count - begin > job->chunk ? begin + job->chunk : job->count;
    job->fn(job->ctx, begin, end);
}

void castor__pool_for(castor__pool *pool, size_t count, size_t min_parallel,
                      castor__range_fn fn, void *ctx)
{
    if (count == 0)
        return;
    int n = castor__pool_size(pool);
    size_t chunk = count / (size_t)n + (count % (size_t)n != 0);
    chunk = (chunk + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
    if (n == 1 || count < min_parallel || chunk >= count) {
        fn(ctx, 0, count);
        return;
    }
    range_job job = {fn, ctx, count, chunk};
    castor__pool_run(pool, range_task, &job);
}
