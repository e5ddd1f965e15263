/*
 * A fixed team of worker threads.
 *
 * castor__pool_run() calls fn(ctx, i, n) once on each of the n workers
 * (i = 0..n-1, always on the same thread for the same i, so a worker can own
 * per-thread state such as a CUDA device binding) and returns when all have
 * finished. castor__pool_for() splits [0, count) into contiguous chunks, one
 * per worker; with small counts it runs on the caller's thread alone, since
 * waking threads costs more than it saves.
 */
#ifndef CASTOR_HOST_POOL_H
#define CASTOR_HOST_POOL_H

#include <stddef.h>

#include "castor.h" /* status codes */

typedef struct castor__pool castor__pool;

typedef void (*castor__pool_fn)(void *ctx, int index, int count);
typedef void (*castor__range_fn)(void *ctx, size_t begin, size_t end);

/* nthreads >= 1; returns CASTOR_OK, CASTOR_NOMEM, or CASTOR_ERROR when the
 * system would not start a thread (or make a mutex or condition variable):
 * then *why (if why is not NULL) gets the error number pthread gave, such as
 * EAGAIN for a thread over RLIMIT_NPROC, and no thread is left running. */
int castor__pool_create(int nthreads, castor__pool **out, int *why);
void castor__pool_free(castor__pool *pool);  /* NULL is a no-op; joins the workers */
int castor__pool_size(const castor__pool *pool);
void castor__pool_run(castor__pool *pool, castor__pool_fn fn, void *ctx);
/* Chunks are aligned to 16 floats so vector loops do not share cache lines. */
void castor__pool_for(castor__pool *pool, size_t count, size_t min_parallel,
                      castor__range_fn fn, void *ctx);

#endif
