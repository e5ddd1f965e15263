/*
 * castor bench: central storage against mirrored, judged against the limits
 * of the machine it runs on.
 *
 *   bench.c   the grid of runs, one run through the public API
 *   flags.c   the flags, their defaults and the help text
 *   limits.c  the limits, measured in the same process: copy bandwidth over
 *             the device interface, the GEMM rate at the model's shapes
 *   bound.c   each run's lower-bound step time from them, and the bytes a
 *             step should move
 *   host_limits.c  the host's: memory bandwidth (a triad on the host pool)
 *             and castor's host reduction and optimizer at each model size
 *   report.c  the table on stdout, bench.csv and bench.json
 *   plot.c    bench.png (gnuplot)
 *
 * The bench is part of the castor program (src/cli/ dispatches
 * "castor bench" to castor_cli_bench), so it may print; it drives training
 * through include/castor.h only, and uses the internal headers
 * (device/device.h and host/) only to measure the limits.
 */
#ifndef CASTOR_BENCH_H
#define CASTOR_BENCH_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "castor.h"

#define BENCH_MAX_LIST 32

typedef struct bench_config {
    const char *devices;                  /* as castor_strategy_create takes it */
    castor_strategy_kind strategies[2];
    int n_strategies;
    int widths[BENCH_MAX_LIST], n_widths;
    int depths[BENCH_MAX_LIST], n_depths; /* hidden layers of `width` units */
    int batches[BENCH_MAX_LIST], n_batches;
    int steps;                            /* timed steps per run */
    int warmup;                           /* untimed steps before them */
    int input;                            /* features per sample */
    int classes;                          /* units of the (linear) output layer */
    castor_optimizer_kind optimizer;
    uint64_t seed;
    size_t device_memory;                 /* castor_strategy_options.device_memory_budget */
    int host_threads;                     /* castor_strategy_options.host_threads */
    int tf32;
    int quick;
    const char *out_dir;
    int replicas;                         /* what the device list gives */
    /* CPU time other processes used on the others_cpus CPUs of this
     * process's affinity mask, as a fraction of their time (0 to 1): in a
     * short look before the bench, and during it (NaN: unknown). */
    double others_before, others_during;
    int others_cpus;
} bench_config;

/* The host's part of a step for a model of `params` variables: summing the
 * replicas' gradients (castor__reduce_sum of `replicas` sources) and one
 * optimizer update (castor__optim_apply), timed alone. NaN if unmeasured. */
typedef struct bench_host_cost {
    size_t params;
    /* The sum alone (mirrored through the host sums so, then updates on the
     * devices); one host update alone (no strategy runs it so: a reference
     * beside central_s, shown, not in a bound). */
    double reduce_s, opt_s;
    double central_s;        /* central's one pass that sums and updates (host/update.h) */
    /* Mirrored on emulated CPU devices: every CPU replica's update at once,
     * each single-threaded on its replica thread, as they run there. */
    double replica_opt_s;
} bench_host_cost;

/* One GEMM as the replica loop (src/replica.c) issues it: C (m x n) = op(A) op(B)
 * with op(A) m x k. */
typedef struct bench_gemm {
    int ta, tb, m, n, k;
    double seconds;  /* per call, every replica running it at once (median) */
    double gflops;   /* 2mnk x replicas / seconds */
} bench_gemm;

/* The limits, measured in the same run. Rates in bytes or FLOP per second;
 * NaN where a limit could not be measured (note says why). */
typedef struct bench_limits {
    char backend[8];          /* "cpu", "cuda" or "mixed" */
    int replicas;             /* devices opened for the measurements: one per replica */
    int cpu_devices;          /* how many of them are emulated CPU devices */
    int gpus;                 /* distinct physical GPUs among them */
    size_t copy_bytes;        /* bytes each trial copies per device, the largest copy */
    size_t copy_min_bytes;    /* the smallest copy timed (rates: the fastest size) */
    size_t copy_span;         /* emulated CPU devices: each copy buffer's bytes, every copy
                                 to its next region (not cache-hot); 0 without them */
    size_t llc_bytes;         /* the last-level cache it was sized from; 0 unknown */
    int copy_pinned;          /* the host buffers were pinned by CUDA */
    double h2d_one, d2h_one;  /* one replica alone (replica 0's device) */
    double h2d_all, d2h_all;  /* all replicas copying at once, summed over them */
    double both_all;          /* all replicas, h2d and d2h at once, both directions summed */
    int host_threads;         /* threads of the triad (as the strategy's host pool) */
    size_t triad_elems;       /* floats per array */
    double triad_bw;          /* a[i] = b[i] + s*c[i]: 12 bytes per element / seconds */
    double host_opt_rate;     /* the host optimizer kernel alone, parameters per second */
    /* castor's own host kernels at each model size of the grid, on the host
     * threads (fastest of a few trials): the host term of the bounds. */
    struct bench_host_cost *host_costs;
    int n_host_costs;
    int same_device;          /* every replica on one GPU, or on one emulated device
                                 (cpu:1xK): mirrored sums there */
    int distinct_gpus;        /* every replica on its own GPU (mirrored uses NCCL) */
    bench_gemm *gemms;
    int n_gemms, cap_gemms;
    double seconds;           /* spent measuring all of the above */
    char note[512];
} bench_limits;

typedef struct bench_result {
    castor_strategy_kind strategy;
    int width, depth, batch, replicas;
    size_t params;
    int ok;
    char error[512];

    int steps;                          /* timed step intervals */
    double step_median, step_min, step_max;   /* seconds */
    double samples_per_s;
    double h2d_per_step, d2h_per_step;  /* bytes, all replicas */
    double copy_seconds;                /* per step: phases in which those bytes move */
    double bus_bw;                      /* (h2d + d2h) / copy_seconds */
    double sec_replicas, sec_reduce, sec_update, sec_total;  /* per step (run stats) */
    double host_update_rate;            /* params / (sec_reduce + sec_update) */
    size_t device_peak;                 /* bytes, one replica */
    size_t host_pinned;                 /* bytes, run_stats.host_bytes */
    double rss_run;                     /* bytes, peak RSS during this run (VmHWM after a reset) */
    int rss_run_scoped;                 /* 0: the reset failed, rss_run is the process's peak */
    double rss_process;                 /* bytes, the process's peak RSS so far */
    double loss;                        /* running loss of the last step (a sanity check) */

    /* Lower bound from the limits. */
    double expected_h2d, expected_d2h;  /* bytes per step the replica loop should move
                                           (bench_expected_bytes): the transfer term's */
    int bytes_as_expected;              /* h2d/d2h_per_step within 1% of them */
    double flops;                       /* per step, all replicas (GEMMs only) */
    double host_bytes;                  /* per step, through host memory (reduction, optimizer) */
    /* lower_bound: the largest term, a bound even for an implementation that
     * overlaps them all; ratio = step_median / it. */
    double t_transfer, t_compute, t_host, lower_bound, ratio;
    const char *bound_by;               /* "transfer", "compute" or "host" */
    /* The sum of the terms, the bound for phases that run one after another
     * (as castor's do, but for a GPU's copies beside its GEMMs), and
     * step_median / it. */
    double serial_bound, serial_ratio;
} bench_result;

/* ---- flags.c ---- */
/* argv into c: 0 to run, 1 after printing the help, -1 after printing why a
 * flag is wrong. */
int bench_parse_args(int argc, char **argv, bench_config *c);

/* ---- bench.c ---- */
/* Progress on stderr: redrawn on a terminal, plain lines otherwise. */
void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void bench_progress_done(void);
/* Busy seconds of the CPUs in mask, from /proc/stat's per-CPU lines (read
 * from stat, the aggregate "cpu" line skipped): user, nice, system, irq,
 * softirq and steal, at ticks_per_s clock ticks a second. *cpus: how many
 * of the mask's CPUs had a line; NaN when none had. */
double bench_stat_busy(FILE *stat, const cpu_set_t *mask, long ticks_per_s, int *cpus);
/* The share of `cpus` CPUs' time over `wall` seconds that other processes
 * used: the CPUs' busy seconds between two reads, less this process's CPU
 * seconds, over wall x cpus; within [0, 1], NaN when unknown. */
double bench_others_share(double busy_a, double busy_b, double self_a, double self_b,
                          double wall, int cpus);

/* ---- limits.c ---- */
/* Append to L->note (the limits' remarks, printed and in bench.json). */
void bench_note(bench_limits *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The fastest of n trials (a limit: other work only slows a trial). */
double bench_fastest(const double *v, int n);
/* The GEMMs of one training step on one replica holding `rows` rows of the
 * model input -> width x depth -> classes, appended to out (capacity cap);
 * returns how many there are (which may exceed cap). */
int bench_step_gemms(int input, int width, int depth, int classes, int rows, bench_gemm *out,
                     int cap);
/* The measured GEMM of g's shape, or NULL. */
const bench_gemm *bench_find_gemm(const bench_limits *L, const bench_gemm *g);
/* Rows of a global batch the busiest replica holds. */
int bench_rows_per_replica(int batch, int replicas);
/* Measure every limit for the configuration (all GEMM shapes of its grid).
 * Returns 0, or -1 when the devices could not even be opened (message in
 * L->note); a single limit that fails is NaN and noted. */
int bench_limits_measure(const bench_config *c, bench_limits *L);
void bench_limits_free(bench_limits *L);
/* ---- bound.c ---- */
/* Fill r's lower-bound fields from the limits (and expected_h2d/d2h,
 * bytes_as_expected). */
void bench_lower_bound(const bench_config *c, const bench_limits *L, bench_result *r);
/* The bytes the replica loop should move per step for r's configuration,
 * from the code (src/central.c, src/mirrored.c, src/replica.c): the
 * transfer term's bytes, and what the run statistics are checked against.
 * (With a GPU each, whether mirrored fell back from NCCL to the host is
 * read from the run's own d2h bytes: bench_mirrored_reduces_on_host.) */
void bench_expected_bytes(const bench_config *c, const bench_limits *L, const bench_result *r,
                          double *h2d, double *d2h);
/* Whether mirrored all-reduces through host memory for run r, as
 * src/mirrored.c chooses: several replicas, and not all on one GPU (summed
 * there) nor each on its own GPU (NCCL); with distinct GPUs, also when the
 * run's own device-to-host bytes show that NCCL could not start and the
 * strategy fell back to the host. */
int bench_mirrored_reduces_on_host(const bench_limits *L, const bench_result *r);
/* Whether mirrored has a reduce-and-update phase after the replicas' phase
 * (not with one replica, where the update runs inside the replicas' phase;
 * NCCL's all-reduce and the update are the second phase, src/mirrored.c). */
int bench_mirrored_has_update_phase(const bench_limits *L, int replicas);
/* Bytes one optimizer step moves through memory per parameter (reads and
 * writes of the variables, gradients and optimizer slots). */
int bench_optimizer_bytes(castor_optimizer_kind kind);

/* ---- host_limits.c ---- */
/* The triad and the optimizer kernel alone (L->triad_bw, L->host_opt_rate). */
struct castor__pool;
void bench_measure_host(const bench_config *c, bench_limits *L, struct castor__pool *hpool);
/* castor's host kernels at every model size of c's grid (L->host_costs);
 * rpool has a thread per replica. -1 when out of memory. */
int bench_measure_host_costs(const bench_config *c, bench_limits *L, struct castor__pool *hpool,
                             struct castor__pool *rpool);
const bench_host_cost *bench_find_host_cost(const bench_limits *L, size_t params);
/* Half of the host memory available now: the most one measurement takes. */
size_t bench_host_memory_allowance(void);

/* ---- report.c ---- */
void bench_print_limits(FILE *out, const bench_config *c, const bench_limits *L);
void bench_print_table(FILE *out, const bench_config *c, const bench_result *r, int n);
/* Each file replaced whole or not at all; 0, or -1 with "PATH: why" in err. */
int bench_write_csv(const char *path, const bench_config *c, const bench_result *r, int n,
                    char *err, size_t errlen);
int bench_write_json(const char *path, const bench_config *c, const bench_limits *L,
                     const bench_result *r, int n, double wall_seconds, char *err,
                     size_t errlen);

/* ---- plot.c ---- */
/* Returns 0 on success, 1 when gnuplot is missing or failed (warned on
 * stderr; not fatal). */
int bench_plot(const char *dir, const bench_config *c, const bench_result *r, int n);

#endif
