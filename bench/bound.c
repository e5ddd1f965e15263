/*
 * The lower bound a run is judged by.
 *
 * A run's lower-bound step time, from the limits limits.c measures: the
 * largest of
 *   transfer  max(h2d bytes / h2d rate, d2h bytes / d2h rate,
 *                 (h2d + d2h) bytes / both-ways rate), all replicas at once
 *             (the two directions have their own streams, so they may overlap),
 *             with the bytes the replica loop should move (bench_expected_bytes),
 *             not the run's own counts: a strategy that regressed into copying
 *             more would otherwise raise its own bound;
 *   compute   the sum of the step's GEMM times (each measured with every
 *             replica running it at once, the busiest replica's rows);
 *   host      castor's own host kernels at the run's model size, timed
 *             alone: the reduction of R gradients where it runs on the host
 *             (central; mirrored with several replicas not all on GPUs, or
 *             when NCCL could not start), and the optimizer where it runs in
 *             host memory (central's on the host threads; mirrored's on each
 *             emulated CPU device, all at once on their replica threads).
 *             A rate from the triad was tried first and came out above what
 *             the runs' own host phases took: the kernels' real cost at the
 *             model's (often cache-sized) arrays is what bounds a step.
 * The largest term bounds any implementation, one that overlaps all three
 * completely included. castor runs its phases one after another (the
 * replicas' copies and GEMMs, then the host's sum and update; on GPUs only
 * the copies overlap the GEMMs, layer by layer), so its ratios stay above 1
 * even at the limits. Each run also gets the sum of the three terms, the
 * bound for phases that run in turn: the step against it says how far
 * castor is from its own phases' limits, and the sum against the largest
 * term how much overlapping them could win at most.
 * Elementwise kernels (bias, activations, the loss) are left out of compute:
 * the bound only gets looser, never wrong.
 */
#include "bench/bench.h"

#include <math.h>

int bench_optimizer_bytes(castor_optimizer_kind kind)
{
    switch (kind) {
    case CASTOR_OPT_ADAM:
    case CASTOR_OPT_ADAMW:
        return 7 * (int)sizeof(float); /* read p, g, m, v; write p, m, v */
    case CASTOR_OPT_SGD:
    default:
        return 3 * (int)sizeof(float); /* read p, g; write p (no momentum in the bench) */
    }
}

int bench_mirrored_reduces_on_host(const bench_limits *L, const bench_result *r)
{
    if (r->replicas <= 1)
        return 0;
    if (L->same_device)
        return 0;
    if (L->cpu_devices > 0 || !L->distinct_gpus)
        return 1;
    /* Distinct GPUs: NCCL, unless it could not start and the strategy fell
     * back to the host, which the run's own counters show: every replica's
     * gradient came down, beside the 2 floats of row statistics a row that
     * every run sends (with a small model and a large batch, more bytes
     * than R gradients). */
    return r->d2h_per_step - 8.0 * r->batch >= (double)r->replicas * 4.0 * (double)r->params;
}

int bench_mirrored_has_update_phase(const bench_limits *L, int replicas)
{
    (void)L;
    return replicas > 1;
}

void bench_expected_bytes(const bench_config *c, const bench_limits *L, const bench_result *r,
                          double *h2d, double *d2h)
{
    double n4 = 4.0 * (double)r->params;
    double R = r->replicas;
    /* The batch (x and int32 labels) up, 2 floats of row statistics per row down. */
    *h2d = (double)r->batch * (c->input + 1) * 4.0;
    *d2h = (double)r->batch * 8.0;
    if (r->strategy == CASTOR_STRATEGY_CENTRAL || bench_mirrored_reduces_on_host(L, r)) {
        /* central: the variables up, the gradient down, every replica;
         * mirrored through the host: the gradient down, the sum up. */
        *h2d += R * n4;
        *d2h += R * n4;
    }
}

static double safe_div(double a, double b)
{
    return b > 0 && isfinite(b) ? a / b : NAN;
}

void bench_lower_bound(const bench_config *c, const bench_limits *L, bench_result *r)
{
    int R = r->replicas;
    double n = (double)r->params;

    /* FLOPs: linear in rows, so the whole batch's. */
    double flops = 0;
    for (int l = 0; l <= r->depth; l++) {
        double in = l == 0 ? c->input : r->width;
        double out = l == r->depth ? c->classes : r->width;
        flops += 2.0 * r->batch * in * out * (l > 0 ? 3 : 2);
    }
    r->flops = flops;

    /* Compute: the busiest replica's GEMMs, each timed with all replicas at once. */
    bench_gemm g[3 * 64 + 3];
    int k = bench_step_gemms(c->input, r->width, r->depth, c->classes,
                             bench_rows_per_replica(r->batch, R), g, (int)(sizeof g / sizeof g[0]));
    double tc = 0;
    for (int i = 0; i < k && i < (int)(sizeof g / sizeof g[0]); i++) {
        const bench_gemm *m = bench_find_gemm(L, &g[i]);
        tc += m ? m->seconds : NAN;
    }
    r->t_compute = tc;

    /* Transfer: the bytes the step needs, at the rates of all replicas at
     * once. Not this run's own counts, which a regression that copies more
     * would raise, and its bound with them (the ratio then nearer 1); they
     * are compared, and the answer kept beside the bound. */
    double h2d, d2h;
    bench_expected_bytes(c, L, r, &h2d, &d2h);
    r->expected_h2d = h2d;
    r->expected_d2h = d2h;
    r->bytes_as_expected = fabs(r->h2d_per_step - h2d) <= 0.01 * h2d &&
                           fabs(r->d2h_per_step - d2h) <= 0.01 * d2h;
    double th = safe_div(h2d, L->h2d_all);
    double td = safe_div(d2h, L->d2h_all);
    double tb = safe_div(h2d + d2h, L->both_all);
    r->t_transfer = fmax(fmax(th, td), tb);

    /* Host: the reduction (reads R gradients, writes one), then the
     * optimizer wherever it runs in host memory: central's on the host, in
     * the same pass (the sum is neither written nor read back: 8 bytes a
     * variable less); mirrored's on each emulated CPU device, whose memory
     * is host memory. The bytes are reported; the time is castor's own
     * kernels at this model's size, measured alone on the host threads (a
     * rate from a triad on arrays far larger than the model came out above
     * what the runs' host phases took: not a bound). */
    double opt = (double)bench_optimizer_bytes(c->optimizer) * n;
    double reduce = (double)(R + 1) * sizeof(float) * n;
    int central = r->strategy == CASTOR_STRATEGY_CENTRAL;
    int host_reduce = central || bench_mirrored_reduces_on_host(L, r);
    int host_updates = central ? 1 : L->cpu_devices < R ? L->cpu_devices : R;
    r->host_bytes = (host_reduce ? reduce : 0.0) + host_updates * opt -
                    (central ? 2.0 * sizeof(float) * n : 0.0);
    const bench_host_cost *hc = bench_find_host_cost(L, r->params);
    if (!host_reduce && host_updates == 0)
        r->t_host = 0.0;  /* nothing of the step runs in host memory */
    else if (!hc)
        r->t_host = NAN;
    else if (central)
        r->t_host = hc->central_s;
    else  /* the host's sum, then the CPU replicas' updates at once, one thread
           * each: none on GPUs alone, where replica_opt_s is not measured */
        r->t_host = (host_reduce ? hc->reduce_s : 0.0) +
                    (host_updates > 0 ? hc->replica_opt_s : 0.0);

    /* A term that could not be measured leaves no bound: the largest of the
     * others could be far below the true one. */
    int measured = !isnan(r->t_transfer) && !isnan(r->t_compute) && !isnan(r->t_host);
    double lb = measured ? fmax(fmax(r->t_transfer, r->t_compute), r->t_host) : NAN;
    r->lower_bound = lb;
    r->bound_by = !(lb > 0)                ? "-"
                  : lb == r->t_transfer    ? "transfer"
                  : lb == r->t_compute     ? "compute"
                                           : "host";
    r->ratio = safe_div(r->step_median, lb);
    /* The bound for phases that run one after another: not castor's to beat
     * on emulated devices, where a replica's copies and GEMMs run in turn on
     * its thread; a GPU step may come under it (its copies overlap). */
    r->serial_bound = measured ? r->t_transfer + r->t_compute + r->t_host : NAN;
    r->serial_ratio = safe_div(r->step_median, r->serial_bound);
}
