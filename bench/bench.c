/*
 * castor bench: both strategies over a grid of models, each run timed step
 * by step through the public API, beside the limits measured in the same
 * process (limits.c), reported as a table, CSV, JSON and a plot (report.c).
 *
 * One run: a strategy and a model (input -> depth x width relu -> classes,
 * softmax cross-entropy) on synthetic data from the seed; `warmup` steps
 * untimed; the run statistics reset; then one fit of steps + 1 steps whose
 * progress callback stamps the clock after every step, so the `steps`
 * intervals between the stamps are whole steps as a user sees them (the
 * trainer's batch gathering included, fit's own setup not). The median
 * interval is the step time.
 */
#include "bench/bench.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/cores.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/common.h"

/* ---- progress on stderr ------------------------------------------------- */

static int g_tty = -1;
static int g_drawn;

static int stderr_tty(void)
{
    if (g_tty < 0)
        g_tty = isatty(STDERR_FILENO);
    return g_tty;
}

static int columns(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

void bench_progress(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (stderr_tty()) {
        /* One line, never wrapped, so that '\r' goes back to its start. */
        int w = columns() - 1;
        if ((int)strlen(buf) > w)
            buf[w] = '\0';
        fprintf(stderr, "\r%s\033[K", buf);
        g_drawn = 1;
    } else {
        fprintf(stderr, "%s\n", buf);
    }
    fflush(stderr);
}

void bench_progress_done(void)
{
    if (stderr_tty() && g_drawn) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
    g_drawn = 0;
}

/* The library's warnings, each text once. */
static void log_fn(void *user, castor_log_level level, const char *message)
{
    (void)user;
    static char seen[8][160];
    static int n_seen;
    for (int i = 0; i < n_seen; i++)
        if (strncmp(seen[i], message, sizeof seen[i] - 1) == 0)
            return;
    if (n_seen < 8)
        snprintf(seen[n_seen++], sizeof seen[0], "%s", message);
    bench_progress_done();
    fprintf(stderr, "castor: %s: %s\n", level == CASTOR_LOG_ERROR ? "error" : "warning", message);
}

/* ---- memory figures ---------------------------------------------------- */

/* Reset the kernel's peak-RSS mark to the current RSS (Linux >= 4.0). */
static int reset_rss_peak(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    if (fd < 0)
        return 0;
    int ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok;
}

static double rss_peak_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return NAN;
    char line[256];
    double kib = NAN;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kib = strtod(line + 6, NULL);
            break;
        }
    fclose(f);
    return kib * 1024.0;
}


/* ---- other processes ---------------------------------------------------- */

double bench_stat_busy(FILE *stat, const cpu_set_t *mask, long ticks_per_s, int *cpus)
{
    *cpus = 0;
    double ticks = 0;
    char *line = NULL;
    size_t cap = 0;
    /* The per-CPU lines follow the aggregate "cpu " line, before "intr". */
    while (getline(&line, &cap, stat) > 0 && strncmp(line, "cpu", 3) == 0) {
        /* Only "cpuN": "%d" would skip the aggregate line's spaces and take
         * its user ticks for a CPU number, counting every CPU's time again
         * as one CPU of the mask's wherever they were small. */
        if (!isdigit((unsigned char)line[3]))
            continue;
        char *after = NULL;
        errno = 0;
        unsigned long cpu = strtoul(line + 3, &after, 10);
        if (errno || cpu >= CPU_SETSIZE || !CPU_ISSET((int)cpu, mask))
            continue;
        unsigned long long v[8] = {0};
        /* Fields an older kernel lacks (iowait, irq, softirq, steal) stay 0. */
        if (sscanf(after, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7]) < 4)
            continue;
        /* user nice system [idle iowait] irq softirq steal: steal is time a
         * hypervisor gave away, as lost to this process as another's. */
        ticks += (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
        ++*cpus;
    }
    free(line);
    return *cpus ? ticks / (double)(ticks_per_s > 0 ? ticks_per_s : 100) : NAN;
}

double bench_others_share(double busy_a, double busy_b, double self_a, double self_b,
                          double wall, int cpus)
{
    double others = (busy_b - busy_a) - (self_b - self_a);
    double f = others / (wall * cpus);
    /* Clock ticks and getrusage round differently: a little either side of
     * the true share, never a share below none or above all. */
    return isfinite(f) && cpus > 0 ? (f < 0 ? 0 : f > 1 ? 1 : f) : NAN;
}

/* CPU seconds the CPUs this process may run on and this process have
 * used, and when. */
typedef struct cpu_clock {
    double busy;  /* the affinity mask's CPUs, from /proc/stat; NaN if unreadable */
    int cpus;     /* how many */
    double self;  /* this process, user + system */
    double wall;
} cpu_clock;

static void cpu_clock_read(cpu_clock *c)
{
    c->wall = cli_now();
    c->busy = NAN;
    c->cpus = 0;
    cpu_set_t mask;
    FILE *f = sched_getaffinity(0, sizeof mask, &mask) == 0 ? fopen("/proc/stat", "re") : NULL;
    if (f) {
        c->busy = bench_stat_busy(f, &mask, sysconf(_SC_CLK_TCK), &c->cpus);
        fclose(f);
    }
    struct rusage ru;
    c->self = NAN;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        c->self = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                  (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* The share of the mask's CPUs that other processes used between a and b.
 * Over those CPUs only: the machine's aggregate line counted a busy loop
 * on a core this process may not use (taskset), and said 102%. */
static double others_fraction(const cpu_clock *a, const cpu_clock *b, int *cpus)
{
    *cpus = b->cpus;
    if (a->cpus != b->cpus)  /* the mask changed in between */
        return NAN;
    return bench_others_share(a->busy, b->busy, a->self, b->self, b->wall - a->wall, b->cpus);
}

/* ---- one run ------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Synthetic samples: features uniform in [0, 1), labels uniform. A few
 * batches' worth (one for very large batches), cycled through by epochs. */
static int make_data(const bench_config *c, int batch, castor_dataset **out)
{
    size_t per_batch = (size_t)batch * (size_t)c->input;
    size_t nb = per_batch * 4 <= ((size_t)64 << 20) ? 4 : 1;
    size_t n = nb * (size_t)batch;
    float *x = malloc(n * (size_t)c->input * sizeof *x);
    int32_t *y = malloc(n * sizeof *y);
    int rc = CASTOR_NOMEM;
    if (x && y) {
        uint64_t s = c->seed ^ 0x62656e6368ull;
        for (size_t i = 0; i < n * (size_t)c->input; i++)
            x[i] = (float)(splitmix64(&s) >> 40) * (1.0f / 16777216.0f);
        for (size_t i = 0; i < n; i++)
            y[i] = (int32_t)(splitmix64(&s) % (uint64_t)c->classes);
        rc = castor_dataset_from_memory(out, x, n, c->input, y, NULL, 0);
    }
    free(x);
    free(y);
    return rc;
}

typedef struct stamps {
    double *t;
    int n, cap;
    double loss;
    const char *label;
    int timed;
    double last_draw;
    castor_model *model;  /* its run statistics restart after the first timed step */
} stamps;

static int on_step(void *user, const castor_progress *p)
{
    stamps *s = user;
    double now = cli_now();
    if (s->timed && s->n < s->cap)
        s->t[s->n++] = now;
    /* The first step of the timed fit is not timed (it starts the clock):
     * its phases and bytes, which may hold first-call costs, are not
     * counted either, so that the phase figures cover the timed steps. */
    if (s->timed && s->n == 1)
        castor_model_reset_run_stats(s->model);
    s->loss = p->loss;
    /* Redraw on a terminal only, and rarely: the callback is inside the
     * timed intervals. */
    if (stderr_tty() && now - s->last_draw > 0.25) {
        s->last_draw = now;
        if (s->timed)
            bench_progress("%s: step %d/%d", s->label, s->n > 0 ? s->n - 1 : 0, s->cap - 1);
        else
            bench_progress("%s: warm-up", s->label);
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail_run(bench_result *r, const char *what, int rc, const char *msg)
{
    snprintf(r->error, sizeof r->error, "%s: %s: %s", what, castor_errstr(rc), msg);
    return -1;
}

/* *process_peak: the process's peak RSS so far. The reset before each run
 * also clears what getrusage's ru_maxrss reports, so the bench keeps it. */
static int run_one(const bench_config *c, const bench_limits *L, castor_strategy_kind kind,
                   int width, int depth, int batch, const char *label, bench_result *r,
                   double *process_peak)
{
    memset(r, 0, sizeof *r);
    *process_peak = fmax(*process_peak, rss_peak_now());
    r->strategy = kind;
    r->width = width;
    r->depth = depth;
    r->batch = batch;
    r->replicas = c->replicas;
    r->bound_by = "-";
    r->rss_run_scoped = reset_rss_peak();

    castor_strategy *s = NULL;
    castor_model *m = NULL;
    castor_dataset *ds = NULL;
    stamps st = {0};
    int rc, ret = -1;
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = c->device_memory;
    so.host_threads = c->host_threads;
    so.tf32 = c->tf32;
    so.log_fn = log_fn;
    if ((rc = castor_strategy_create(&s, kind, c->devices, &so))) {
        fail_run(r, "strategy", rc, castor_strategy_errmsg(s));
        goto out;
    }
    r->replicas = castor_strategy_replicas(s);
    if ((rc = castor_model_create(&m, c->input))) {
        fail_run(r, "model", rc, castor_model_errmsg(m));
        goto out;
    }
    for (int l = 0; l <= depth && !rc; l++)
        rc = castor_model_add_dense(m, l < depth ? width : c->classes,
                                    l < depth ? CASTOR_ACT_RELU : CASTOR_ACT_LINEAR);
    /* Known once the layers are: a run that fails to compile (a device too
     * small for the model) reports the size it was refused at, not 0. */
    if (!rc)
        r->params = castor_model_num_params(m);
    castor_optimizer opt = castor_optimizer_defaults(c->optimizer);
    if (rc || (rc = castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, c->seed))) {
        fail_run(r, "compile", rc, castor_model_errmsg(m));
        goto out;
    }
    if ((rc = make_data(c, batch, &ds))) {
        fail_run(r, "data", rc, castor_dataset_errmsg(ds));
        goto out;
    }

    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 1000000000;
    fo.batch_size = batch;
    fo.progress = on_step;
    fo.progress_user = &st;
    st.label = label;
    st.last_draw = -1.0;
    st.model = m;
    if (c->warmup > 0) {
        if (stderr_tty())
            bench_progress("%s: warm-up", label);
        fo.max_steps = c->warmup;
        if ((rc = castor_model_fit(m, ds, &fo, NULL))) {
            fail_run(r, "warm-up", rc, castor_model_errmsg(m));
            goto out;
        }
    }
    st.cap = c->steps + 1;
    st.t = malloc((size_t)st.cap * sizeof *st.t);
    if (!st.t) {
        fail_run(r, "bench", CASTOR_NOMEM, "out of memory");
        goto out;
    }
    st.timed = 1;
    fo.max_steps = c->steps + 1;
    if ((rc = castor_model_fit(m, ds, &fo, NULL))) {
        fail_run(r, "fit", rc, castor_model_errmsg(m));
        goto out;
    }
    if (st.n != st.cap) {
        fail_run(r, "fit", CASTOR_ERROR, "the progress callback was not called after every step");
        goto out;
    }

    castor_run_stats rs;
    if ((rc = castor_model_run_stats(m, &rs))) {
        fail_run(r, "run stats", rc, castor_model_errmsg(m));
        goto out;
    }
    r->steps = c->steps;
    double *d = st.t; /* intervals, in place */
    for (int i = 0; i < c->steps; i++)
        d[i] = st.t[i + 1] - st.t[i];
    qsort(d, (size_t)c->steps, sizeof *d, cmp_double);
    int k = c->steps;
    r->step_median = k % 2 ? d[k / 2] : 0.5 * (d[k / 2 - 1] + d[k / 2]);
    r->step_min = d[0];
    r->step_max = d[k - 1];
    r->samples_per_s = batch / r->step_median;
    double steps = rs.steps > 0 ? (double)rs.steps : NAN;
    r->h2d_per_step = (double)rs.bytes_h2d / steps;
    r->d2h_per_step = (double)rs.bytes_d2h / steps;
    r->sec_replicas = rs.seconds_replicas / steps;
    r->sec_reduce = rs.seconds_reduce / steps;
    r->sec_update = rs.seconds_update / steps;
    r->sec_total = rs.seconds_total / steps;
    /* Mirrored through the host uploads the reduced gradient in its update
     * phase; with NCCL or on a shared GPU that phase moves nothing over the
     * bus. */
    r->copy_seconds = r->sec_replicas + (kind == CASTOR_STRATEGY_MIRRORED &&
                                                 bench_mirrored_reduces_on_host(L, r)
                                             ? r->sec_update
                                             : 0);
    r->bus_bw = (r->h2d_per_step + r->d2h_per_step) / r->copy_seconds;
    r->host_update_rate = (double)r->params / (r->sec_reduce + r->sec_update);
    r->device_peak = rs.device_peak_bytes;
    r->host_pinned = rs.host_bytes;
    r->loss = st.loss;
    r->ok = 1;
    ret = 0;
out:
    r->rss_run = rss_peak_now();
    r->rss_process = *process_peak = fmax(*process_peak, r->rss_run);
    free(st.t);
    castor_model_free(m);
    castor_dataset_free(ds);
    castor_strategy_free(s);
    return ret;
}

/* ---- the command --------------------------------------------------------- */

int castor_cli_bench(int argc, char **argv)
{
    bench_config c;
    int prc = bench_parse_args(argc, argv, &c);
    if (prc)
        return prc > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    double t_start = cli_now();
    /* As castor train does: the replicas share the cores rather than each
     * running a GEMM with a thread per core (unless the environment gives
     * OpenBLAS a count: cli_blas_threads), so the limits and the runs are
     * measured as trained. */
    cli_blas_threads(c.devices);
    /* The device list, checked once before anything is measured. */
    castor_strategy *probe = NULL;
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = c.device_memory;
    so.host_threads = c.host_threads;
    int rc = castor_strategy_create(&probe, CASTOR_STRATEGY_CENTRAL, c.devices, &so);
    if (rc) {
        cli_errorf("bench: --devices %s: %s", c.devices, castor_strategy_errmsg(probe));
        castor_strategy_free(probe);
        return rc == CASTOR_INVALID ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
    }
    c.replicas = castor_strategy_replicas(probe);
    castor_strategy_free(probe);
    for (int b = 0; b < c.n_batches; b++)
        if (c.batches[b] < c.replicas) {
            cli_errorf("bench: --batches: batch %d is smaller than the %d replicas", c.batches[b],
                       c.replicas);
            return CLI_EXIT_USAGE;
        }
    char err[4096 + 256];
    if (cli_mkdir_p(c.out_dir, NULL, 0, err, sizeof err) != 0) {
        cli_errorf("bench: the output directory: %s", err);
        return CLI_EXIT_RUNTIME;
    }
    /* Found out now, not after the whole grid has run. */
    if (access(c.out_dir, W_OK | X_OK) != 0) {
        cli_errorf("bench: cannot write in the output directory %s: %s", c.out_dir,
                   strerror(errno));
        return CLI_EXIT_RUNTIME;
    }

    /* The flags, devices and output checked first: a run refused is refused
     * at once, without this look. Another job on the cores moves every
     * number here: look for one. */
    cpu_clock look0, look1;
    cpu_clock_read(&look0);
    usleep(250000);
    cpu_clock_read(&look1);
    c.others_before = others_fraction(&look0, &look1, &c.others_cpus);
    if (c.others_before > 0.1)
        fprintf(stderr,
                "castor: warning: bench: other processes are using %.0f%% of the %d CPU%s this "
                "process may run on: the numbers will be noisy\n",
                100.0 * c.others_before, c.others_cpus, c.others_cpus == 1 ? "" : "s");
    cpu_clock during0;
    cpu_clock_read(&during0);

    int failures = 0;
    double process_peak = NAN;
    bench_limits L;
    if (bench_limits_measure(&c, &L)) {
        bench_progress_done();
        cli_errorf("bench: cannot measure the limits: %s", L.note);
        bench_limits_free(&L);
        return CLI_EXIT_RUNTIME;
    }
    if (L.note[0]) {
        bench_progress_done();
        fprintf(stderr, "castor: warning: limits: %s\n", L.note);
    }

    int total = c.n_widths * c.n_depths * c.n_batches * c.n_strategies;
    bench_result *res = calloc((size_t)total, sizeof *res);
    if (!res) {
        cli_errorf("bench: out of memory");
        bench_limits_free(&L);
        return CLI_EXIT_RUNTIME;
    }
    int i = 0;
    for (int w = 0; w < c.n_widths; w++)
        for (int d = 0; d < c.n_depths; d++)
            for (int b = 0; b < c.n_batches; b++)
                for (int k = 0; k < c.n_strategies; k++, i++) {
                    char label[160];
                    snprintf(label, sizeof label, "[%d/%d] %s width %d depth %d batch %d", i + 1,
                             total, castor_strategy_kind_name(c.strategies[k]), c.widths[w],
                             c.depths[d], c.batches[b]);
                    bench_progress("%s ...", label);
                    bench_result *r = &res[i];
                    if (run_one(&c, &L, c.strategies[k], c.widths[w], c.depths[d], c.batches[b],
                                label, r, &process_peak)) {
                        failures++;
                        bench_progress_done();
                        fprintf(stderr, "castor: %s: %s\n", label, r->error);
                        continue;
                    }
                    bench_lower_bound(&c, &L, r);
                    /* With one replica mirrored updates inside the
                     * replicas' phase: there is no update phase to rate. */
                    if (r->strategy == CASTOR_STRATEGY_MIRRORED &&
                        !bench_mirrored_has_update_phase(&L, r->replicas))
                        r->host_update_rate = NAN;
                    if (!r->bytes_as_expected) {
                        bench_progress_done();
                        fprintf(stderr,
                                "castor: warning: %s: the run stats count %.0f bytes h2d and "
                                "%.0f d2h per step; the replica loop should move %.0f and %.0f "
                                "(the bound's transfer term uses the latter)\n",
                                label, r->h2d_per_step, r->d2h_per_step, r->expected_h2d,
                                r->expected_d2h);
                    }
                }
    bench_progress_done();
    double wall = cli_now() - t_start;
    cpu_clock during1;
    cpu_clock_read(&during1);
    c.others_during = others_fraction(&during0, &during1, &c.others_cpus);
    if (c.others_during > 0.1)
        fprintf(stderr,
                "castor: warning: bench: other processes used %.0f%% of the %d CPU%s this "
                "process may run on while it ran: the numbers are noisy\n",
                100.0 * c.others_during, c.others_cpus, c.others_cpus == 1 ? "" : "s");

    bench_print_limits(stdout, &c, &L);
    bench_print_table(stdout, &c, res, total);

    char path[4200], why[sizeof path + 512];
    int out_failed = 0;
    /* The last run's plot goes first: it must not stay beside new numbers,
     * or beside a mix of old and new if one of the files fails. */
    snprintf(path, sizeof path, "%s/bench.png", c.out_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/bench.csv", c.out_dir);
    if (bench_write_csv(path, &c, res, total, why, sizeof why)) {
        cli_errorf("bench: cannot write %s", why);
        out_failed = 1;
    }
    snprintf(path, sizeof path, "%s/bench.json", c.out_dir);
    if (bench_write_json(path, &c, &L, res, total, wall, why, sizeof why)) {
        cli_errorf("bench: cannot write %s", why);
        out_failed = 1;
    }
    if (!out_failed) {
        int plotted = bench_plot(c.out_dir, &c, res, total) == 0;
        printf("\nwrote %s/bench.csv, bench.json%s  (%.1f s in all, %.1f s of it measuring "
               "limits)\n",
               c.out_dir, plotted ? ", bench.png" : " (no plot)", wall, L.seconds);
    }
    fflush(stdout);
    bench_limits_free(&L);
    free(res);
    if (failures)
        cli_errorf("bench: %d of %d runs failed", failures, total);
    return failures || out_failed ? CLI_EXIT_RUNTIME : CLI_EXIT_OK;
}
