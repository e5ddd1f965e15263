/*
 * castor train: load a data set, build and compile a model on a strategy,
 * fit it with a progress display, evaluate it on the test set and report.
 *
 * The work is split into phases over one train_run, each returning an exit
 * status (0 to go on):
 *
 *   parse_args -> make_strategy -> load_data -> make_model
 *              -> [resume]  -> fit (progress + [checkpoints]) -> [save]
 *              -> evaluate  -> report
 *
 * The bracketed phases belong to checkpointing, which is not written yet;
 * look for "CHECKPOINTS" for the places it plugs in.
 */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "args.h"
#include "cli.h"
#include "json.h"
#include "progress.h"

#define DEFAULT_FASHION_MNIST "/usr/share/datasets/fashion-mnist"

/* ---- flags ------------------------------------------------------------- */

enum {
    F_DATA,
    F_LAYERS,
    F_LOSS,
    F_OPTIMIZER,
    F_LR,
    F_MOMENTUM,
    F_NESTEROV,
    F_WEIGHT_DECAY,
    F_EPOCHS,
    F_BATCH,
    F_VALIDATION_SPLIT,
    F_SEED,
    F_STRATEGY,
    F_DEVICES,
    F_DEVICE_MEMORY,
    F_HOST_THREADS,
    F_TF32,
    /* CHECKPOINTS (later): F_SAVE, F_CHECKPOINT_DIR, F_CHECKPOINT_EVERY,
     * F_KEEP, F_RESUME go here, with their rows in train_flags below. */
    F_JSON,
    F_QUIET,
    F_VERBOSE,
    F_COUNT
};

static const cli_flag train_flags[F_COUNT + 1] = {
    [F_DATA] = {"data", "fashion-mnist|DIR", "fashion-mnist",
                "training and test data. 'fashion-mnist' is the directory\n"
                "$CASTOR_FASHION_MNIST, or else " DEFAULT_FASHION_MNIST ";\n"
                "DIR holds the four MNIST-style IDX files train-images-idx3-ubyte,\n"
                "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and\n"
                "t10k-labels-idx1-ubyte, each plain or gzip'd (.gz)"},
    [F_LAYERS] = {"layers", "SPEC", "128:relu,10",
                  "the dense layers, comma separated, each UNITS[:ACTIVATION] with\n"
                  "ACTIVATION relu, tanh, sigmoid or linear (the default); with\n"
                  "--loss xent the last layer is linear with a unit per class"},
    [F_LOSS] = {"loss", "xent|mse", "xent",
                "xent: softmax cross-entropy on the class labels;\n"
                "mse: mean squared error against one-hot class targets (no accuracy)"},
    [F_OPTIMIZER] = {"optimizer", "sgd|adam|adamw", "adam",
                     "the optimizer, with Keras's semantics and defaults"},
    [F_LR] = {"lr", "X", "0.01 for sgd, 0.001 for adam and adamw",
              "the learning rate, > 0 and <= 1000"},
    [F_MOMENTUM] = {"momentum", "X", "0", "SGD momentum, 0 <= X < 1 (sgd only)"},
    [F_NESTEROV] = {"nesterov", NULL, NULL, "Nesterov momentum (sgd only)"},
    [F_WEIGHT_DECAY] = {"weight-decay", "X", "0.004",
                        "decoupled weight decay, 0 <= X <= 1 (adamw only)"},
    [F_EPOCHS] = {"epochs", "N", "10", "passes over the training data, 1 to 1000000"},
    [F_BATCH] = {"batch", "N", "256",
                 "the global batch size, split over the replicas: at least the\n"
                 "number of replicas, at most 16777216"},
    [F_VALIDATION_SPLIT] = {"validation-split", "N", "0",
                            "hold the last N training samples out of training and report\n"
                            "val_loss and val_acc on them after every epoch"},
    [F_SEED] = {"seed", "N", "1",
                "seed of the initial weights and the shuffling, 0 to 2^64-1"},
    [F_STRATEGY] = {"strategy", "central|mirrored", "central",
                    "central: the master weights live in pinned host memory and the\n"
                    "CPU updates them; mirrored: a copy per device, gradients\n"
                    "all-reduced, each device updates its copy"},
    [F_DEVICES] = {"devices", "LIST", "cpu",
                   "the replicas, comma separated: cpu, cpu:N (N emulated CPU\n"
                   "devices), cuda (every GPU), cuda:0,cuda:1 (the GPUs listed),\n"
                   "cuda:0x4 (four replicas sharing GPU 0)"},
    [F_DEVICE_MEMORY] = {"device-memory", "BYTES",
                         "0: 1G per emulated CPU device, all of a GPU's memory",
                         "the device memory each replica may use, with an optional K, M,\n"
                         "G or T suffix (powers of 1024): 512M, 2G"},
    [F_HOST_THREADS] = {"host-threads", "N", "0: one per core",
                        "host threads for the gradient reduction and the optimizer,\n"
                        "0 to 1024"},
    [F_TF32] = {"tf32", NULL, NULL, "allow TF32 tensor-core math on GPUs (off: plain fp32)"},
    [F_JSON] = {"json", NULL, NULL,
                "print the results as one JSON object, the last line of stdout"},
    [F_QUIET] = {"quiet", NULL, NULL, "no progress display and no library warnings"},
    [F_VERBOSE] = {"verbose", NULL, NULL,
                   "describe the run on stderr, with the library's info messages"},
    [F_COUNT] = {NULL, NULL, NULL, NULL},
};

void castor_cli_train_usage(FILE *out)
{
    fprintf(out,
            "usage: castor train [flags]\n"
            "\n"
            "Train a dense network on an IDX data set, evaluate it on the test set and\n"
            "print a summary on stdout (progress goes to stderr).\n"
            "\n"
            "flags:\n");
    cli_print_flags(out, train_flags);
    fprintf(out,
            "  -h, --help\n"
            "      show this help\n"
            "\n"
            "example:\n"
            "  castor train --data fashion-mnist --layers 128:relu,10 --optimizer adam \\\n"
            "      --epochs 10 --batch 256 --strategy central --devices cpu:2 \\\n"
            "      --seed 1 --json\n"
            "\n"
            "With --json the last line of stdout is an object with test_accuracy,\n"
            "test_loss, train_loss, train_accuracy, val_loss, val_accuracy, epochs,\n"
            "steps, seconds (wall time of training alone), samples_per_second,\n"
            "strategy, devices, replicas, batch, params and device_peak_bytes.\n"
            "\n"
            "SIGINT or SIGTERM stops training after the current step; castor then\n"
            "exits with status 130 or 143. Exit status 1: the run failed; 2: a flag\n"
            "is wrong.\n");
}

typedef struct train_opts {
    const char *data;
    const char *layers;
    castor_loss loss;
    castor_optimizer_kind optimizer;
    double lr, momentum, weight_decay;
    int lr_set, momentum_set, weight_decay_set, nesterov;
    int epochs, batch, validation_split;
    uint64_t seed;
    castor_strategy_kind strategy;
    const char *devices;
    size_t device_memory;
    int host_threads, tf32;
    int json, quiet, verbose;
    /* CHECKPOINTS (later): const char *save, *checkpoint_dir, *resume;
     * int checkpoint_every (0 off, -1 every epoch), keep. */
} train_opts;

typedef struct train_run {
    train_opts o;
    const char *data_dir;
    castor_strategy *strategy;
    castor_dataset *train, *val, *test;
    castor_model *model;
    int replicas;
    cli_progress_mode progress_mode;
    cli_progress progress;
    int64_t step0;            /* the model's steps before fit */
    double fit_seconds;
    castor_metrics train_m, test_m;
    double val_loss, val_accuracy; /* at the last epoch end; NaN without */
    char layers_spec[512];
} train_run;

/* ---- signals: stop after the current step --------------------------------- */

static volatile sig_atomic_t g_stop_signal = 0;

static void on_stop_signal(int sig)
{
    if (g_stop_signal) {
        /* A second one: the user insists; die the default way now. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        raise(sig);
        return;
    }
    g_stop_signal = sig;
}

static void install_stop_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* The message, or the status's text where the handle has none. */
static const char *why(const char *msg, int rc)
{
    return msg && msg[0] ? msg : castor_errstr(rc);
}

/* Flags with a bad value give usage errors; other failures runtime errors. */
static int exit_for(int rc)
{
    return rc == CASTOR_INVALID ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
}

static void note(const train_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(const train_run *r, const char *fmt, ...)
{
    if (!r->o.verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("castor: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The library's log messages; may be called from replica threads, so it
 * reads only what does not change during the run. */
static void log_to_stderr(void *user, castor_log_level level, const char *message)
{
    const train_run *r = user;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    const char *name = (unsigned)level < 4 ? names[level] : "log";
    /* Errors come back through return codes and errmsg, which the caller
     * prints once; show them here only when asked for detail. */
    if (level == CASTOR_LOG_ERROR && !r->o.verbose)
        return;
    fprintf(stderr, "%scastor: %s: %s\n",
            r->progress_mode == CLI_PROGRESS_BAR ? "\r\033[K" : "", name,
            message ? message : "");
}

/* ---- phase 1: the command line ------------------------------------------------ */

/* Returns -1 to go on, else the exit status. */
static int parse_args(train_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->data = "fashion-mnist";
    o->layers = "128:relu,10";
    o->loss = CASTOR_LOSS_SOFTMAX_XENT;
    o->optimizer = CASTOR_OPT_ADAM;
    o->epochs = 10;
    o->batch = 256;
    o->seed = 1;
    o->strategy = CASTOR_STRATEGY_CENTRAL;
    o->devices = "cpu";

    cli_parser p;
    cli_parser_init(&p, "train", argc, argv);
    for (;;) {
        const char *v;
        int f = cli_next(&p, train_flags, &v);
        if (f == CLI_DONE)
            break;
        if (f == CLI_HELP) {
            castor_cli_train_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (f == CLI_FAIL)
            return CLI_EXIT_USAGE;
        const char *name = train_flags[f].name;
        int bad = 0;
        switch (f) {
        case F_DATA: o->data = v; break;
        case F_LAYERS: o->layers = v; break;
        case F_LOSS:
            if (strcmp(v, "xent") == 0)
                o->loss = CASTOR_LOSS_SOFTMAX_XENT;
            else if (strcmp(v, "mse") == 0)
                o->loss = CASTOR_LOSS_MSE;
            else {
                cli_errorf("--loss '%s': not a loss (xent or mse)", v);
                bad = 1;
            }
            break;
        case F_OPTIMIZER:
            if (castor_optimizer_kind_parse(v, &o->optimizer) != CASTOR_OK) {
                cli_errorf("--optimizer '%s': not an optimizer (sgd, adam or adamw)", v);
                bad = 1;
            }
            break;
        case F_LR:
            bad = cli_parse_double(name, v, 0.0, 1, 1000.0, 0, &o->lr);
            o->lr_set = 1;
            break;
        case F_MOMENTUM:
            bad = cli_parse_double(name, v, 0.0, 0, 1.0, 1, &o->momentum);
            o->momentum_set = 1;
            break;
        case F_NESTEROV: o->nesterov = 1; break;
        case F_WEIGHT_DECAY:
            bad = cli_parse_double(name, v, 0.0, 0, 1.0, 0, &o->weight_decay);
            o->weight_decay_set = 1;
            break;
        case F_EPOCHS: bad = cli_parse_int(name, v, 1, 1000000, &o->epochs); break;
        case F_BATCH: bad = cli_parse_int(name, v, 1, 1 << 24, &o->batch); break;
        case F_VALIDATION_SPLIT:
            bad = cli_parse_int(name, v, 0, 0x7fffffff, &o->validation_split);
            break;
        case F_SEED: bad = cli_parse_u64(name, v, &o->seed); break;
        case F_STRATEGY:
            if (castor_strategy_kind_parse(v, &o->strategy) != CASTOR_OK) {
                cli_errorf("--strategy '%s': not a strategy (central or mirrored)", v);
                bad = 1;
            }
            break;
        case F_DEVICES: o->devices = v; break;
        case F_DEVICE_MEMORY: bad = cli_parse_size(name, v, &o->device_memory); break;
        case F_HOST_THREADS: bad = cli_parse_int(name, v, 0, 1024, &o->host_threads); break;
        case F_TF32: o->tf32 = 1; break;
        case F_JSON: o->json = 1; break;
        case F_QUIET: o->quiet = 1; break;
        case F_VERBOSE: o->verbose = 1; break;
        default: break;
        }
        if (bad)
            return CLI_EXIT_USAGE;
    }

    /* Flags that mean nothing for the chosen optimizer are mistakes. */
    if (o->optimizer != CASTOR_OPT_SGD && (o->momentum_set || o->nesterov)) {
        cli_errorf("--%s applies to --optimizer sgd only, not %s",
                   o->momentum_set ? "momentum" : "nesterov",
                   castor_optimizer_kind_name(o->optimizer));
        return CLI_EXIT_USAGE;
    }
    if (o->optimizer != CASTOR_OPT_ADAMW && o->weight_decay_set) {
        cli_errorf("--weight-decay applies to --optimizer adamw only, not %s",
                   castor_optimizer_kind_name(o->optimizer));
        return CLI_EXIT_USAGE;
    }
    if (o->verbose && o->quiet) {
        cli_errorf("--verbose and --quiet contradict each other");
        return CLI_EXIT_USAGE;
    }
    return -1;
}

/* ---- phase 2: the strategy (first: it checks --devices cheaply) -------------- */

static int make_strategy(train_run *r)
{
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = r->o.device_memory;
    so.host_threads = r->o.host_threads;
    so.tf32 = r->o.tf32;
    so.log_level = r->o.verbose ? CASTOR_LOG_INFO
                   : r->o.quiet ? CASTOR_LOG_ERROR
                                : CASTOR_LOG_WARN;
    so.log_fn = log_to_stderr;
    so.log_user = r;
    int rc = castor_strategy_create(&r->strategy, r->o.strategy, r->o.devices, &so);
    if (rc != CASTOR_OK) {
        cli_errorf("--strategy %s --devices '%s': %s", castor_strategy_kind_name(r->o.strategy),
                   r->o.devices, why(castor_strategy_errmsg(r->strategy), rc));
        return exit_for(rc);
    }
    r->replicas = castor_strategy_replicas(r->strategy);
    if (r->o.batch < r->replicas) {
        cli_errorf("--batch %d is smaller than the %d replicas of --devices '%s' (each replica "
                   "needs at least one sample per step)",
                   r->o.batch, r->replicas, r->o.devices);
        return CLI_EXIT_USAGE;
    }
    note(r, "strategy %s on '%s': %d replica%s", castor_strategy_kind_name(r->o.strategy),
         r->o.devices, r->replicas, r->replicas == 1 ? "" : "s");
    return 0;
}

/* ---- phase 3: the data ------------------------------------------------------------ */

static int load_data(train_run *r)
{
    if (strcmp(r->o.data, "fashion-mnist") == 0) {
        const char *env = getenv("CASTOR_FASHION_MNIST");
        r->data_dir = env && env[0] ? env : DEFAULT_FASHION_MNIST;
    } else {
        r->data_dir = r->o.data;
    }
    int rc = castor_dataset_load_mnist_dir(&r->train, r->data_dir, "train");
    if (rc != CASTOR_OK) {
        cli_errorf("cannot load the training data from %s: %s", r->data_dir,
                   why(castor_dataset_errmsg(r->train), rc));
        return CLI_EXIT_RUNTIME;
    }
    rc = castor_dataset_load_mnist_dir(&r->test, r->data_dir, "test");
    if (rc != CASTOR_OK) {
        cli_errorf("cannot load the test data from %s: %s", r->data_dir,
                   why(castor_dataset_errmsg(r->test), rc));
        return CLI_EXIT_RUNTIME;
    }
    size_t n = castor_dataset_size(r->train);
    if (r->o.validation_split > 0) {
        if ((size_t)r->o.validation_split >= n) {
            cli_errorf("--validation-split %d leaves no training samples (the training set has "
                       "%zu)",
                       r->o.validation_split, n);
            return CLI_EXIT_USAGE;
        }
        rc = castor_dataset_split_tail(r->train, (size_t)r->o.validation_split, &r->val);
        if (rc != CASTOR_OK) {
            cli_errorf("--validation-split %d: %s", r->o.validation_split,
                       why(castor_dataset_errmsg(r->train), rc));
            return exit_for(rc);
        }
    }
    note(r, "data %s: %zu training, %zu validation, %zu test samples of %d features",
         r->data_dir, castor_dataset_size(r->train), r->val ? castor_dataset_size(r->val) : 0,
         castor_dataset_size(r->test), castor_dataset_features(r->train));
    return 0;
}

/* ---- phase 4: the model -------------------------------------------------------------- */

/* --loss mse on a labelled data set: regress on one-hot targets, a unit per
 * class. Replaces *ds by a copy that carries the targets. */
static int one_hot_targets(castor_dataset **ds, int units, const char *which)
{
    if (!*ds || !castor_dataset_labels(*ds))
        return 0;
    size_t n = castor_dataset_size(*ds);
    const int32_t *labels = castor_dataset_labels(*ds);
    for (size_t i = 0; i < n; i++) {
        if (labels[i] < 0 || labels[i] >= units) {
            cli_errorf("--loss mse: the %s set has class %d but the last layer of --layers has "
                       "%d units (one per class is needed for one-hot targets)",
                       which, (int)labels[i], units);
            return CLI_EXIT_USAGE;
        }
    }
    if (units <= 0 || n > SIZE_MAX / (size_t)units) {
        cli_errorf("--loss mse: the %s set is too large for one-hot targets", which);
        return CLI_EXIT_RUNTIME;
    }
    float *targets = calloc(n * (size_t)units, sizeof *targets);
    if (!targets && n > 0) {
        cli_errorf("--loss mse: out of memory for the %s set's one-hot targets", which);
        return CLI_EXIT_RUNTIME;
    }
    for (size_t i = 0; i < n; i++)
        targets[i * (size_t)units + (size_t)labels[i]] = 1.0f;
    castor_dataset *copy = NULL;
    int rc = castor_dataset_from_memory(&copy, castor_dataset_x(*ds), n,
                                        castor_dataset_features(*ds), NULL, targets, units);
    free(targets);
    if (rc != CASTOR_OK) {
        cli_errorf("--loss mse: cannot make the %s set's one-hot targets: %s", which,
                   why(castor_dataset_errmsg(copy), rc));
        castor_dataset_free(copy);
        return CLI_EXIT_RUNTIME;
    }
    castor_dataset_free(*ds);
    *ds = copy;
    return 0;
}

static int make_model(train_run *r)
{
    int rc = castor_model_create(&r->model, castor_dataset_features(r->train));
    if (rc != CASTOR_OK) {
        cli_errorf("cannot create the model: %s", why(castor_model_errmsg(r->model), rc));
        return CLI_EXIT_RUNTIME;
    }
    rc = castor_model_add_layers(r->model, r->o.layers);
    if (rc != CASTOR_OK) {
        cli_errorf("--layers '%s': %s", r->o.layers, why(castor_model_errmsg(r->model), rc));
        return exit_for(rc);
    }
    if (r->o.loss == CASTOR_LOSS_MSE) {
        int units = castor_model_output_units(r->model);
        if ((rc = one_hot_targets(&r->train, units, "training")) != 0 ||
            (rc = one_hot_targets(&r->val, units, "validation")) != 0 ||
            (rc = one_hot_targets(&r->test, units, "test")) != 0)
            return rc;
    }
    castor_optimizer opt = castor_optimizer_defaults(r->o.optimizer);
    if (r->o.lr_set)
        opt.learning_rate = (float)r->o.lr;
    if (r->o.momentum_set)
        opt.momentum = (float)r->o.momentum;
    if (r->o.nesterov)
        opt.nesterov = 1;
    if (r->o.weight_decay_set)
        opt.weight_decay = (float)r->o.weight_decay;
    rc = castor_model_compile(r->model, r->strategy, r->o.loss, &opt, r->o.seed);
    if (rc != CASTOR_OK) {
        cli_errorf("cannot compile the model (--layers '%s', --loss %s): %s", r->o.layers,
                   r->o.loss == CASTOR_LOSS_MSE ? "mse" : "xent",
                   why(castor_model_errmsg(r->model), rc));
        return exit_for(rc);
    }
    if (castor_model_layers_spec(r->model, r->layers_spec, sizeof r->layers_spec) != CASTOR_OK)
        snprintf(r->layers_spec, sizeof r->layers_spec, "%s", r->o.layers);
    note(r, "model %d -> %s: %zu parameters; %s, learning rate %g, seed %llu",
         castor_model_input_features(r->model), r->layers_spec,
         castor_model_num_params(r->model), castor_optimizer_kind_name(r->o.optimizer),
         (double)opt.learning_rate, (unsigned long long)r->o.seed);

    /* ---- CHECKPOINTS (later): --resume DIR|FILE ----
     * Restore the variables, the optimizer state and the step count here,
     * after compile and before fit; a file that does not fit the model is
     * CASTOR_MISMATCH, a usage error. */
    return 0;
}

/* ---- phase 5: training --------------------------------------------------------------- */

static int on_progress(void *user, const castor_progress *p)
{
    train_run *r = user;
    cli_progress_update(&r->progress, p);
    if (p->epoch_end) {
        r->val_loss = p->val_loss;
        r->val_accuracy = p->val_accuracy;
    }
    /* ---- CHECKPOINTS (later): --checkpoint-every N|epoch ----
     * When p->global_step is a multiple of N (or at p->epoch_end), write a
     * checkpoint into --checkpoint-dir and keep the newest --keep K. If the
     * write fails, remember the error here and return non-zero: fit stops
     * with CASTOR_INTERRUPTED and the caller reports the write error. */
    return g_stop_signal != 0;
}

static int report_interrupt(const train_run *r, const char *when)
{
    int sig = g_stop_signal;
    if (r->model)
        fprintf(stderr, "castor: interrupted %s step %lld\n", when,
                (long long)castor_model_step(r->model));
    else
        fprintf(stderr, "castor: interrupted before training\n");
    return 128 + sig;
}

static int fit(train_run *r)
{
    if (g_stop_signal)
        return report_interrupt(r, "before");
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = r->o.epochs;
    fo.batch_size = r->o.batch;
    fo.shuffle = 1;
    fo.validation = r->val;
    fo.progress = on_progress;
    fo.progress_user = r;

    r->step0 = castor_model_step(r->model);
    cli_progress_init(&r->progress, r->progress_mode, r->o.batch,
                      castor_dataset_size(r->train), r->step0);
    double t0 = cli_now();
    int rc = castor_model_fit(r->model, r->train, &fo, &r->train_m);
    r->fit_seconds = cli_now() - t0;
    cli_progress_finish(&r->progress);

    if (rc == CASTOR_INTERRUPTED && g_stop_signal)
        return report_interrupt(r, "after");
    if (rc != CASTOR_OK) {
        cli_errorf("training failed: %s", why(castor_model_errmsg(r->model), rc));
        return exit_for(rc);
    }
    if (g_stop_signal) /* arrived after the last step: stop before evaluating */
        return report_interrupt(r, "after");

    /* ---- CHECKPOINTS (later): --save FILE ----
     * Write the trained model here, before the evaluation. */
    return 0;
}

/* ---- phase 6: evaluation and the report ---------------------------------------------- */

static int evaluate(train_run *r)
{
    int rc = castor_model_evaluate(r->model, r->test, r->o.batch, &r->test_m);
    if (rc != CASTOR_OK) {
        cli_errorf("evaluation on the test set failed: %s",
                   why(castor_model_errmsg(r->model), rc));
        return CLI_EXIT_RUNTIME;
    }
    if (g_stop_signal)
        return report_interrupt(r, "after");
    return 0;
}

static double samples_per_epoch_total(const train_run *r)
{
    /* Counted step by step by the progress callback; the epochs times the
     * training set's size if the callback saw nothing. */
    if (r->progress.samples > 0)
        return r->progress.samples;
    return (double)r->o.epochs * (double)castor_dataset_size(r->train);
}

/* A seed above 2^53 would lose digits as a JSON number: write it as a string. */
static int json_seed(cJSON *o, uint64_t seed)
{
    if (seed <= (UINT64_C(1) << 53))
        return cli_json_num(o, "seed", (double)seed);
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)seed);
    return cli_json_str(o, "seed", buf);
}

static int report_json(const train_run *r)
{
    double samples = samples_per_epoch_total(r);
    int64_t steps = castor_model_step(r->model) - r->step0;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        goto oom;
    if (cli_json_str(o, "version", castor_version()) ||
        cli_json_num(o, "test_accuracy", r->test_m.accuracy) ||
        cli_json_num(o, "test_loss", r->test_m.loss) ||
        cli_json_num(o, "train_accuracy", r->train_m.accuracy) ||
        cli_json_num(o, "train_loss", r->train_m.loss) ||
        cli_json_num(o, "val_accuracy", r->val_accuracy) ||
        cli_json_num(o, "val_loss", r->val_loss) ||
        cli_json_int(o, "epochs", r->o.epochs) || cli_json_int(o, "steps", steps) ||
        cli_json_num(o, "seconds", r->fit_seconds) ||
        cli_json_num(o, "samples_per_second",
                     r->fit_seconds > 0 ? samples / r->fit_seconds : NAN) ||
        cli_json_str(o, "strategy", castor_strategy_kind_name(r->o.strategy)) ||
        cli_json_str(o, "devices", r->o.devices) || cli_json_int(o, "replicas", r->replicas) ||
        cli_json_int(o, "batch", r->o.batch) ||
        cli_json_int(o, "params", (int64_t)castor_model_num_params(r->model)) ||
        cli_json_str(o, "layers", r->layers_spec) ||
        cli_json_str(o, "optimizer", castor_optimizer_kind_name(r->o.optimizer)) ||
        cli_json_str(o, "loss", r->o.loss == CASTOR_LOSS_MSE ? "mse" : "xent") ||
        cli_json_str(o, "data", r->data_dir) ||
        cli_json_int(o, "train_samples", (int64_t)castor_dataset_size(r->train)) ||
        cli_json_int(o, "validation_samples",
                     r->val ? (int64_t)castor_dataset_size(r->val) : 0) ||
        cli_json_int(o, "test_samples", (int64_t)castor_dataset_size(r->test)) ||
        json_seed(o, r->o.seed) ||
        cli_json_int(o, "device_peak_bytes",
                     (int64_t)castor_model_device_peak_bytes(r->model)) ||
        cli_json_str(o, "features", castor_build_features()))
        goto oom;
    if (cli_json_print_line(o) != 0) {
        cJSON_Delete(o);
        cli_errorf("cannot write the results to stdout");
        return CLI_EXIT_RUNTIME;
    }
    cJSON_Delete(o);
    return 0;
oom:
    cJSON_Delete(o);
    cli_errorf("out of memory writing the results");
    return CLI_EXIT_RUNTIME;
}

static void print_metrics(const char *what, double loss, double acc)
{
    printf("%-10s loss %.4f", what, loss);
    if (!isnan(acc))
        printf("  accuracy %.4f", acc);
    putchar('\n');
}

static int report_text(const train_run *r)
{
    double samples = samples_per_epoch_total(r);
    long long steps = (long long)(castor_model_step(r->model) - r->step0);
    printf("castor %s: %s strategy on %s (%d replica%s)\n", castor_version(),
           castor_strategy_kind_name(r->o.strategy), r->o.devices, r->replicas,
           r->replicas == 1 ? "" : "s");
    printf("%-10s %d -> %s, %zu parameters, %s\n", "model:",
           castor_model_input_features(r->model), r->layers_spec,
           castor_model_num_params(r->model), castor_optimizer_kind_name(r->o.optimizer));
    printf("%-10s %zu training, %zu validation, %zu test samples from %s\n", "data:",
           castor_dataset_size(r->train), r->val ? castor_dataset_size(r->val) : 0,
           castor_dataset_size(r->test), r->data_dir);
    printf("%-10s %d epoch%s, batch %d, %lld steps in %.2f s (%.0f samples/s)\n", "training:",
           r->o.epochs, r->o.epochs == 1 ? "" : "s", r->o.batch, steps, r->fit_seconds,
           r->fit_seconds > 0 ? samples / r->fit_seconds : 0.0);
    print_metrics("train:", r->train_m.loss, r->train_m.accuracy);
    if (r->val)
        print_metrics("val:", r->val_loss, r->val_accuracy);
    print_metrics("test:", r->test_m.loss, r->test_m.accuracy);
    printf("%-10s %.1f MiB device memory at peak\n", "memory:",
           (double)castor_model_device_peak_bytes(r->model) / (1024.0 * 1024.0));
    if (fflush(stdout) != 0) {
        cli_errorf("cannot write the results to stdout");
        return CLI_EXIT_RUNTIME;
    }
    return 0;
}

/* ---- the command --------------------------------------------------------------------- */

static void train_run_free(train_run *r)
{
    /* the model before the strategy it is bound to */
    castor_model_free(r->model);
    castor_dataset_free(r->val);
    castor_dataset_free(r->test);
    castor_dataset_free(r->train);
    castor_strategy_free(r->strategy);
}

int castor_cli_train(int argc, char **argv)
{
    train_run run;
    memset(&run, 0, sizeof run);
    run.val_loss = NAN;
    run.val_accuracy = NAN;

    int rc = parse_args(&run.o, argc, argv);
    if (rc >= 0)
        return rc;
    run.progress_mode = cli_progress_pick_mode(run.o.quiet);
    install_stop_handlers();

    if ((rc = make_strategy(&run)) == 0 && (rc = load_data(&run)) == 0 &&
        (rc = make_model(&run)) == 0 && (rc = fit(&run)) == 0 && (rc = evaluate(&run)) == 0)
        rc = run.o.json ? report_json(&run) : report_text(&run);

    train_run_free(&run);
    return rc;
}
