/*
 * host/pool.c (the worker team) and host/pinned.c (the host buffers it
 * works on).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "device/device.h"
#include "host/pinned.h"
#include "host/pool.h"

/* ---- castor__pool_run ---------------------------------------------------- */

#define TEAM 4
#define RUNS 50

typedef struct run_record {
    pthread_t thread[TEAM];
    int calls[TEAM];
    int count_seen[TEAM];
} run_record;

/* Each index writes only its own slots: a second call for an index from
 * another thread would be a data race that TSan reports. */
static void record_task(void *ctx, int index, int count)
{
    run_record *rec = ctx;
    rec->thread[index] = pthread_self();
    rec->calls[index]++;
    rec->count_seen[index] = count;
}

Test(pool, run_calls_each_index_once_on_its_own_thread)
{
    castor__pool *pool;
    cr_assert_eq(castor__pool_create(TEAM, &pool, NULL), CASTOR_OK);
    cr_assert_eq(castor__pool_size(pool), TEAM);
    run_record first = {0};
    castor__pool_run(pool, record_task, &first);
    for (int i = 0; i < TEAM; i++) {
        cr_assert_eq(first.calls[i], 1, "index %d ran %d times", i, first.calls[i]);
        cr_assert(!pthread_equal(first.thread[i], pthread_self()),
                  "index %d ran on the caller's thread", i);
        for (int j = 0; j < i; j++)
            cr_assert(!pthread_equal(first.thread[i], first.thread[j]),
                      "indices %d and %d share a thread", j, i);
    }
    for (int r = 0; r < RUNS; r++) {
        run_record rec = {0};
        castor__pool_run(pool, record_task, &rec);
        for (int i = 0; i < TEAM; i++) {
            cr_assert_eq(rec.calls[i], 1, "run %d: index %d ran %d times", r, i, rec.calls[i]);
            cr_assert_eq(rec.count_seen[i], TEAM, "run %d: index %d was told count %d", r, i,
                         rec.count_seen[i]);
            cr_assert(pthread_equal(rec.thread[i], first.thread[i]),
                      "run %d: index %d moved to another thread", r, i);
        }
    }
    castor__pool_free(pool);
}

static void barrier_task(void *ctx, int index, int count)
{
    (void)index;
    (void)count;
    pthread_barrier_wait(ctx);
}

/* Each worker notes whether SIGINT and SIGTERM are blocked on it. */
typedef struct mask_record {
    pthread_t caller;
    atomic_int workers, blocked;
} mask_record;

static void mask_task(void *ctx, int index, int count)
{
    (void)index;
    (void)count;
    mask_record *rec = ctx;
    if (pthread_equal(pthread_self(), rec->caller))
        return;
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    atomic_fetch_add(&rec->workers, 1);
    /* A fault's signal stays deliverable: blocked, the kernel would kill
     * the process past every handler (a sanitizer's report too). */
    if (sigismember(&cur, SIGINT) == 1 && sigismember(&cur, SIGTERM) == 1 &&
        sigismember(&cur, SIGSEGV) == 0 && sigismember(&cur, SIGBUS) == 0 &&
        sigismember(&cur, SIGFPE) == 0 && sigismember(&cur, SIGABRT) == 0)
        atomic_fetch_add(&rec->blocked, 1);
}

Test(pool, workers_block_signals_the_caller_does_not)
{
    /* A SIGINT meant for the application ran its handler on a library
     * thread (the CLI's "second Ctrl-C kills" then fired there while the
     * main thread was writing a checkpoint). */
    sigset_t none, before, after;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, &before);
    castor__pool *pool;
    cr_assert_eq(castor__pool_create(TEAM, &pool, NULL), CASTOR_OK);
    pthread_sigmask(SIG_BLOCK, NULL, &after);
    cr_assert_eq(sigismember(&after, SIGINT), 0, "the caller's mask is its own again");
    mask_record rec = {pthread_self(), 0, 0};
    castor__pool_run(pool, mask_task, &rec);
    int workers = atomic_load(&rec.workers), blocked = atomic_load(&rec.blocked);
    cr_assert_gt(workers, 0, "no task ran on a worker");
    cr_assert_eq(blocked, workers, "%d of %d workers take SIGINT/SIGTERM or block a fault's signal",
                 workers - blocked, workers);
    castor__pool_free(pool);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
}

/* Every worker waits for all the others: this only returns if they run at
 * the same time. */
Test(pool, workers_run_concurrently, .timeout = 20)
{
    castor__pool *pool;
    cr_assert_eq(castor__pool_create(TEAM, &pool, NULL), CASTOR_OK);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, TEAM);
    for (int r = 0; r < 10; r++)
        castor__pool_run(pool, barrier_task, &barrier);
    pthread_barrier_destroy(&barrier);
    castor__pool_free(pool);
}

Test(pool, create_and_free_repeatedly)
{
    for (int r = 0; r < 20; r++) {
        castor__pool *pool;
        cr_assert_eq(castor__pool_create(1 + r % TEAM, &pool, NULL), CASTOR_OK);
        if (r % 2) {
            run_record rec = {0};
            castor__pool_run(pool, record_task, &rec);
        }
        castor__pool_free(pool);
    }
    castor__pool_free(NULL);
}

Test(pool, bad_sizes)
{
    castor__pool *pool = (castor__pool *)&pool;  /* any non-NULL value: create must clear it */
    cr_assert_neq(castor__pool_create(0, &pool, NULL), CASTOR_OK);
    cr_assert_null(pool);
    cr_assert_eq(castor__pool_size(NULL), 1);
}

/* ---- castor__pool_for ---------------------------------------------------- */

#define MAX_CALLS 64

typedef struct cover_record {
    atomic_uchar *hits;
    atomic_int calls;
    size_t begins[MAX_CALLS], ends[MAX_CALLS];
    pthread_t threads[MAX_CALLS];
} cover_record;

static void cover_task(void *ctx, size_t begin, size_t end)
{
    cover_record *rec = ctx;
    int call = atomic_fetch_add(&rec->calls, 1);
    if (call < MAX_CALLS) {
        rec->begins[call] = begin;
        rec->ends[call] = end;
        rec->threads[call] = pthread_self();
    }
    for (size_t i = begin; i < end; i++)
        atomic_fetch_add_explicit(&rec->hits[i], 1, memory_order_relaxed);
}

static void check_cover(castor__pool *pool, size_t count, size_t min_parallel)
{
    cover_record *rec = calloc(1, sizeof *rec);
    cr_assert_not_null(rec);
    rec->hits = calloc(count ? count : 1, sizeof *rec->hits);
    cr_assert_not_null(rec->hits);
    atomic_init(&rec->calls, 0);
    castor__pool_for(pool, count, min_parallel, cover_task, rec);
    int size = castor__pool_size(pool);
    for (size_t i = 0; i < count; i++)
        if (atomic_load(&rec->hits[i]) != 1)
            cr_assert_fail("%zu elements, %d threads, min_parallel %zu: element %zu ran %d "
                           "times",
                           count, size, min_parallel, i, (int)atomic_load(&rec->hits[i]));
    int calls = atomic_load(&rec->calls);
    cr_assert_leq(calls, size, "%zu elements: %d calls for %d threads", count, calls, size);
    for (int c = 0; c < calls; c++) {
        cr_assert_lt(rec->begins[c], rec->ends[c], "%zu elements: empty chunk passed", count);
        cr_assert_eq(rec->begins[c] % 16, 0, "%zu elements: chunk starts at %zu", count,
                     rec->begins[c]);
    }
    if (count > 0 && (count < min_parallel || size == 1)) {
        cr_assert_eq(calls, 1);
        cr_assert(pthread_equal(rec->threads[0], pthread_self()),
                  "%zu elements below min_parallel %zu left the caller's thread", count,
                  min_parallel);
    }
    free(rec->hits);
    free(rec);
}

Test(pool, for_covers_every_element_once, .timeout = 120)
{
    static const size_t counts[] = {0, 1, 15, 16, 17, 31, 33, 1000, 65537, 1000003};
    static const size_t min_parallels[] = {0, (size_t)1 << 15};
    castor__pool *pools[5] = {NULL};
    for (int t = 1; t < 5; t++)
        cr_assert_eq(castor__pool_create(t, &pools[t], NULL), CASTOR_OK);
    for (int t = 0; t < 5; t++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            for (size_t m = 0; m < sizeof min_parallels / sizeof min_parallels[0]; m++)
                check_cover(pools[t], counts[c], min_parallels[m]);
    for (int t = 1; t < 5; t++)
        castor__pool_free(pools[t]);
}

Test(pool, for_splits_large_counts_over_the_workers)
{
    castor__pool *pool;
    cr_assert_eq(castor__pool_create(3, &pool, NULL), CASTOR_OK);
    cover_record *rec = calloc(1, sizeof *rec);
    cr_assert_not_null(rec);
    size_t count = 100003;
    rec->hits = calloc(count, sizeof *rec->hits);
    cr_assert_not_null(rec->hits);
    atomic_init(&rec->calls, 0);
    castor__pool_for(pool, count, 1000, cover_task, rec);
    cr_assert_eq(atomic_load(&rec->calls), 3);
    for (int c = 0; c < 3; c++)
        cr_assert(!pthread_equal(rec->threads[c], pthread_self()));
    free(rec->hits);
    free(rec);
    castor__pool_free(pool);
}

/* ---- host buffers ------------------------------------------------------- */

Test(pinned, alloc_is_zeroed_and_aligned)
{
    static const size_t sizes[] = {0, 1, 63, 64, 4097, ((size_t)1 << 20) + 3};
    for (int use_cuda = 0; use_cuda <= 1; use_cuda++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            size_t bytes = sizes[s];
            castor__host_buf buf;
            cr_assert_eq(castor__host_alloc(&buf, bytes, use_cuda), CASTOR_OK);
            cr_assert_not_null(buf.ptr);
            cr_assert_eq((uintptr_t)buf.ptr % 64, 0, "%zu bytes at %p", bytes, buf.ptr);
            cr_assert_eq(buf.bytes, bytes);
            cr_assert(buf.locked == 0 || buf.locked == 1);
            /* Even a zero-byte buffer holds 64 usable bytes. */
            size_t usable = bytes ? bytes : 64;
            const unsigned char *p = buf.ptr;
            for (size_t i = 0; i < usable; i++)
                if (p[i] != 0)
                    cr_assert_fail("%zu bytes (use_cuda %d): byte %zu is %d", bytes, use_cuda,
                                   i, p[i]);
            memset(buf.ptr, 0xa5, usable);
            castor__host_free(&buf);
            cr_assert_null(buf.ptr);
            cr_assert_eq(buf.bytes, 0);
            castor__host_free(&buf);  /* freed twice: the zeroed struct is a no-op */
        }
    }
}

/* A buffer for GPUs that CUDA could not pin is pageable to CUDA, mlock'd or
 * not: it was called locked, so the bench labelled its copies pinned. */
Test(pinned, unpinned_by_cuda_is_not_called_locked)
{
    if (!castor__cdev_cuda_compiled())
        cr_skip_test("a build without CUDA: use_cuda is ignored");
    castor__host_buf buf;
    cr_assert_eq(castor__host_alloc(&buf, 4096, 1), CASTOR_OK);
    int gpus = castor__cdev_cuda_count(NULL);
    cr_assert_eq(buf.locked, gpus > 0, "%d GPUs, locked %d", gpus, buf.locked);
    castor__host_free(&buf);
}

Test(pinned, free_of_zero_struct_is_noop)
{
    castor__host_buf buf = {0};
    castor__host_free(&buf);
    castor__host_free(NULL);
}

/* Sanitizer allocators abort on impossible sizes instead of failing them. */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
Test(pinned, impossible_size_is_nomem)
{
    castor__host_buf buf;
    cr_assert_eq(castor__host_alloc(&buf, SIZE_MAX / 2, 0), CASTOR_NOMEM);
    cr_assert_null(buf.ptr);
}
#endif

/* Whether the page holding p is in a locked mapping ("lo" among the
 * VmFlags of its /proc/self/smaps entry); -1 when smaps cannot tell. */
static int page_locked(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    uintptr_t addr = (uintptr_t)p, start, end;
    int in_range = 0, result = -1;
    char line[512];
    while (result < 0 && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &start, &end) == 2 &&
            strchr(line, '-') < strchr(line, ' '))
            in_range = addr >= start && addr < end;
        else if (in_range && strncmp(line, "VmFlags:", 8) == 0)
            result = strstr(line, " lo") != NULL;
    }
    fclose(f);
    return result;
}

/* The emulated CPU device copies with memcpy, which no lock speeds up: its
 * buffers were mlock'd all the same, spending the process's RLIMIT_MEMLOCK
 * (an 8 MiB limit, a 1.5M-variable model compiled: the program's own
 * mlock of 4 MiB failed) and costing two mlock/munlock pairs a predict. */
Test(pinned, buffers_for_cpu_devices_are_not_page_locked)
{
    enum { N = 4 };
    static const size_t sizes[N] = {0, 200, 4096, (size_t)1 << 20};
    for (int i = 0; i < N; i++) {
        castor__host_buf buf;
        cr_assert_eq(castor__host_alloc(&buf, sizes[i], 0), CASTOR_OK);
        int locked = page_locked(buf.ptr);
        if (locked < 0)
            cr_skip_test("/proc/self/smaps cannot tell which pages are locked here");
        cr_assert_eq(locked, 0, "a %zu-byte buffer for CPU devices is page-locked", sizes[i]);
        cr_assert_eq(buf.locked, 0);
        castor__host_free(&buf);
    }
}
