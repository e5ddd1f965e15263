/*
 * bench.json when memory runs out: every allocation cJSON makes while the
 * report is built and printed is made to fail in turn, alone and with all
 * after it (cJSON_InitHooks; each test runs in a process of its own, so the
 * hook touches no other test). bench_write_json must then say "out of
 * memory" and write nothing, or write the whole report: never one that
 * silently lacks a field.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "bench/bench.h"
#include "checkpoint_support.h"
#include "support.h"

/* Allocations cJSON may make before one fails (-1: none fails), and
 * whether every one after it fails too or that one alone. */
static long allocs_left = -1;
static int fail_the_rest;

static void *limited_malloc(size_t size)
{
    if (allocs_left == 0) {
        if (!fail_the_rest)
            allocs_left = -1;
        return NULL;
    }
    if (allocs_left > 0)
        allocs_left--;
    return malloc(size);
}

static bench_config config;
static bench_limits limits;
static bench_host_cost host_cost;
static bench_gemm gemms[2];
static bench_result results[2];

/* A report with something in every part: the config, the limits with a
 * host cost and two GEMMs, a run that trained and one that failed. */
static void make_report(void)
{
    config.devices = "cpu:2";
    config.strategies[0] = CASTOR_STRATEGY_CENTRAL;
    config.strategies[1] = CASTOR_STRATEGY_MIRRORED;
    config.n_strategies = 2;
    config.widths[0] = 8, config.n_widths = 1;
    config.depths[0] = 1, config.n_depths = 1;
    config.batches[0] = 4, config.n_batches = 1;
    config.steps = 3, config.warmup = 1, config.input = 16, config.classes = 4;
    config.optimizer = CASTOR_OPT_ADAM;
    config.seed = 1, config.replicas = 2;
    config.others_before = config.others_during = 0.01, config.others_cpus = 2;
    snprintf(limits.backend, sizeof limits.backend, "cpu");
    limits.replicas = limits.cpu_devices = 2;
    limits.copy_bytes = 1 << 20, limits.copy_min_bytes = 1 << 14;
    limits.h2d_one = limits.d2h_one = limits.h2d_all = limits.d2h_all = 1e10;
    limits.both_all = 2e10, limits.triad_bw = 3e10, limits.host_opt_rate = 1e9;
    limits.host_threads = 2, limits.triad_elems = 1 << 20;
    host_cost = (bench_host_cost){.params = 172, .reduce_s = 1e-6, .opt_s = 2e-6,
                                  .central_s = 3e-6, .replica_opt_s = 4e-6};
    limits.host_costs = &host_cost, limits.n_host_costs = 1;
    gemms[0] = (bench_gemm){.m = 4, .n = 8, .k = 16, .seconds = 1e-6, .gflops = 1};
    gemms[1] = (bench_gemm){.ta = 1, .m = 16, .n = 8, .k = 4, .seconds = 1e-6, .gflops = 1};
    limits.gemms = gemms, limits.n_gemms = limits.cap_gemms = 2;
    limits.seconds = 0.5;
    snprintf(limits.note, sizeof limits.note, "made up for the test");
    results[0] = (bench_result){.strategy = CASTOR_STRATEGY_CENTRAL, .width = 8, .depth = 1,
                                .batch = 4, .replicas = 2, .params = 172, .ok = 1,
                                .steps = 3, .step_median = 1e-3, .step_min = 1e-3,
                                .step_max = 2e-3, .bound_by = "host", .lower_bound = 1e-4,
                                .ratio = 10, .t_compute = 1e-5, .flops = 1e6};
    results[1] = (bench_result){.strategy = CASTOR_STRATEGY_MIRRORED, .width = 8, .depth = 1,
                                .batch = 4, .replicas = 2, .params = 172, .ok = 0};
    snprintf(results[1].error, sizeof results[1].error, "a run that failed");
}

/* path's text without its "date" line (the clock moves between writes). */
static char *text_without_date(const char *path)
{
    size_t len = 0;
    unsigned char *bytes = ckpt_slurp(path, &len);
    cr_assert(bytes, "cannot read %s", path);
    char *text = realloc(bytes, len + 1);
    cr_assert(text);
    text[len] = '\0';
    char *date = strstr(text, "\"date\":");
    cr_assert(date, "%s has no date", path);
    char *eol = strchr(date, '\n');
    cr_assert(eol);
    memmove(date, eol + 1, strlen(eol + 1) + 1);
    return text;
}

static void sweep(int rest)
{
    make_report();
    fail_the_rest = rest;
    cJSON_Hooks hooks = {.malloc_fn = limited_malloc, .free_fn = free};
    cJSON_InitHooks(&hooks);
    char whole[SUPPORT_PATH_LEN], path[SUPPORT_PATH_LEN], err[512];
    support_path_in(whole, "whole.json");
    cr_assert_eq(bench_write_json(whole, &config, &limits, results, 2, 1.5, err, sizeof err), 0,
                 "%s", err);
    char *expected = text_without_date(whole);
    int failures = 0;
    for (long budget = 0;; budget++) {
        cr_assert(budget < 100000, "bench_write_json still fails after %ld allocations", budget);
        support_path_in(path, "cut.json");
        allocs_left = budget;
        err[0] = '\0';
        int rc = bench_write_json(path, &config, &limits, results, 2, 1.5, err, sizeof err);
        int failed_one = rest ? allocs_left == 0 : allocs_left == -1;
        allocs_left = -1;
        struct stat st;
        if (rc != 0) {
            cr_assert(strstr(err, "out of memory"), "allocation %ld failing: '%s'", budget, err);
            cr_assert(stat(path, &st) != 0 && errno == ENOENT,
                      "allocation %ld failing: the call failed but wrote %s", budget, path);
            failures++;
            continue;
        }
        char *got = text_without_date(path);
        cr_assert_str_eq(got, expected, "allocation %ld failing: the report was written "
                         "without what it could not allocate", budget);
        free(got);
        remove(path);
        if (!failed_one)
            break;  /* it needed fewer allocations than it was allowed */
    }
    cr_expect_gt(failures, 20, "only %d allocations were made to fail", failures);
    free(expected);
}

Test(bench_report, json_is_whole_or_not_written_when_memory_runs_out,
     .init = support_dir_init, .fini = support_dir_fini)
{
    sweep(1);
}

Test(bench_report, json_is_whole_or_not_written_when_one_allocation_fails,
     .init = support_dir_init, .fini = support_dir_fini)
{
    sweep(0);
}
