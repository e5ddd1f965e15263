#include "update.h"

#include "optim_kernels.h"
#include "reduce_kernels.h"

/* Floats summed and applied at a time: 4 KiB of sum, on the stack, in L1
 * with the chunk of every array the optimizer touches. */
#define CHUNK 1024

/* Below this many variables waking the host threads costs more than it saves. */
#define UPDATE_MIN_PARALLEL ((size_t)1 << 15)

typedef struct update_job {
    castor__optim_consts consts;
    float *params, *state;
    const float *const *grads;
    int ngrads;
    size_t n;
} update_job;

static inline __attribute__((always_inline)) void
update_chunk(const update_job *j, float *sum, size_t at, size_t len)
{
    castor__reduce_chunk(sum, j->grads, j->ngrads, at, len);
    castor__optim_chunk(&j->consts, j->params + at, sum,
                        castor__optim_slot(&j->consts, j->state, j->n, 0, at),
                        castor__optim_slot(&j->consts, j->state, j->n, 1, at), len);
}

static void update_task(void *ctx, size_t begin, size_t end)
{
    const update_job *j = ctx;
    _Alignas(64) float sum[CHUNK];
    size_t at = begin;
    for (; at < end && end - at >= CHUNK; at += CHUNK)
        update_chunk(j, sum, at, CHUNK);
    if (at < end)
        update_chunk(j, sum, at, end - at);
}

void castor__host_update(castor__pool *pool, const castor_optimizer *opt, float *params,
                         float *state, const float *const *grads, int ngrads, size_t n,
                         int64_t step)
{
    update_job job = {castor__optim_consts_make(opt, step), params, state, grads, ngrads, n};
    castor__pool_for(pool, n, UPDATE_MIN_PARALLEL, update_task, &job);
}
