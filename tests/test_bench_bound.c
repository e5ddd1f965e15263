/*
 * bench/limits.c as functions: a run's lower bound and the bytes it should
 * move, from limits made up here for placements this machine cannot open
 * (GPUs: several replicas on one, one each, NCCL or not), beside the
 * emulated devices that bench_smoke.sh runs whole.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

enum { INPUT = 16, WIDTH = 8, CLASSES = 4, DEPTH = 1 };

/* input -> WIDTH relu -> CLASSES: the model bench.c builds. */
static const size_t PARAMS = INPUT * WIDTH + WIDTH + WIDTH * CLASSES + CLASSES;

static bench_config config;
static bench_limits limits;
static bench_host_cost host_cost;
static bench_gemm gemms[16];

/* Limits for `replicas` replicas, `cpu` of them emulated devices: every
 * GEMM at 1 us, copies at 10 GB/s, and host kernels of 1 ms (the sum), 2 ms
 * (central's pass) and 3 ms (the CPU replicas' updates; NaN without any, as
 * bench_measure_host_costs leaves it). */
static void make_limits(int replicas, int cpu, int same_device, int distinct_gpus, int batch)
{
    memset(&config, 0, sizeof config);
    config.input = INPUT;
    config.classes = CLASSES;
    config.optimizer = CASTOR_OPT_ADAM;
    config.replicas = replicas;
    memset(&limits, 0, sizeof limits);
    limits.replicas = replicas;
    limits.cpu_devices = cpu;
    limits.same_device = same_device;
    limits.distinct_gpus = distinct_gpus;
    limits.h2d_all = limits.d2h_all = limits.both_all = 1e10;
    host_cost = (bench_host_cost){PARAMS, 1e-3, 1.5e-3, 2e-3, cpu > 0 ? 3e-3 : NAN};
    limits.host_costs = &host_cost;
    limits.n_host_costs = 1;
    int rows = (batch + replicas - 1) / replicas;
    int n = bench_step_gemms(INPUT, WIDTH, DEPTH, CLASSES, rows, gemms, 16);
    cr_assert_eq(n, 5, "forward x2, dW x2, one dX");
    for (int i = 0; i < n; i++)
        gemms[i].seconds = 1e-6;
    limits.gemms = gemms;
    limits.n_gemms = limits.cap_gemms = n;
}

/* A run of `kind` that moved what the replica loop should move. */
static bench_result make_run(castor_strategy_kind kind, int replicas, int batch)
{
    bench_result r;
    memset(&r, 0, sizeof r);
    r.strategy = kind;
    r.width = WIDTH;
    r.depth = DEPTH;
    r.batch = batch;
    r.replicas = replicas;
    r.params = PARAMS;
    r.ok = 1;
    r.step_median = 0.1;
    bench_expected_bytes(&config, &limits, &r, &r.h2d_per_step, &r.d2h_per_step);
    return r;
}

Test(bench_bound, gemm_flops_are_the_whole_batch_forward_and_backward)
{
    make_limits(2, 2, 0, 0, 6);
    bench_result r = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bench_lower_bound(&config, &limits, &r);
    /* 2mnk per GEMM over the batch's rows: forward and dW on both layers,
     * dX on the second. */
    double want = 2.0 * 6 * (INPUT * WIDTH * 2 + WIDTH * CLASSES * 3);
    cr_assert_float_eq(r.flops, want, 1e-9 * want);
    cr_assert_float_eq(r.t_compute, 5e-6, 1e-15, "the busiest replica's five GEMMs");
}

Test(bench_bound, central_moves_variables_up_and_gradients_down_on_every_replica)
{
    make_limits(2, 2, 0, 0, 6);
    bench_result r = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    cr_assert_eq(r.h2d_per_step, 6.0 * (INPUT + 1) * 4 + 2 * 4.0 * PARAMS);
    cr_assert_eq(r.d2h_per_step, 6.0 * 8 + 2 * 4.0 * PARAMS);
    bench_lower_bound(&config, &limits, &r);
    cr_assert_eq(r.t_host, 2e-3, "central's one pass");
}

Test(bench_bound, mirrored_on_cpu_devices_sums_on_the_host_then_updates_on_each)
{
    make_limits(2, 2, 0, 0, 6);
    bench_result r = make_run(CASTOR_STRATEGY_MIRRORED, 2, 6);
    cr_assert_eq(r.h2d_per_step, 6.0 * (INPUT + 1) * 4 + 2 * 4.0 * PARAMS);
    bench_lower_bound(&config, &limits, &r);
    cr_assert_float_eq(r.t_host, 1e-3 + 3e-3, 1e-15);
}

/* cuda:0x2,cuda:1: not one GPU, not a GPU each, so mirrored sums on the
 * host and updates on the GPUs. The host term was the sum plus the CPU
 * replicas' updates, which are not measured without CPU replicas (NaN):
 * such runs got no bound at all. */
Test(bench_bound, mirrored_through_the_host_on_gpus_is_bound_by_the_sum)
{
    make_limits(3, 0, 0, 0, 6);
    bench_result r = make_run(CASTOR_STRATEGY_MIRRORED, 3, 6);
    cr_assert(bench_mirrored_reduces_on_host(&limits, &r));
    bench_lower_bound(&config, &limits, &r);
    cr_assert_eq(r.t_host, 1e-3, "the host's sum alone, not %g", r.t_host);
    cr_assert_eq(r.lower_bound, 1e-3);
    cr_assert_str_eq(r.bound_by, "host");
    cr_assert_float_eq(r.ratio, 100.0, 1e-9);
}

Test(bench_bound, mirrored_with_nccl_has_no_host_term)
{
    make_limits(2, 0, 0, 1, 6);
    bench_result r = make_run(CASTOR_STRATEGY_MIRRORED, 2, 6);
    cr_assert_not(bench_mirrored_reduces_on_host(&limits, &r));
    cr_assert_eq(r.d2h_per_step, 6.0 * 8, "row statistics only");
    bench_lower_bound(&config, &limits, &r);
    cr_assert_eq(r.t_host, 0.0);
}

/* Distinct GPUs: NCCL, unless the run's own bytes show every gradient came
 * down (NCCL could not start). A small model with a large batch sends more
 * bytes of row statistics (8 a row) than R gradients: that was taken for
 * the host's all-reduce. */
Test(bench_bound, nccl_told_from_the_host_fallback_by_the_gradient_bytes)
{
    int batch = 4096;
    make_limits(2, 0, 0, 1, batch);
    bench_result r = make_run(CASTOR_STRATEGY_MIRRORED, 2, batch);
    cr_assert_gt(r.d2h_per_step, 2 * 4.0 * PARAMS, "the case: rows outweigh the gradients");
    cr_assert_not(bench_mirrored_reduces_on_host(&limits, &r), "NCCL, row statistics only");
    r.d2h_per_step += 2 * 4.0 * PARAMS;
    cr_assert(bench_mirrored_reduces_on_host(&limits, &r), "every gradient came down");
}

Test(bench_bound, mirrored_on_one_shared_device_moves_only_the_batch)
{
    make_limits(2, 0, 1, 0, 6);
    bench_result r = make_run(CASTOR_STRATEGY_MIRRORED, 2, 6);
    cr_assert_not(bench_mirrored_reduces_on_host(&limits, &r));
    cr_assert_eq(r.h2d_per_step, 6.0 * (INPUT + 1) * 4);
    bench_lower_bound(&config, &limits, &r);
    cr_assert_eq(r.t_host, 0.0);
}

/* Transfer is the largest of the three copy times: here the both-ways rate
 * is the slowest, so (h2d + d2h) at it bounds the step, not either
 * direction alone (dropping that term left a bound under what the bus can
 * carry). */
Test(bench_bound, transfer_takes_the_both_ways_rate_when_it_is_slowest)
{
    make_limits(2, 2, 0, 0, 6);
    limits.both_all = 1e3;
    bench_result r = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bench_lower_bound(&config, &limits, &r);
    double want = (r.h2d_per_step + r.d2h_per_step) / 1e3;
    cr_assert_float_eq(r.t_transfer, want, 1e-12 * want);
    cr_assert_str_eq(r.bound_by, "transfer");
    cr_assert_float_eq(r.ratio, 0.1 / want, 1e-9 * (0.1 / want));
}

/* The host memory a step touches, which bench.json reports: Adam reads p, g,
 * m, v and writes p, m, v (7 floats a variable); the sum reads R gradients
 * and writes one. Central does both in one pass, the sum neither written nor
 * read back (2 floats a variable less); mirrored on CPU devices sums on the
 * host, then each replica updates its own copy. */
Test(bench_bound, host_bytes_count_the_sum_and_each_update)
{
    double n4 = 4.0 * PARAMS;
    make_limits(2, 2, 0, 0, 6);
    bench_result r = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bench_lower_bound(&config, &limits, &r);
    cr_assert_float_eq(r.host_bytes, (3 + 7 - 2) * n4, 1e-9, "got %g", r.host_bytes);
    r = make_run(CASTOR_STRATEGY_MIRRORED, 2, 6);
    bench_lower_bound(&config, &limits, &r);
    cr_assert_float_eq(r.host_bytes, (3 + 2 * 7) * n4, 1e-9, "got %g", r.host_bytes);
    config.optimizer = CASTOR_OPT_SGD;
    r = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bench_lower_bound(&config, &limits, &r);
    cr_assert_float_eq(r.host_bytes, (3 + 3 - 2) * n4, 1e-9, "got %g", r.host_bytes);
}

/* The transfer term is the bytes the step should move, not the run's own
 * counts: a strategy that regressed into copying three times the bytes got
 * a transfer term three times larger, and a ratio nearer 1, with only a
 * warning on stderr to say so. Now the bound stays, and bytes_as_expected
 * (in bench.json and bench.csv) says that the counts were off. */
Test(bench_bound, transfer_is_the_expected_bytes_not_the_counted_ones)
{
    make_limits(2, 2, 0, 0, 6);
    limits.h2d_all = limits.d2h_all = limits.both_all = 1e6;  /* transfer-bound */
    bench_result good = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bench_lower_bound(&config, &limits, &good);
    cr_assert(good.bytes_as_expected);
    cr_assert_eq(good.expected_h2d, good.h2d_per_step);
    cr_assert_eq(good.expected_d2h, good.d2h_per_step);
    cr_assert_str_eq(good.bound_by, "transfer");

    bench_result bad = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bad.h2d_per_step *= 3;
    bad.d2h_per_step *= 3;
    bench_lower_bound(&config, &limits, &bad);
    cr_assert_eq(bad.t_transfer, good.t_transfer, "%g, not the %g of the expected bytes",
                 bad.t_transfer, good.t_transfer);
    cr_assert_eq(bad.lower_bound, good.lower_bound);
    cr_assert_not(bad.bytes_as_expected);
    cr_assert_eq(bad.expected_h2d, good.expected_h2d);

    /* One direction off is enough; within 1% is as expected. */
    bench_result one = make_run(CASTOR_STRATEGY_MIRRORED, 2, 6);
    one.d2h_per_step *= 1.02;
    bench_lower_bound(&config, &limits, &one);
    cr_assert_not(one.bytes_as_expected);
    bench_result near = make_run(CASTOR_STRATEGY_MIRRORED, 2, 6);
    near.h2d_per_step *= 1.005;
    bench_lower_bound(&config, &limits, &near);
    cr_assert(near.bytes_as_expected);
}

/* The table names the runs whose counts were off, beside the bound. */
Test(bench_bound, the_table_names_runs_whose_bytes_were_off)
{
    make_limits(2, 2, 0, 0, 6);
    bench_result r[2] = {make_run(CASTOR_STRATEGY_CENTRAL, 2, 6),
                         make_run(CASTOR_STRATEGY_MIRRORED, 2, 6)};
    r[1].h2d_per_step *= 2;
    for (int i = 0; i < 2; i++)
        bench_lower_bound(&config, &limits, &r[i]);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    bench_print_table(f, &config, r, 2);
    fclose(f);
    cr_assert(strstr(text, "run 2: the run stats counted other bytes"), "%s", text);
    cr_assert_null(strstr(text, "run 1"), "%s", text);
    free(text);
}

/* ---- other processes' share of the cores (bench.c) ---- */

/* /proc/stat's first lines: the aggregate, then one a CPU. user nice system
 * idle iowait irq softirq steal guest guest_nice, in clock ticks. */
static double busy_of(const char *stat, const cpu_set_t *mask, int *cpus)
{
    FILE *f = fmemopen((void *)stat, strlen(stat), "r");
    cr_assert(f);
    double s = bench_stat_busy(f, mask, 100, cpus);
    fclose(f);
    return s;
}

/* taskset -c 0 castor bench ... beside a busy loop pinned to CPU 1 said
 * that other processes used 102% of the cores: the busy time was the
 * aggregate line's (every CPU), divided by the one core the bench may use,
 * and not capped. CPU 1 is not this process's to share. */
Test(bench_others, a_busy_loop_on_a_cpu_outside_the_mask_is_not_counted)
{
    const char *a = "cpu  1000 0 200 5000 0 0 0 0 0 0\n"
                    "cpu0 500 0 100 4000 0 0 0 0 0 0\n"
                    "cpu1 500 0 100 1000 0 0 0 0 0 0\n"
                    "intr 12345 0 0\n";
    /* One second later: the bench used 0.9 s of CPU 0 (90 ticks), another
     * process 0.05 s of it; the busy loop all of CPU 1. */
    const char *b = "cpu  1295 0 200 5005 0 0 0 0 0 0\n"
                    "cpu0 595 0 100 4005 0 0 0 0 0 0\n"
                    "cpu1 600 0 100 1000 0 0 0 0 0 0\n"
                    "intr 12399 0 0\n";
    cpu_set_t mask;
    CPU_ZERO(&mask);
    CPU_SET(0, &mask);
    int na, nb;
    double ba = busy_of(a, &mask, &na), bb = busy_of(b, &mask, &nb);
    cr_assert_eq(na, 1);
    cr_assert_eq(nb, 1);
    cr_assert_float_eq(ba, 6.0, 1e-9, "cpu0's user + system: %g s", ba);
    cr_assert_float_eq(bb, 6.95, 1e-9);
    double share = bench_others_share(ba, bb, 10.0, 10.9, 1.0, na);
    cr_assert_float_eq(share, 0.05, 1e-9, "%g", share);

    /* Over both CPUs: the busy loop is another process's, on a CPU this one
     * may use. */
    CPU_SET(1, &mask);
    ba = busy_of(a, &mask, &na);
    bb = busy_of(b, &mask, &nb);
    cr_assert_eq(na, 2);
    share = bench_others_share(ba, bb, 10.0, 10.9, 1.0, na);
    cr_assert_float_eq(share, (1.95 - 0.9) / 2.0, 1e-9, "%g", share);
}

/* "cpu%d" skipped the aggregate line's spaces and read its user ticks as a
 * CPU number: where they were small (a fresh container's virtual
 * /proc/stat, a VM just booted) and in the mask, every CPU's time was
 * counted again as one more CPU's (and 2^32 + 1 read as CPU 1). */
Test(bench_others, the_aggregate_line_is_no_cpu)
{
    cpu_set_t mask;
    CPU_ZERO(&mask);
    CPU_SET(0, &mask);
    CPU_SET(1, &mask);
    const char *small = "cpu  1 0 1 900 0 0 0 0 0 0\n"
                        "cpu0 1 0 0 450 0 0 0 0 0 0\n"
                        "cpu1 0 0 1 450 0 0 0 0 0 0\n"
                        "intr 1 0\n";
    int n;
    double busy = busy_of(small, &mask, &n);
    cr_assert_eq(n, 2, "%d CPUs counted, of two", n);
    cr_assert_float_eq(busy, 0.02, 1e-12, "%g s busy", busy);
    const char *wide = "cpu  4294967297 0 0 900 0 0 0 0 0 0\n"
                       "cpu0 100 0 0 450 0 0 0 0 0 0\n"
                       "cpu1 100 0 0 450 0 0 0 0 0 0\n"
                       "intr 1 0\n";
    busy = busy_of(wide, &mask, &n);
    cr_assert_eq(n, 2, "%d CPUs counted, of two", n);
    cr_assert_float_eq(busy, 2.0, 1e-12, "%g s busy", busy);
}

/* Ticks and getrusage round apart: a share past all or below none is
 * clamped; unknown stays unknown. */
Test(bench_others, the_share_is_within_0_and_1)
{
    cr_assert_eq(bench_others_share(0.0, 1.2, 0.0, 0.0, 1.0, 1), 1.0);
    cr_assert_eq(bench_others_share(0.0, 0.5, 0.0, 0.6, 1.0, 1), 0.0);
    cr_assert(isnan(bench_others_share(NAN, 1.0, 0.0, 0.0, 1.0, 1)));
    cr_assert(isnan(bench_others_share(0.0, 1.0, 0.0, 0.0, 1.0, 0)));
}

/* Steal, irq and softirq count as busy (time the CPU did not give anyone
 * here), idle and iowait do not; an old kernel's four fields still read;
 * CPUs of the mask without a line (offline) are not counted. */
Test(bench_others, busy_fields_and_missing_cpus)
{
    cpu_set_t mask;
    CPU_ZERO(&mask);
    CPU_SET(0, &mask);
    CPU_SET(3, &mask);
    int n;
    double s = busy_of("cpu  9 9 9 9 9 9 9 9 9 9\n"
                       "cpu0 1 2 3 1000 2000 4 5 6 7 8\n"
                       "cpu1 100 100 100 100\n",
                       &mask, &n);
    cr_assert_eq(n, 1);
    cr_assert_float_eq(s, (1 + 2 + 3 + 4 + 5 + 6) / 100.0, 1e-12, "%g", s);
    CPU_ZERO(&mask);
    CPU_SET(1, &mask);
    s = busy_of("cpu  9 9 9 9\ncpu0 1 1 1 1\ncpu1 10 20 30 40\n", &mask, &n);
    cr_assert_eq(n, 1);
    cr_assert_float_eq(s, 0.6, 1e-12, "%g", s);
    CPU_ZERO(&mask);
    CPU_SET(5, &mask);
    cr_assert(isnan(busy_of("cpu  1 1 1 1\ncpu0 1 1 1 1\n", &mask, &n)));
    cr_assert_eq(n, 0);
}

/* The bound is the largest term (no implementation beats it, even one that
 * overlaps everything); castor runs its phases in turn, so each run also
 * gets their sum. Central's host pass, below the largest term, vanished
 * from the bound; it is in the sum. */
Test(bench_bound, the_sum_of_the_terms_beside_the_largest)
{
    make_limits(2, 2, 0, 0, 6);
    bench_result r = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bench_lower_bound(&config, &limits, &r);
    cr_assert_eq(r.lower_bound, fmax(fmax(r.t_transfer, r.t_compute), r.t_host),
                 "the bound is still the largest term");
    double sum = r.t_transfer + r.t_compute + r.t_host;
    cr_assert_float_eq(r.serial_bound, sum, 1e-15, "%g, not %g", r.serial_bound, sum);
    cr_assert_gt(r.serial_bound, r.lower_bound);
    cr_assert_float_eq(r.serial_ratio, r.step_median / sum, 1e-12);

    /* A term that could not be measured leaves neither. */
    limits.h2d_all = limits.d2h_all = limits.both_all = NAN;  /* as a failed copy leaves them */
    r = make_run(CASTOR_STRATEGY_CENTRAL, 2, 6);
    bench_lower_bound(&config, &limits, &r);
    cr_assert(isnan(r.serial_bound) && isnan(r.serial_ratio) && isnan(r.lower_bound));
}
