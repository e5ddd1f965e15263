/*
 * The limits a run is judged by, measured in the same process as the runs:
 *
 *   copy bandwidth   host->device and device->host through the device
 *                    interface, between host buffers (pinned by CUDA where
 *                    a GPU is among the devices) and device memory: one
 *                    replica alone, every replica at once, and every
 *                    replica copying both ways at once; on an emulated CPU
 *                    device every copy goes to a region of buffers larger
 *                    than the last-level cache that no recent copy touched,
 *                    as a step's copies of megabytes between distinct
 *                    buffers do (measure_copies);
 *   host             host memory bandwidth and castor's host kernels at each
 *                    model size (host_limits.c);
 *   GEMM rate        every GEMM shape a training step issues, run on every
 *                    replica's device at once, as the step runs them.
 *
 * From them bound.c works out each run's lower-bound step time.
 * Every limit is the fastest of its trials: other work only slows a trial.
 */
#include "bench/bench.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device.h"
#include "host/pinned.h"
#include "host/cores.h"
#include "host/pool.h"
#include "src/cli/args.h"
#include "src/device_list.h"

/* Emulated CPU devices opened for the measurements: the budget is only
 * bookkeeping there, so give them room for the largest GEMM. */
#define CPU_LIMIT_BUDGET ((size_t)16 << 30)

void bench_note(bench_limits *L, const char *fmt, ...)
{
    size_t len = strlen(L->note);
    if (len + 2 >= sizeof L->note)
        return;
    if (len) {
        L->note[len++] = ';';
        L->note[len++] = ' ';
        L->note[len] = '\0';
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->note + len, sizeof L->note - len, fmt, ap);
    va_end(ap);
}

/* The fastest of n trials: a limit is what the machine can do, and other
 * work on it only ever slows a trial down (a median of a few short trials
 * on a busy machine came out 1.5-2.5x slow). Step times stay medians. */
double bench_fastest(const double *v, int n)
{
    double best = NAN;
    for (int i = 0; i < n; i++)
        if (!(v[i] >= best))
            best = v[i];
    return best;
}

/* ---- the GEMMs of a step ------------------------------------------------- */

int bench_step_gemms(int input, int width, int depth, int classes, int rows, bench_gemm *out,
                     int cap)
{
    int count = 0;
    for (int l = 0; l <= depth; l++) {
        int in = l == 0 ? input : width;
        int o = l == depth ? classes : width;
        /* As src/replica.c issues them: forward y = x W; backward dW = x^T dy
         * and, for every layer but the first, dx = dy W^T. */
        bench_gemm g[3] = {{0, 0, rows, o, in, NAN, NAN},
                           {1, 0, in, o, rows, NAN, NAN},
                           {0, 1, rows, in, o, NAN, NAN}};
        int k = l > 0 ? 3 : 2;
        for (int j = 0; j < k; j++) {
            if (count < cap)
                out[count] = g[j];
            count++;
        }
    }
    return count;
}

static int same_shape(const bench_gemm *a, const bench_gemm *b)
{
    return a->ta == b->ta && a->tb == b->tb && a->m == b->m && a->n == b->n && a->k == b->k;
}

const bench_gemm *bench_find_gemm(const bench_limits *L, const bench_gemm *g)
{
    for (int i = 0; i < L->n_gemms; i++)
        if (same_shape(&L->gemms[i], g))
            return &L->gemms[i];
    return NULL;
}

static int add_gemm(bench_limits *L, const bench_gemm *g)
{
    if (bench_find_gemm(L, g))
        return 0;
    if (L->n_gemms == L->cap_gemms) {
        int cap = L->cap_gemms ? 2 * L->cap_gemms : 32;
        bench_gemm *p = realloc(L->gemms, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        L->gemms = p;
        L->cap_gemms = cap;
    }
    L->gemms[L->n_gemms++] = *g;
    return 0;
}

int bench_rows_per_replica(int batch, int replicas)
{
    return (batch + replicas - 1) / replicas; /* the busiest replica's */
}

/* ---- devices ------------------------------------------------------------- */

typedef struct devset {
    cdev *dev[CASTOR__MAX_REPLICAS];
    int n;
    int cuda;  /* how many of them are GPUs */
} devset;

static void devset_close(devset *ds)
{
    for (int i = 0; i < ds->n; i++)
        castor__cdev_destroy(ds->dev[i]);
    ds->n = 0;
}

/* The devices castor_strategy_create opens for the list (the same parser
 * and opening); the CPU devices' budget is only bookkeeping here, so it
 * makes room for the largest GEMM. */
static int devset_open(devset *ds, const bench_config *c, char *err, size_t errlen)
{
    memset(ds, 0, sizeof *ds);
    castor__device_entry entries[CASTOR__MAX_REPLICAS];
    int n_entries = 0;
    if (castor__device_list_parse(c->devices, entries, &n_entries, err, errlen))
        return -1;
    size_t cpu_budget = c->device_memory > CPU_LIMIT_BUDGET ? c->device_memory : CPU_LIMIT_BUDGET;
    int rc = castor__devices_open(entries, n_entries, cpu_budget, c->device_memory, c->tf32,
                                  ds->dev, &ds->n, err, errlen);
    for (int i = 0; i < ds->n; i++)
        ds->cuda += strcmp(ds->dev[i]->iface->backend, "cuda") == 0;
    if (rc)
        return -1;
    if (ds->n == 0) {
        snprintf(err, errlen, "no devices in '%s'", c->devices);
        return -1;
    }
    return 0;
}

/* ---- work on every device at once ---------------------------------------- */

enum { JOB_H2D, JOB_D2H, JOB_BOTH, JOB_GEMM };

typedef struct dev_bufs {
    castor__host_buf h_src, h_dst;  /* pinned by CUDA for GPUs */
    void *d_a, *d_b, *d_c;
    size_t a_bytes, b_bytes, c_bytes;
    /* Copies: with sweep, each copy starts where the last one in its
     * direction ended (up: h_src -> d_a, down: d_b -> h_dst), wrapping at
     * span bytes; without, every copy is at offset 0. */
    int sweep;
    size_t span, up, down;
} dev_bufs;

typedef struct job {
    devset *ds;
    dev_bufs *bufs;
    int kind;
    int ndev;      /* devices taking part: 0..ndev-1 */
    int reps;
    size_t bytes;  /* per copy */
    const bench_gemm *g;
    int status[CASTOR__MAX_REPLICAS];
} job;

/* Where the next copy of `bytes` in one direction goes (see dev_bufs). */
static size_t next_offset(const dev_bufs *b, size_t *pos, size_t bytes)
{
    if (!b->sweep)
        return 0;
    if (*pos + bytes > b->span)
        *pos = 0;
    size_t at = *pos;
    *pos += bytes;
    return at;
}

static int job_one(job *j, int i)
{
    cdev *dev = j->ds->dev[i];
    const cdev_iface *f = dev->iface;
    dev_bufs *b = &j->bufs[i];
    int rc = 0;
    for (int r = 0; r < j->reps && !rc; r++) {
        size_t up = 0, down = 0;
        if (j->kind == JOB_H2D || j->kind == JOB_BOTH)
            up = next_offset(b, &b->up, j->bytes);
        if (j->kind == JOB_D2H || j->kind == JOB_BOTH)
            down = next_offset(b, &b->down, j->bytes);
        char *d_a = (char *)b->d_a + up, *d_b = (char *)b->d_b + down;
        const char *h_src = (const char *)b->h_src.ptr + up;
        char *h_dst = (char *)b->h_dst.ptr + down;
        switch (j->kind) {
        case JOB_H2D:
            rc = f->copy_h2d(dev, CDEV_STREAM_H2D, d_a, h_src, j->bytes);
            break;
        case JOB_D2H:
            rc = f->copy_d2h(dev, CDEV_STREAM_D2H, h_dst, d_b, j->bytes);
            break;
        case JOB_BOTH:
            rc = f->copy_h2d(dev, CDEV_STREAM_H2D, d_a, h_src, j->bytes);
            if (!rc)
                rc = f->copy_d2h(dev, CDEV_STREAM_D2H, h_dst, d_b, j->bytes);
            break;
        default: {
            const bench_gemm *g = j->g;
            int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
            rc = f->gemm(dev, g->ta, g->tb, g->m, g->n, g->k, 1.0f, b->d_a, lda, b->d_b, ldb,
                         0.0f, b->d_c, g->n);
            break;
        }
        }
    }
    if (!rc)
        rc = f->synchronize(dev);
    return rc;
}

static void job_task(void *ctx, int index, int count)
{
    (void)count;
    job *j = ctx;
    if (index < j->ndev)
        j->status[index] = job_one(j, index);
}

/* Seconds for one run of the job on ndev devices at once (1: on this thread);
 * NaN on failure, with the device's message noted. */
static double run_job(bench_limits *L, castor__pool *pool, job *j)
{
    for (int i = 0; i < CASTOR__MAX_REPLICAS; i++)
        j->status[i] = 0;
    double t0 = cli_now();
    if (j->ndev == 1)
        j->status[0] = job_one(j, 0);
    else
        castor__pool_run(pool, job_task, j);
    double t = cli_now() - t0;
    for (int i = 0; i < j->ndev; i++) {
        if (j->status[i]) {
            bench_note(L, "%s", j->ds->dev[i]->errmsg); /* it names the device */
            return NAN;
        }
    }
    return t;
}

/* Fastest of `trials` runs, after one untimed run. */
static double time_job(bench_limits *L, castor__pool *pool, job *j, int trials)
{
    double t[16];
    if (trials > 16)
        trials = 16;
    if (isnan(run_job(L, pool, j)))
        return NAN;
    for (int i = 0; i < trials; i++)
        if (isnan(t[i] = run_job(L, pool, j)))
            return NAN;
    return bench_fastest(t, trials);
}

static void free_bufs(devset *ds, dev_bufs *bufs)
{
    for (int i = 0; i < ds->n; i++) {
        dev_bufs *b = &bufs[i];
        castor__host_free(&b->h_src);
        castor__host_free(&b->h_dst);
        if (b->d_a)
            castor__cdev_free(ds->dev[i], b->d_a, b->a_bytes);
        if (b->d_b)
            castor__cdev_free(ds->dev[i], b->d_b, b->b_bytes);
        if (b->d_c)
            castor__cdev_free(ds->dev[i], b->d_c, b->c_bytes);
        memset(b, 0, sizeof *b);
    }
}

static int alloc_dev(cdev *dev, size_t bytes, void **p, size_t *held)
{
    if (castor__cdev_alloc(dev, bytes, p))
        return -1;
    *held = bytes;
    return dev->iface->memset0(dev, CDEV_STREAM_COMPUTE, *p, bytes) ? -1 : 0;
}

/* bytes/seconds, or the better of that and *best. */
static void keep_fastest(double *best, double bytes, double seconds)
{
    double rate = bytes / seconds;
    if (!(*best >= rate))
        *best = rate;
}

/* The largest cache a core of this process has (the last level), from
 * sysfs for the first CPU it may run on, else sysconf; 0 when unknown. */
static size_t last_level_cache(void)
{
    int cpu = 0;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, &allowed))
            cpu++;
    size_t best = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], unit = 0;
        unsigned long long v = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/size", cpu, i);
        FILE *f = fopen(path, "re");
        if (!f)
            break;
        int got = fscanf(f, "%llu%c", &v, &unit);
        fclose(f);
        if (got < 1)
            continue;
        v *= unit == 'K' ? 1024ull : unit == 'M' ? 1048576ull : unit == 'G' ? 1073741824ull : 1;
        if (v > best && v < SIZE_MAX / 8)
            best = (size_t)v;
    }
    if (best)
        return best;
    /* sysconf may give the whole package's L3 (a VM's CPUID), larger than a
     * core sees: regions sized from it are only larger than they need be. */
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l3 > 0 ? (size_t)l3 : l2 > 0 ? (size_t)l2 : 0;
}

/* What a CPU device's copy buffers span (bench_limits.copy_span): a step
 * copies megabytes of variables, gradients and batches between distinct
 * buffers that its GEMMs have pushed out of the caches, at memory speed.
 * Copies repeated between the same two buffers of a few KiB ran from L1/L2
 * at 50-130 GB/s on a machine whose triad gave 18 GB/s, a transfer term
 * ten times too small. So every copy goes to the next region of buffers
 * that each span twice the last-level cache, and a region comes back only
 * after all the others have been copied: twice, not once, because an
 * adaptive replacement policy keeps part of a loop over just the cache's
 * size resident. */
static size_t cpu_copy_span(bench_limits *L, size_t bytes, int cpu_devices)
{
    size_t llc = last_level_cache();
    L->llc_bytes = llc;
    size_t want = llc ? 2 * llc : (size_t)128 << 20;  /* unknown: a generous guess */
    size_t span = bytes;
    while (span < want && span <= SIZE_MAX / 8)
        span *= 2;  /* a multiple of every copy size: no region is cut short */
    /* Four buffers a device: h_src, d_a, d_b, h_dst. */
    size_t room = bench_host_memory_allowance();
    while (span > bytes && 4.0 * (double)span * cpu_devices > (double)room)
        span /= 2;
    if (span < want)
        bench_note(L, "copies: host memory has room for emulated devices' buffers of %zu MiB "
                   "only, less than twice the last-level cache (%zu MiB%s): their copy rate "
                   "may be cache-hot", span >> 20, want >> 21, llc ? "" : ", a guess");
    return span;
}

/* Each rate is the fastest over copies of L->copy_bytes down to 1/4096 of it
 * (1/64 with emulated devices; every trial moves copy_bytes per device): a
 * step copies whole arenas and single layers. On a GPU the largest copy is
 * the fastest, and pinned copies over PCIe do not care where the host's
 * bytes are cached: the copies repeat between the same buffers. On an
 * emulated CPU device they sweep regions larger than the cache
 * (cpu_copy_span), as a step's do. */
static void measure_copies(const bench_config *c, bench_limits *L, devset *ds,
                           castor__pool *pool)
{
    dev_bufs bufs[CASTOR__MAX_REPLICAS];
    memset(bufs, 0, sizeof bufs);
    size_t bytes = L->copy_bytes;
    int trials = c->quick ? 3 : 7;
    /* Only CUDA pins: the emulated device's copies are memcpy (host/pinned.h). */
    L->copy_pinned = ds->cuda > 0;
    /* With emulated devices among them (GPUs in a mixed list too), from
     * 1/64: thousands of copies to distinct regions before one synchronize
     * spend their time in the emulated streams' ordering checks (one record
     * each), not in copying (4 KiB copies took 3 s for 0.2 GB/s). GPUs alone
     * from 1/4096. */
    int shift = ds->n > ds->cuda ? 6 : 12;
    L->copy_min_bytes = bytes >> shift ? bytes >> shift : bytes;
    L->copy_span = ds->n > ds->cuda ? cpu_copy_span(L, bytes, ds->n - ds->cuda) : 0;
    for (int i = 0; i < ds->n; i++) {
        dev_bufs *b = &bufs[i];
        b->sweep = strcmp(ds->dev[i]->iface->backend, "cuda") != 0;
        b->span = b->sweep ? L->copy_span : bytes;
        if (castor__host_alloc(&b->h_src, b->span, ds->cuda) ||
            castor__host_alloc(&b->h_dst, b->span, ds->cuda)) {
            bench_note(L, "copies: out of host memory for %zu-byte buffers", b->span);
            goto out;
        }
        L->copy_pinned &= b->h_src.locked & b->h_dst.locked;
        memset(b->h_src.ptr, 1, b->span);
        if (alloc_dev(ds->dev[i], b->span, &b->d_a, &b->a_bytes) ||
            alloc_dev(ds->dev[i], b->span, &b->d_b, &b->b_bytes) ||
            ds->dev[i]->iface->synchronize(ds->dev[i])) {
            bench_note(L, "copies: %s", ds->dev[i]->errmsg);
            goto out;
        }
    }
    if (ds->cuda && !L->copy_pinned)
        bench_note(L, "CUDA could not pin the copy buffers: copies from pageable memory");
    for (size_t size = L->copy_min_bytes; size <= bytes; size *= 4) {
        job j = {.ds = ds, .bufs = bufs, .reps = (int)(bytes / size), .bytes = size};
        double moved = (double)bytes, t;
        j.ndev = 1;
        j.kind = JOB_H2D;
        if (isnan(t = time_job(L, pool, &j, trials)))
            goto failed;
        keep_fastest(&L->h2d_one, moved, t);
        j.kind = JOB_D2H;
        if (isnan(t = time_job(L, pool, &j, trials)))
            goto failed;
        keep_fastest(&L->d2h_one, moved, t);
        j.ndev = ds->n;
        j.kind = JOB_H2D;
        if (isnan(t = time_job(L, pool, &j, trials)))
            goto failed;
        keep_fastest(&L->h2d_all, moved * ds->n, t);
        j.kind = JOB_D2H;
        if (isnan(t = time_job(L, pool, &j, trials)))
            goto failed;
        keep_fastest(&L->d2h_all, moved * ds->n, t);
        j.kind = JOB_BOTH;
        if (isnan(t = time_job(L, pool, &j, trials)))
            goto failed;
        keep_fastest(&L->both_all, 2.0 * moved * ds->n, t);
    }
    goto out;
failed:
    /* A rate measured at some sizes only could be below the true limit. */
    L->h2d_one = L->d2h_one = L->h2d_all = L->d2h_all = L->both_all = NAN;
out:
    free_bufs(ds, bufs);
}

static void measure_gemm(const bench_config *c, bench_limits *L, devset *ds, castor__pool *pool,
                         bench_gemm *g)
{
    dev_bufs bufs[CASTOR__MAX_REPLICAS];
    memset(bufs, 0, sizeof bufs);
    size_t f = sizeof(float);
    size_t a = (size_t)g->m * (size_t)g->k * f, b = (size_t)g->k * (size_t)g->n * f,
           cc = (size_t)g->m * (size_t)g->n * f;
    /* An emulated device's memory is host memory, and its budget here is
     * only bookkeeping: a grid shape that the runs' budget would refuse must
     * not take the machine's memory (a GPU refuses what it cannot hold). */
    double host_bytes = ((double)a + (double)b + (double)cc) * (ds->n - ds->cuda);
    if (host_bytes > (double)bench_host_memory_allowance()) {
        bench_note(L, "gemm %dx%dx%d: %.0f MiB on the emulated devices is more than half the "
                   "host memory available: not measured", g->m, g->n, g->k, host_bytes / 1048576.0);
        return;
    }
    for (int i = 0; i < ds->n; i++) {
        cdev *dev = ds->dev[i];
        if (alloc_dev(dev, a, &bufs[i].d_a, &bufs[i].a_bytes) ||
            alloc_dev(dev, b, &bufs[i].d_b, &bufs[i].b_bytes) ||
            alloc_dev(dev, cc, &bufs[i].d_c, &bufs[i].c_bytes) || dev->iface->synchronize(dev)) {
            bench_note(L, "gemm %dx%dx%d: %s", g->m, g->n, g->k, dev->errmsg);
            goto out;
        }
    }
    job j = {.ds = ds, .bufs = bufs, .kind = JOB_GEMM, .ndev = ds->n, .reps = 1, .g = g};
    /* Untimed, then enough calls per trial to outlast the clock's and the
     * threads' wake-up noise. */
    double t1 = run_job(L, pool, &j);
    if (isnan(t1))
        goto out;
    t1 = run_job(L, pool, &j);
    if (isnan(t1))
        goto out;
    double target = c->quick ? 0.01 : 0.04;
    double reps = t1 > 0 ? target / t1 : 1000;
    j.reps = reps < 2 ? 2 : reps > 2000 ? 2000 : (int)reps;
    int trials = c->quick ? 2 : 3;
    double t[3];
    for (int i = 0; i < trials; i++)
        if (isnan(t[i] = run_job(L, pool, &j)))
            goto out;
    g->seconds = bench_fastest(t, trials) / j.reps;
    g->gflops = 2.0 * g->m * g->n * (double)g->k * ds->n / g->seconds / 1e9;
out:
    free_bufs(ds, bufs);
}

/* ---- all of it ------------------------------------------------------------ */

int bench_limits_measure(const bench_config *c, bench_limits *L)
{
    memset(L, 0, sizeof *L);
    L->h2d_one = L->d2h_one = L->h2d_all = L->d2h_all = L->both_all = NAN;
    L->triad_bw = L->host_opt_rate = NAN;
    double t0 = cli_now();

    /* Every GEMM shape of the grid, at the busiest replica's rows. */
    for (int w = 0; w < c->n_widths; w++)
        for (int d = 0; d < c->n_depths; d++)
            for (int b = 0; b < c->n_batches; b++) {
                bench_gemm g[3 * 64 + 3];
                int rows = bench_rows_per_replica(c->batches[b], c->replicas);
                int k = bench_step_gemms(c->input, c->widths[w], c->depths[d], c->classes, rows,
                                         g, (int)(sizeof g / sizeof g[0]));
                for (int i = 0; i < k && i < (int)(sizeof g / sizeof g[0]); i++)
                    if (add_gemm(L, &g[i])) {
                        snprintf(L->note, sizeof L->note, "out of memory");
                        return -1;
                    }
            }

    L->host_threads = c->host_threads ? c->host_threads : castor__cpu_count();
    L->triad_elems = (size_t)16 << 20; /* 3 x 64 MiB */
    L->copy_bytes = c->quick ? (size_t)16 << 20 : (size_t)64 << 20;

    char err[384] = "";
    devset ds;
    if (devset_open(&ds, c, err, sizeof err)) {
        devset_close(&ds);
        snprintf(L->note, sizeof L->note, "%s", err);
        return -1;
    }
    snprintf(L->backend, sizeof L->backend, "%s",
             ds.cuda == 0 ? "cpu" : ds.cuda == ds.n ? "cuda" : "mixed");
    L->replicas = ds.n;
    L->cpu_devices = ds.n - ds.cuda;
    for (int i = 0; i < ds.n; i++) {
        int first = strcmp(ds.dev[i]->iface->backend, "cuda") == 0;
        for (int j = 0; j < i && first; j++)
            first = !(strcmp(ds.dev[j]->iface->backend, "cuda") == 0 &&
                      ds.dev[j]->ordinal == ds.dev[i]->ordinal);
        L->gpus += first;
    }
    /* What src/mirrored.c chooses its all-reduce by. */
    castor__placement where = castor__devices_placement(ds.dev, ds.n);
    L->same_device = where.same_device;
    L->distinct_gpus = where.distinct_gpus;
    castor__pool *pool = NULL, *hpool = NULL;
    int why = 0;
    if (castor__pool_create(ds.n, &pool, &why) ||
        castor__pool_create(L->host_threads, &hpool, &why)) {
        castor__pool_free(pool);
        devset_close(&ds);
        snprintf(L->note, sizeof L->note, "cannot start threads%s%s", why ? ": " : "",
                 why ? strerror(why) : "");
        return -1;
    }

    bench_progress("limits: host memory (triad, %d threads, 3 x %zu MiB)", L->host_threads,
                   L->triad_elems * sizeof(float) >> 20);
    bench_measure_host(c, L, hpool);
    bench_progress("limits: copies host<->device (%zu MiB, %d device%s)", L->copy_bytes >> 20,
                   ds.n, ds.n > 1 ? "s" : "");
    measure_copies(c, L, &ds, pool);
    if (bench_measure_host_costs(c, L, hpool, pool))
        bench_note(L, "host kernels: out of memory");
    for (int i = 0; i < L->n_gemms; i++) {
        bench_gemm *g = &L->gemms[i];
        bench_progress("limits: GEMM %d/%d  %s%s m=%d n=%d k=%d", i + 1, L->n_gemms,
                       g->ta ? "T" : "N", g->tb ? "T" : "N", g->m, g->n, g->k);
        measure_gemm(c, L, &ds, pool, g);
    }
    castor__pool_free(hpool);
    castor__pool_free(pool);
    devset_close(&ds);
    L->seconds = cli_now() - t0;
    return 0;
}

void bench_limits_free(bench_limits *L)
{
    free(L->gemms);
    L->gemms = NULL;
    L->n_gemms = L->cap_gemms = 0;
    free(L->host_costs);
    L->host_costs = NULL;
    L->n_host_costs = 0;
}
