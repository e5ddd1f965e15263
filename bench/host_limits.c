/*
 * The host's limits, for castor bench (see bound.c for how they are used):
 *
 *   host memory      a triad a[i] = b[i] + s*c[i] over three 64 MiB arrays
 *                    (larger than most caches: a machine with a bigger
 *                    last-level cache reports a cache rate; the figure is
 *                    shown, not used in the bound), split over a pool as large as the
 *                    strategy's host pool; counted as 12 bytes per element
 *                    (read b and c, write a), as STREAM counts it, without the
 *                    write-allocate read of a that most CPUs also do; and the
 *                    optimizer kernel alone on the same arrays;
 *   host step        castor's own host kernels at each model size of the grid:
 *                    the sum of the replicas' gradients on the host threads
 *                    (mirrored through the host), central's one pass that sums
 *                    and updates, and every emulated CPU replica's update at
 *                    once on its replica thread (as mirrored runs them): the
 *                    host term of a run's lower bound; and one optimizer
 *                    update on the host threads alone, shown for reference.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench/bench.h"
#include "host/optim.h"
#include "host/pool.h"
#include "host/reduce.h"
#include "host/update.h"
#include "src/cli/args.h"
#include "src/device_list.h"

/* ---- host memory ---------------------------------------------------------- */

typedef struct host_job {
    float *a, *b, *c;
    float s;
} host_job;

#define TRIAD_BLOCK 1024

/* restrict on parameters, where gcc takes it (on locals it did not, and the
 * loop stayed scalar: an arithmetic, not a memory, limit on few cores). */
static void triad_kernel(float *restrict a, const float *restrict b, const float *restrict c,
                         float s, size_t n)
{
    size_t i = 0;
    /* Full blocks have a constant trip count, which gcc -O2 vectorises. */
    for (; n - i >= TRIAD_BLOCK; i += TRIAD_BLOCK)
        for (size_t k = 0; k < TRIAD_BLOCK; k++)
            a[i + k] = b[i + k] + s * c[i + k];
    for (; i < n; i++)
        a[i] = b[i] + s * c[i];
}

static void triad_range(void *ctx, size_t begin, size_t end)
{
    const host_job *h = ctx;
    triad_kernel(h->a + begin, h->b + begin, h->c + begin, h->s, end - begin);
}

static void fill_range(void *ctx, size_t begin, size_t end)
{
    float *p = ctx;
    /* Written by the thread that will use it (first touch). */
    for (size_t i = begin; i < end; i++)
        p[i] = 1e-3f * (float)(i & 1023);
}

void bench_measure_host(const bench_config *c, bench_limits *L, castor__pool *hpool)
{
    size_t n = L->triad_elems;
    /* Four arrays: the triad uses three; the optimizer p, g and two slots. */
    float *mem = aligned_alloc(64, 4 * n * sizeof(float));
    if (!mem) {
        bench_note(L, "triad: out of host memory for 4 x %zu floats", n);
        return;
    }
    castor__pool_for(hpool, 4 * n, 0, fill_range, mem);
    host_job h = {mem, mem + n, mem + 2 * n, 3.0f};
    int trials = c->quick ? 3 : 7;
    double t[16];
    castor__pool_for(hpool, n, 0, triad_range, &h);  /* untimed */
    for (int i = 0; i < trials; i++) {
        double t0 = cli_now();
        castor__pool_for(hpool, n, 0, triad_range, &h);
        t[i] = cli_now() - t0;
    }
    L->triad_bw = 3.0 * sizeof(float) * (double)n / bench_fastest(t, trials);

    /* The optimizer kernel the central strategy runs, alone (a reference
     * for the runs' host update rate). */
    castor_optimizer opt = castor_optimizer_defaults(c->optimizer);
    float *p = mem, *g = mem + n, *state = mem + 2 * n;
    castor__optim_apply(hpool, &opt, p, g, state, n, 1);  /* untimed */
    for (int i = 0; i < trials; i++) {
        double t0 = cli_now();
        castor__optim_apply(hpool, &opt, p, g, state, n, 2 + i);
        t[i] = cli_now() - t0;
    }
    L->host_opt_rate = (double)n / bench_fastest(t, trials);
    free(mem);
}

/* ---- castor's host kernels at the grid's model sizes ------------------------- */

/* Variables of the bench's model: input -> depth x width -> classes. */
static size_t model_params(const bench_config *c, int width, int depth)
{
    size_t w = (size_t)width, in = (size_t)c->input, out = (size_t)c->classes;
    return in * w + w + (size_t)(depth - 1) * (w * w + w) + w * out + out;
}

const bench_host_cost *bench_find_host_cost(const bench_limits *L, size_t params)
{
    for (int i = 0; i < L->n_host_costs; i++)
        if (L->host_costs[i].params == params)
            return &L->host_costs[i];
    return NULL;
}

/* Each CPU replica's optimizer update on its own arrays, single-threaded,
 * all at once on the replica threads (device/cpu's optimizer_step). */
typedef struct replica_update {
    const castor_optimizer *opt;
    float *mem;    /* per CPU replica: p, g, m, v */
    size_t n;
    int64_t step;
    int replicas;  /* CPU replicas: the pool may have GPU replicas' threads too */
} replica_update;

static void replica_update_task(void *ctx, int index, int count)
{
    (void)count;
    const replica_update *u = ctx;
    if (index >= u->replicas)
        return;
    float *p = u->mem + 4 * u->n * (size_t)index;
    castor__optim_apply_range(u->opt, p, p + u->n, p + 2 * u->n, u->n, u->step, 0, u->n);
}

/* The cgroup v2 memory limit of this process's group, less what it uses;
 * SIZE_MAX where there is none ("max") or it cannot be read. */
static size_t cgroup_room(void)
{
    unsigned long long limit = 0, used = 0;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    int have = f && fscanf(f, "%llu", &limit) == 1;
    if (f)
        fclose(f);
    f = have ? fopen("/sys/fs/cgroup/memory.current", "r") : NULL;
    have = f && fscanf(f, "%llu", &used) == 1;
    if (f)
        fclose(f);
    if (!have)
        return SIZE_MAX;
    return used >= limit ? 0 : limit - used > SIZE_MAX ? SIZE_MAX : (size_t)(limit - used);
}

/* Host memory the bench may take for one measurement: half of what is
 * available (MemAvailable: free memory and the page cache the kernel can
 * drop; within a container's memory limit), so that a grid model the runs
 * would refuse cannot swap the machine or get the bench killed. */
size_t bench_host_memory_allowance(void)
{
    size_t room = cgroup_room() / 2;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        unsigned long long kib = 0;
        int found = 0;
        while (!found && fgets(line, sizeof line, f))
            found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
        fclose(f);
        if (found) {
            size_t half = kib / 2 > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)(kib / 2 * 1024);
            return half < room ? half : room;
        }
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0)
        return room;
    size_t half = (size_t)pages / 2 * (size_t)size;
    return half < room ? half : room;
}

/* The host kernels of a step over n variables (bench_host_cost), each the
 * fastest of a few trials after an untimed one. */
static void measure_host_cost(const bench_config *c, bench_limits *L, castor__pool *hpool,
                              castor__pool *rpool, bench_host_cost *hc)
{
    hc->reduce_s = hc->opt_s = hc->central_s = hc->replica_opt_s = NAN;
    size_t n = hc->params;
    int R = L->replicas > 0 ? L->replicas : 1;
    int cpu_reps = L->cpu_devices;
    castor_optimizer opt = castor_optimizer_defaults(c->optimizer);
    /* R gradients, their sum, the variables and two optimizer slots; and
     * p, g, m, v for each CPU replica. */
    size_t arrays = (size_t)R + 4 + 4 * (size_t)cpu_reps;
    float *mem = NULL;
    if (n && arrays <= SIZE_MAX / sizeof(float) / n &&
        arrays * n * sizeof(float) <= bench_host_memory_allowance())
        mem = aligned_alloc(64, (arrays * n * sizeof(float) + 63) / 64 * 64);
    if (!mem) {
        bench_note(L, "host kernels: no room in host memory for %zu parameters", n);
        return;
    }
    castor__pool_for(hpool, arrays * n, 0, fill_range, mem);
    const float *srcs[CASTOR__MAX_REPLICAS];
    for (int i = 0; i < R; i++)
        srcs[i] = mem + (size_t)i * n;
    float *sum = mem + (size_t)R * n, *p = sum + n, *state = p + n;
    replica_update u = {&opt, state + 2 * n, n, 1, cpu_reps};
    int trials = c->quick ? 3 : 5;
    double tr[8], to[8], tc[8], tu[8];
    for (int i = -1; i < trials; i++) {  /* i = -1: untimed */
        int64_t step = i + 2;              /* optimizer steps count from 1 */
        double t0 = cli_now();
        castor__reduce_sum(hpool, sum, srcs, R, n);
        double t1 = cli_now();
        castor__optim_apply(hpool, &opt, p, sum, state, n, step);
        double tm = cli_now();
        castor__host_update(hpool, &opt, p, state, srcs, R, n, step);
        double t2 = cli_now();
        double t3 = t2;
        if (cpu_reps > 0) {
            u.step = step;
            if (cpu_reps == 1)
                replica_update_task(&u, 0, 1);
            else
                castor__pool_run(rpool, replica_update_task, &u);  /* replica i: CPU device i */
            t3 = cli_now();
        }
        if (i >= 0) {
            tr[i] = t1 - t0;
            to[i] = tm - t1;
            tc[i] = t2 - tm;
            tu[i] = t3 - t2;
        }
    }
    hc->reduce_s = bench_fastest(tr, trials);
    hc->opt_s = bench_fastest(to, trials);
    hc->central_s = bench_fastest(tc, trials);
    if (cpu_reps > 0)
        hc->replica_opt_s = bench_fastest(tu, trials);
    free(mem);
}

int bench_measure_host_costs(const bench_config *c, bench_limits *L, castor__pool *hpool,
                             castor__pool *rpool)
{
    for (int w = 0; w < c->n_widths; w++)
        for (int d = 0; d < c->n_depths; d++) {
            size_t params = model_params(c, c->widths[w], c->depths[d]);
            if (bench_find_host_cost(L, params))
                continue;
            bench_host_cost *grown =
                realloc(L->host_costs, (size_t)(L->n_host_costs + 1) * sizeof *grown);
            if (!grown)
                return -1;
            L->host_costs = grown;
            bench_host_cost *hc = &L->host_costs[L->n_host_costs++];
            hc->params = params;
            bench_progress("limits: host reduction and %s update, %zu parameters",
                           castor_optimizer_kind_name(c->optimizer), params);
            measure_host_cost(c, L, hpool, rpool, hc);
        }
    return 0;
}
