/*
 * castor bench's flags: the grid, the devices and the output directory, with
 * their defaults (smaller ones under --quick) and the help text.
 */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/common.h"

enum {
    F_DEVICES,
    F_STRATEGIES,
    F_WIDTHS,
    F_DEPTHS,
    F_BATCHES,
    F_STEPS,
    F_WARMUP,
    F_INPUT,
    F_CLASSES,
    F_OPTIMIZER,
    F_SEED,
    F_DEVICE_MEMORY,
    F_HOST_THREADS,
    F_TF32,
    F_OUT,
    F_QUICK,
    F_COUNT
};

static const cli_flag bench_flags[F_COUNT + 1] = {
    [F_DEVICES] = {"devices", "LIST", "cpu:2",
                   "the replicas, as for castor train: cpu:N (N emulated CPU devices),\n"
                   "cpu:1x2 (two replicas sharing one), cuda:0 (one GPU), cuda:0x2\n"
                   "(two replicas sharing GPU 0), cuda:0,cuda:1, cuda (every GPU);\n"
                   "at most 64 replicas in all"},
    [F_STRATEGIES] = {"strategies", "LIST", "central,mirrored", "the strategies to compare"},
    [F_WIDTHS] = {"widths", "LIST", "256,1024,2048 (--quick: 64,256)",
                  "units of each hidden layer, comma separated, 1 to 65536"},
    [F_DEPTHS] = {"depths", "LIST", "2 (--quick: 1)",
                  "hidden layers (relu) before the linear output layer, 1 to 64"},
    [F_BATCHES] = {"batches", "LIST", "256 (--quick: 64)",
                   "global batch sizes, split over the replicas: at least the\n"
                   "number of replicas, at most 16777216"},
    [F_STEPS] = {"steps", "N", "10 (--quick: 3)",
                 "timed steps per run, 1 to 100000; the median is reported"},
    [F_WARMUP] = {"warmup", "N", "3 (--quick: 1)",
                 "untimed steps before them, 0 to 100000; one more, untimed\n"
                 "too, starts the clock, so the first step is never timed"},
    [F_INPUT] = {"input", "N", "784", "features per (synthetic) sample, 1 to 1048576"},
    [F_CLASSES] = {"classes", "N", "10", "classes, the units of the output layer, 2 to 65536"},
    [F_OPTIMIZER] = {"optimizer", "sgd|adam|adamw", "adam", "the optimizer"},
    [F_SEED] = {"seed", "N", "1", "seed of the synthetic data and the initial weights"},
    [F_DEVICE_MEMORY] = CLI_ROW_DEVICE_MEMORY,
    [F_HOST_THREADS] = {"host-threads", "N", "0: one per core",
                        "host threads for the reduction, the optimizer and the triad,\n"
                        "0 to 1024"},
    [F_TF32] = {"tf32", NULL, NULL, "allow TF32 tensor-core math on GPUs"},
    [F_OUT] = {"out", "DIR", "$BENCH_OUT, or else bench/out",
               "where bench.csv, bench.json and bench.png are written"},
    [F_QUICK] = {"quick", NULL, NULL,
                 "a small grid for a smoke test (the defaults marked --quick above,\n"
                 "and shorter limit measurements); flags given still win"},
    [F_COUNT] = {NULL, NULL, NULL, NULL},
};

static void bench_usage(FILE *out)
{
    fprintf(out,
            "usage: castor bench [flags]\n"
            "\n"
            "Train the same models with the central and the mirrored strategy on\n"
            "synthetic data and time them step by step (median of the timed steps,\n"
            "warm-up excluded). In the same run, measure the limits they are judged\n"
            "by: host<->device copy bandwidth (on emulated CPU devices through\n"
            "buffers larger than the last-level cache, as a step's copies go),\n"
            "castor's host reduction and optimizer at each model's size and the\n"
            "devices' GEMM rate at each model's shapes (each the fastest of a few\n"
            "trials); from them each run's lower-bound step time, the largest of\n"
            "  transfer  the bytes a step should copy / copy bandwidth, all replicas\n"
            "            at once (not the run's own counts: a run that copies more\n"
            "            is flagged, bytes_as_expected in the files, not excused),\n"
            "  compute   the step's GEMMs at the measured rates,\n"
            "  host      castor's host kernels at the model's size: the sum of the\n"
            "            gradients where the host does it (central; mirrored with\n"
            "            several replicas, unless they share one device or have a\n"
            "            GPU each) and each optimizer update in host memory\n"
            "            (central's; mirrored's on emulated CPU devices),\n"
            "and the ratio of the measured step time to it (1 or more, but for\n"
            "noise). That largest term bounds any implementation, but only one\n"
            "that overlaps transfer, compute and host work completely could reach\n"
            "it; castor runs its phases one after another, so its ratios sit well\n"
            "above 1 even at their limits. Each run therefore also gets the sum of\n"
            "the three terms (the bound for phases that run in turn) and its ratio\n"
            "to that: step/sum near 1 means castor's phases are at their limits,\n"
            "sum/bound is the most that overlapping them could win. Host memory\n"
            "bandwidth (a triad on every host thread) is shown beside them, not\n"
            "used in the bound.\n"
            "\n"
            "Other work moves every number: the report says what share of the CPUs\n"
            "this process may run on (its affinity mask) other processes used.\n"
            "\n"
            "The table goes to stdout, progress to stderr; DIR receives bench.csv,\n"
            "bench.json (the limits and every run) and bench.png (step time and peak\n"
            "device memory against parameters, by gnuplot).\n"
            "\n"
            "flags:\n");
    cli_print_flags(out, bench_flags);
    fprintf(out,
            "  -h, --help\n"
            "      show this help\n"
            "\n"
            "examples:\n"
            "  castor bench\n"
            "  castor bench --devices cuda:0x2 --widths 1024,4096,8192 --batches 256,1024\n"
            "  make bench BENCH_ARGS='--quick' BENCH_OUT=/tmp/b\n"
            "\n"
            "Exit status: 0 every run succeeded and the files were written (a limit\n"
            "that cannot be measured is a warning: its runs get no bound); 1 a run\n"
            "failed (the other runs and the files are still reported), the devices\n"
            "could not be set up, or the files could not be written; 2 a flag is\n"
            "wrong.\n");
}

/* A comma-separated list with no empty entries ("a,,b", ",a", "a,"), which
 * are mistakes, not values. */
static int check_list(const char *flag, const char *s, size_t max)
{
    if (strlen(s) >= max) {
        cli_errorf("bench: --%s: list too long", flag);
        return -1;
    }
    if (*s == ',' || (*s && s[strlen(s) - 1] == ',') || strstr(s, ",,")) {
        cli_errorf("bench: --%s: empty entry in '%s'", flag, s);
        return -1;
    }
    return 0;
}

/* "a,b,c" into distinct ints in [lo, hi]. */
static int parse_int_list(const char *flag, const char *s, int lo, int hi, int *out, int *n)
{
    char buf[1024];
    if (check_list(flag, s, sizeof buf))
        return -1;
    snprintf(buf, sizeof buf, "%s", s);
    int k = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (k == BENCH_MAX_LIST) {
            cli_errorf("bench: --%s: at most %d values", flag, BENCH_MAX_LIST);
            return -1;
        }
        if (cli_parse_int(flag, tok, lo, hi, &out[k]))
            return -1;
        for (int i = 0; i < k; i++)
            if (out[i] == out[k]) {
                cli_errorf("bench: --%s: %d is given twice", flag, out[k]);
                return -1;
            }
        k++;
    }
    if (k == 0) {
        cli_errorf("bench: --%s: no values in '%s'", flag, s);
        return -1;
    }
    *n = k;
    return 0;
}

static int parse_strategies(const char *s, bench_config *c)
{
    char buf[256];
    if (check_list("strategies", s, sizeof buf))
        return -1;
    snprintf(buf, sizeof buf, "%s", s);
    c->n_strategies = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        castor_strategy_kind k;
        if (castor_strategy_kind_parse(tok, &k)) {
            cli_errorf("bench: --strategies: unknown strategy '%s' (central, mirrored)", tok);
            return -1;
        }
        for (int i = 0; i < c->n_strategies; i++)
            if (c->strategies[i] == k) {
                cli_errorf("bench: --strategies: %s is given twice", castor_strategy_kind_name(k));
                return -1;
            }
        if (c->n_strategies < (int)(sizeof c->strategies / sizeof c->strategies[0]))
            c->strategies[c->n_strategies++] = k;
    }
    if (c->n_strategies == 0) {
        cli_errorf("bench: --strategies: none given");
        return -1;
    }
    return 0;
}

int bench_parse_args(int argc, char **argv, bench_config *c)
{
    memset(c, 0, sizeof *c);
    const char *given[F_COUNT] = {0};
    int set[F_COUNT] = {0};
    cli_parser p;
    cli_parser_init(&p, "bench", argc, argv);
    for (;;) {
        const char *v = NULL;
        int f = cli_next(&p, bench_flags, &v);
        if (f == CLI_DONE)
            break;
        if (f == CLI_HELP) {
            bench_usage(stdout);
            return 1;
        }
        if (f == CLI_FAIL)
            return -1;
        given[f] = v;
        set[f] = 1;
    }
    c->quick = set[F_QUICK];
    c->tf32 = set[F_TF32];
    int q = c->quick;
    c->devices = given[F_DEVICES] ? given[F_DEVICES] : "cpu:2";
    if (parse_strategies(given[F_STRATEGIES] ? given[F_STRATEGIES] : "central,mirrored", c) ||
        parse_int_list("widths", given[F_WIDTHS] ? given[F_WIDTHS] : q ? "64,256" : "256,1024,2048",
                       1, 65536, c->widths, &c->n_widths) ||
        parse_int_list("depths", given[F_DEPTHS] ? given[F_DEPTHS] : q ? "1" : "2", 1, 64,
                       c->depths, &c->n_depths) ||
        parse_int_list("batches", given[F_BATCHES] ? given[F_BATCHES] : q ? "64" : "256", 1,
                       16777216, c->batches, &c->n_batches))
        return -1;
    c->steps = q ? 3 : 10;
    c->warmup = q ? 1 : 3;
    c->input = 784;
    c->classes = 10;
    c->seed = 1;
    c->optimizer = CASTOR_OPT_ADAM;
    if ((given[F_STEPS] && cli_parse_int("steps", given[F_STEPS], 1, 100000, &c->steps)) ||
        (given[F_WARMUP] && cli_parse_int("warmup", given[F_WARMUP], 0, 100000, &c->warmup)) ||
        (given[F_INPUT] && cli_parse_int("input", given[F_INPUT], 1, 1 << 20, &c->input)) ||
        (given[F_CLASSES] && cli_parse_int("classes", given[F_CLASSES], 2, 65536, &c->classes)) ||
        (given[F_SEED] && cli_parse_u64("seed", given[F_SEED], &c->seed)) ||
        (given[F_DEVICE_MEMORY] &&
         cli_parse_size("device-memory", given[F_DEVICE_MEMORY], &c->device_memory)) ||
        (given[F_HOST_THREADS] &&
         cli_parse_int("host-threads", given[F_HOST_THREADS], 0, 1024, &c->host_threads)))
        return -1;
    if (given[F_OPTIMIZER] && castor_optimizer_kind_parse(given[F_OPTIMIZER], &c->optimizer)) {
        cli_errorf("bench: --optimizer: unknown optimizer '%s' (sgd, adam, adamw)",
                   given[F_OPTIMIZER]);
        return -1;
    }
    const char *env = getenv("BENCH_OUT");
    c->out_dir = given[F_OUT] ? given[F_OUT] : env && *env ? env : "bench/out";
    return 0;
}
