/*
 * castor train: load a data set, build and compile a model on a strategy,
 * fit it with a progress display, evaluate it on the test set and report.
 *
 * The work is split into phases over one train_run, each returning an exit
 * status (0 to go on):
 *
 *   parse_args -> make_strategy -> load_data -> make_model or resume
 *              -> prepare_outputs -> fit (progress + checkpoints) -> save
 *              -> evaluate  -> report
 *
 * Checkpoints (--checkpoint-dir) are written from the progress callback
 * every --checkpoint-every steps or epochs, at the end of training, and when
 * SIGINT/SIGTERM stops it; the names and the pruning are in ckpt.c.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "castor.h"
#include "args.h"
#include "ckpt.h"
#include "cli.h"
#include "common.h"
#include "json.h"
#include "progress.h"

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
    F_SAVE,
    F_CHECKPOINT_DIR,
    F_CHECKPOINT_EVERY,
    F_KEEP,
    F_RESUME,
    F_JSON,
    F_QUIET,
    F_VERBOSE,
    F_COUNT
};

static const cli_flag train_flags[F_COUNT + 1] = {
    [F_DATA] = {"data", "fashion-mnist|DIR", "fashion-mnist",
                "training and test data. 'fashion-mnist' is the directory\n"
                "$CASTOR_FASHION_MNIST, or else " CLI_DEFAULT_FASHION_MNIST ";\n"
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
    [F_SAVE] = {"save", "FILE", NULL,
                "write the trained model to FILE (safetensors) at the end, atomically:\n"
                "a crash leaves the old file or the new one"},
    [F_CHECKPOINT_DIR] = {"checkpoint-dir", "DIR", NULL,
                          "write checkpoints DIR/ckpt-<step, 12 digits>.safetensors (DIR is\n"
                          "created if missing) every --checkpoint-every, at the end of\n"
                          "training, and when SIGINT or SIGTERM stops it"},
    [F_CHECKPOINT_EVERY] = {"checkpoint-every", "N|epoch", "epoch",
                            "a checkpoint every N optimizer steps, or at the end of every\n"
                            "epoch (needs --checkpoint-dir)"},
    [F_KEEP] = {"keep", "K", "3",
                "keep the newest K checkpoints in --checkpoint-dir, 1 to 1000000: older\n"
                "ckpt-*.safetensors are deleted once a newer one is written; other\n"
                "files are never touched"},
    [F_RESUME] = {"resume", "DIR|FILE", NULL,
                  "continue from a checkpoint: FILE, or the newest ckpt-*.safetensors in\n"
                  "DIR (see 'Resuming' below)"},
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
            "Resuming (--resume): the model is rebuilt from the checkpoint on the\n"
            "--strategy and --devices of this command line. The file decides the\n"
            "layers, the loss, the optimizer and its hyper-parameters and the seed:\n"
            "--layers, --loss, --optimizer, --lr, --momentum, --nesterov,\n"
            "--weight-decay and --seed may be left out, and given with a value the\n"
            "file does not have they are an error (status 2). --batch defaults to the\n"
            "file's batch size, and must be that while an epoch is in progress.\n"
            "--epochs is the total for the whole run, the interrupted part included:\n"
            "training continues until that many epochs are done (a checkpoint that has\n"
            "done them all is only evaluated). On the same machine, data, strategy\n"
            "and number of replicas the result is bitwise the one of a run never\n"
            "interrupted.\n"
            "The JSON object then also has resumed_from (the file or null), saved\n"
            "(the --save file or null), checkpoints (how many were written) and\n"
            "global_step (the model's steps in all).\n"
            "\n"
            "SIGINT or SIGTERM stops training after the current step; castor writes a\n"
            "checkpoint if --checkpoint-dir is set, says where, and exits with status\n"
            "130 or 143. Exit status 1: the run failed; 2: a flag is wrong.\n");
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
    /* given on the command line (a resumed run takes the others from the file) */
    int layers_set, loss_set, optimizer_set, seed_set, batch_set;
    const char *save, *checkpoint_dir, *resume;
    int checkpoint_every; /* steps; CKPT_EVERY_EPOCH: at every epoch's end */
    int every_set, keep, keep_set;
} train_opts;

enum { CKPT_EVERY_EPOCH = -1 };

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
    int64_t epoch0;           /* the model's completed epochs before fit */
    int fitted;               /* fit ran (a resumed run may have nothing left) */
    double fit_seconds;
    castor_metrics train_m, test_m;
    double val_loss, val_accuracy; /* at the last epoch end; NaN without */
    char layers_spec[512];
    float lr;                 /* the learning rate in effect */
    /* --resume */
    char resumed_from[CLI_PATH_MAX]; /* "" for a fresh model */
    cli_ckpt_meta meta;
    /* --checkpoint-dir */
    int checkpoints;          /* written by this run */
    int64_t last_ckpt_step;   /* -1: none yet */
    char last_ckpt[CLI_PATH_MAX];
    char ckpt_error[CLI_PATH_MAX + 1024]; /* a failed write, reported after fit stops */
    int saved;                /* --save written */
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

static void note(train_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(train_run *r, const char *fmt, ...)
{
    if (!r->o.verbose)
        return;
    cli_progress_clear(&r->progress);
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
    o->checkpoint_every = CKPT_EVERY_EPOCH;
    o->keep = 3;

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
        case F_LAYERS:
            o->layers = v;
            o->layers_set = 1;
            break;
        case F_LOSS:
            o->loss_set = 1;
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
            o->optimizer_set = 1;
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
        case F_BATCH:
            bad = cli_parse_int(name, v, 1, 1 << 24, &o->batch);
            o->batch_set = 1;
            break;
        case F_VALIDATION_SPLIT:
            bad = cli_parse_int(name, v, 0, 0x7fffffff, &o->validation_split);
            break;
        case F_SEED:
            bad = cli_parse_u64(name, v, &o->seed);
            o->seed_set = 1;
            break;
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
        case F_SAVE: o->save = v; break;
        case F_CHECKPOINT_DIR: o->checkpoint_dir = v; break;
        case F_CHECKPOINT_EVERY:
            o->every_set = 1;
            if (strcmp(v, "epoch") == 0)
                o->checkpoint_every = CKPT_EVERY_EPOCH;
            else
                bad = cli_parse_int(name, v, 1, 0x7fffffff, &o->checkpoint_every);
            break;
        case F_KEEP:
            bad = cli_parse_int(name, v, 1, 1000000, &o->keep);
            o->keep_set = 1;
            break;
        case F_RESUME: o->resume = v; break;
        case F_JSON: o->json = 1; break;
        case F_QUIET: o->quiet = 1; break;
        case F_VERBOSE: o->verbose = 1; break;
        default: break;
        }
        if (bad)
            return CLI_EXIT_USAGE;
    }

    /* Flags that mean nothing for the chosen optimizer are mistakes. A
     * resumed run without --optimizer has the file's: resume() compares
     * the flags with the file instead. */
    if (!o->resume || o->optimizer_set) {
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
    }
    if (!o->checkpoint_dir && (o->every_set || o->keep_set)) {
        cli_errorf("--%s needs --checkpoint-dir", o->every_set ? "checkpoint-every" : "keep");
        return CLI_EXIT_USAGE;
    }
    if (o->verbose && o->quiet) {
        cli_errorf("--verbose and --quiet contradict each other");
        return CLI_EXIT_USAGE;
    }
    return -1;
}

/* ---- phase 2: the strategy (first: it checks --devices cheaply) -------------- */

/* Each replica needs at least one sample per step. */
static int check_batch(const train_run *r)
{
    if (r->o.batch >= r->replicas)
        return 0;
    cli_errorf("--batch %d%s is smaller than the %d replicas of --devices '%s' (each replica "
               "needs at least one sample per step)",
               r->o.batch, r->o.batch_set ? "" : " (the checkpoint's)", r->replicas,
               r->o.devices);
    return CLI_EXIT_USAGE;
}

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
                   r->o.devices, cli_why(castor_strategy_errmsg(r->strategy), rc));
        return cli_exit_for(rc);
    }
    r->replicas = castor_strategy_replicas(r->strategy);
    /* A resumed run without --batch learns its batch from the file. */
    if ((!r->o.resume || r->o.batch_set) && (rc = check_batch(r)) != 0)
        return rc;
    note(r, "strategy %s on '%s': %d replica%s", castor_strategy_kind_name(r->o.strategy),
         r->o.devices, r->replicas, r->replicas == 1 ? "" : "s");
    return 0;
}

/* ---- phase 3: the data ------------------------------------------------------------ */

static int load_data(train_run *r)
{
    r->data_dir = cli_data_dir(r->o.data);
    int rc = castor_dataset_load_mnist_dir(&r->train, r->data_dir, "train");
    if (rc != CASTOR_OK) {
        cli_errorf("cannot load the training data from %s: %s", r->data_dir,
                   cli_why(castor_dataset_errmsg(r->train), rc));
        return CLI_EXIT_RUNTIME;
    }
    rc = castor_dataset_load_mnist_dir(&r->test, r->data_dir, "test");
    if (rc != CASTOR_OK) {
        cli_errorf("cannot load the test data from %s: %s", r->data_dir,
                   cli_why(castor_dataset_errmsg(r->test), rc));
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
                       cli_why(castor_dataset_errmsg(r->train), rc));
            return cli_exit_for(rc);
        }
    }
    note(r, "data %s: %zu training, %zu validation, %zu test samples of %d features",
         r->data_dir, castor_dataset_size(r->train), r->val ? castor_dataset_size(r->val) : 0,
         castor_dataset_size(r->test), castor_dataset_features(r->train));
    return 0;
}

/* ---- phase 4: the model, new or from a checkpoint ------------------------------------ */

/* --loss mse: every data set gets one-hot targets, a unit per class. */
static int mse_targets(train_run *r, const char *what)
{
    int units = castor_model_output_units(r->model);
    int rc;
    if ((rc = cli_one_hot_targets(&r->train, units, "training", what)) != 0 ||
        (rc = cli_one_hot_targets(&r->val, units, "validation", what)) != 0 ||
        (rc = cli_one_hot_targets(&r->test, units, "test", what)) != 0)
        return rc;
    return 0;
}

static int make_model(train_run *r)
{
    int rc = castor_model_create(&r->model, castor_dataset_features(r->train));
    if (rc != CASTOR_OK) {
        cli_errorf("cannot create the model: %s", cli_why(castor_model_errmsg(r->model), rc));
        return CLI_EXIT_RUNTIME;
    }
    rc = castor_model_add_layers(r->model, r->o.layers);
    if (rc != CASTOR_OK) {
        cli_errorf("--layers '%s': %s", r->o.layers, cli_why(castor_model_errmsg(r->model), rc));
        return cli_exit_for(rc);
    }
    if (r->o.loss == CASTOR_LOSS_MSE && (rc = mse_targets(r, "--loss mse")) != 0)
        return rc;
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
                   cli_why(castor_model_errmsg(r->model), rc));
        return cli_exit_for(rc);
    }
    r->lr = opt.learning_rate;
    if (castor_model_layers_spec(r->model, r->layers_spec, sizeof r->layers_spec) != CASTOR_OK)
        snprintf(r->layers_spec, sizeof r->layers_spec, "%s", r->o.layers);
    note(r, "model %d -> %s: %zu parameters; %s, learning rate %g, seed %llu",
         castor_model_input_features(r->model), r->layers_spec,
         castor_model_num_params(r->model), castor_optimizer_kind_name(r->o.optimizer),
         (double)r->lr, (unsigned long long)r->o.seed);
    return 0;
}

/* --layers as the library writes it ("32:relu,10" -> "32:relu,10:linear"),
 * or a usage error if it does not parse. */
static int normal_layers(const char *spec, int features, char *buf, size_t size)
{
    castor_model *m = NULL;
    int rc = castor_model_create(&m, features);
    if (rc == CASTOR_OK)
        rc = castor_model_add_layers(m, spec);
    if (rc == CASTOR_OK)
        rc = castor_model_layers_spec(m, buf, size);
    if (rc != CASTOR_OK)
        cli_errorf("--layers '%s': %s", spec, cli_why(castor_model_errmsg(m), rc));
    castor_model_free(m);
    return rc == CASTOR_OK ? 0 : cli_exit_for(rc);
}

/* The flags the checkpoint decides may be given only with the file's values. */
static int check_resume_flags(train_run *r)
{
    const cli_ckpt_meta *m = &r->meta;
    const char *f = r->resumed_from;
    if (r->o.layers_set) {
        char want[512];
        int rc = normal_layers(r->o.layers, m->input_features, want, sizeof want);
        if (rc)
            return rc;
        if (strcmp(want, r->layers_spec) != 0) {
            cli_errorf("--layers '%s' differs from the checkpoint %s, which has '%s' (a resumed "
                       "run takes the layers from the file: leave --layers out)",
                       r->o.layers, f, r->layers_spec);
            return CLI_EXIT_USAGE;
        }
    }
    const char *file_loss = strcmp(m->loss, "mse") == 0 ? "mse" : "xent";
    const char *flag = NULL;
    char given[64] = "", has[64] = "";
    if (r->o.loss_set && strcmp(file_loss, r->o.loss == CASTOR_LOSS_MSE ? "mse" : "xent") != 0) {
        flag = "loss";
        snprintf(given, sizeof given, "%s", r->o.loss == CASTOR_LOSS_MSE ? "mse" : "xent");
        snprintf(has, sizeof has, "%s", file_loss);
    } else if (r->o.optimizer_set &&
               strcmp(m->optimizer, castor_optimizer_kind_name(r->o.optimizer)) != 0) {
        flag = "optimizer";
        snprintf(given, sizeof given, "%s", castor_optimizer_kind_name(r->o.optimizer));
        snprintf(has, sizeof has, "%s", m->optimizer);
    } else if (r->o.lr_set && (float)r->o.lr != (float)m->learning_rate) {
        flag = "lr";
        snprintf(given, sizeof given, "%g", r->o.lr);
        snprintf(has, sizeof has, "%g", m->learning_rate);
    } else if (r->o.momentum_set && (float)r->o.momentum != (float)m->momentum) {
        flag = "momentum";
        snprintf(given, sizeof given, "%g", r->o.momentum);
        snprintf(has, sizeof has, "%g", m->momentum);
    } else if (r->o.nesterov && !m->nesterov) {
        flag = "nesterov";
        snprintf(given, sizeof given, "on");
        snprintf(has, sizeof has, "off");
    } else if (r->o.weight_decay_set && (float)r->o.weight_decay != (float)m->weight_decay) {
        flag = "weight-decay";
        snprintf(given, sizeof given, "%g", r->o.weight_decay);
        snprintf(has, sizeof has, "%g", m->weight_decay);
    } else if (r->o.seed_set && r->o.seed != m->seed) {
        flag = "seed";
        snprintf(given, sizeof given, "%llu", (unsigned long long)r->o.seed);
        snprintf(has, sizeof has, "%llu", (unsigned long long)m->seed);
    }
    if (flag) {
        cli_errorf("--%s %s differs from the checkpoint %s, which has %s (a resumed run takes "
                   "it from the file: leave --%s out)",
                   flag, given, f, has, flag);
        return CLI_EXIT_USAGE;
    }
    if (r->o.batch_set && m->step_in_epoch > 0 && r->o.batch != m->epoch_batch) {
        cli_errorf("--batch %d differs from the checkpoint %s, which is %lld steps into an "
                   "epoch of batch %d (finish the epoch with that batch: leave --batch out)",
                   r->o.batch, f, (long long)m->step_in_epoch, m->epoch_batch);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

static int resume(train_run *r)
{
    const char *from = r->o.resume;
    char err[CLI_PATH_MAX + 256];
    struct stat st;
    if (stat(from, &st) != 0) {
        cli_errorf("--resume %s: %s", from, strerror(errno));
        return CLI_EXIT_RUNTIME;
    }
    if (S_ISDIR(st.st_mode)) {
        int found = cli_ckpt_newest(from, r->resumed_from, sizeof r->resumed_from, err,
                                    sizeof err);
        if (found < 0) {
            cli_errorf("--resume %s", err);
            return CLI_EXIT_RUNTIME;
        }
        if (found == 0) {
            cli_errorf("--resume %s: no checkpoint (ckpt-<step>.safetensors) in this directory",
                       from);
            return CLI_EXIT_RUNTIME;
        }
    } else if (snprintf(r->resumed_from, sizeof r->resumed_from, "%s", from) >=
               (int)sizeof r->resumed_from) {
        cli_errorf("--resume %s: path too long", from);
        return CLI_EXIT_RUNTIME;
    }
    const char *path = r->resumed_from;

    int rc = castor_model_open(&r->model, path, r->strategy);
    if (rc != CASTOR_OK) {
        cli_errorf("--resume %s: %s", path,
                   cli_why(cli_about_file(castor_model_errmsg(r->model), path), rc));
        return cli_exit_for(rc);
    }
    if (cli_ckpt_read_meta(path, &r->meta, err, sizeof err) != 0) {
        cli_errorf("--resume %s", err);
        return CLI_EXIT_RUNTIME;
    }
    if (castor_model_layers_spec(r->model, r->layers_spec, sizeof r->layers_spec) != CASTOR_OK)
        snprintf(r->layers_spec, sizeof r->layers_spec, "%s", r->meta.layers);
    if ((rc = check_resume_flags(r)) != 0)
        return rc;
    int features = castor_model_input_features(r->model);
    if (features != castor_dataset_features(r->train)) {
        cli_errorf("--resume %s: the model takes %d features per sample but the data in %s has "
                   "%d",
                   path, features, r->data_dir, castor_dataset_features(r->train));
        return CLI_EXIT_USAGE;
    }

    /* What the file decides is what the run reports. */
    r->o.loss = strcmp(r->meta.loss, "mse") == 0 ? CASTOR_LOSS_MSE : CASTOR_LOSS_SOFTMAX_XENT;
    if (castor_optimizer_kind_parse(r->meta.optimizer, &r->o.optimizer) != CASTOR_OK)
        r->o.optimizer = CASTOR_OPT_ADAM;
    r->lr = (float)r->meta.learning_rate;
    r->o.seed = r->meta.seed;
    if (!r->o.batch_set && r->meta.epoch_batch > 0)
        r->o.batch = r->meta.epoch_batch;
    if ((rc = check_batch(r)) != 0)
        return rc;
    if (r->o.loss == CASTOR_LOSS_MSE && (rc = mse_targets(r, path)) != 0)
        return rc;

    if (!r->o.quiet && r->meta.strategy[0] &&
        (strcmp(r->meta.strategy, castor_strategy_kind_name(r->o.strategy)) != 0 ||
         (r->meta.replicas > 0 && r->meta.replicas != r->replicas)))
        fprintf(stderr,
                "castor: warning: %s was written by the %s strategy on %d replica%s; going on "
                "with %s on %d, training continues but not bit for bit as it would have\n",
                path, r->meta.strategy, r->meta.replicas, r->meta.replicas == 1 ? "" : "s",
                castor_strategy_kind_name(r->o.strategy), r->replicas);
    note(r, "resumed from %s: step %lld, epoch %lld + %lld steps; %d -> %s, %s, learning rate "
            "%g, seed %llu",
         path, (long long)castor_model_step(r->model), (long long)castor_model_epoch(r->model),
         (long long)castor_model_step_in_epoch(r->model), features, r->layers_spec,
         r->meta.optimizer, (double)r->lr, (unsigned long long)r->o.seed);
    return 0;
}

/* ---- phase 5: where the results go, checked before training ---------------------------- */

static int prepare_outputs(train_run *r)
{
    char err[CLI_PATH_MAX + 256];
    if (r->o.save) {
        /* --save FILE: its directory must exist; find out now, not after
         * the training. */
        char dir[CLI_PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s", r->o.save) >= (int)sizeof dir) {
            cli_errorf("--save %s: path too long", r->o.save);
            return CLI_EXIT_USAGE;
        }
        char *slash = strrchr(dir, '/');
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
        struct stat st;
        if (stat(r->o.save, &st) == 0 && S_ISDIR(st.st_mode)) {
            cli_errorf("--save %s: is a directory (give a file name)", r->o.save);
            return CLI_EXIT_USAGE;
        }
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            cli_errorf("--save %s: the directory %s does not exist", r->o.save, dir);
            return CLI_EXIT_RUNTIME;
        }
        if (access(dir, W_OK | X_OK) != 0) {
            cli_errorf("--save %s: cannot write in %s: %s", r->o.save, dir, strerror(errno));
            return CLI_EXIT_RUNTIME;
        }
    }
    if (r->o.checkpoint_dir) {
        if (cli_mkdir_p(r->o.checkpoint_dir, err, sizeof err) != 0) {
            cli_errorf("--checkpoint-dir %s", err);
            return CLI_EXIT_RUNTIME;
        }
        char probe[CLI_PATH_MAX];
        if (cli_ckpt_path(probe, sizeof probe, r->o.checkpoint_dir, 0) != 0) {
            cli_errorf("--checkpoint-dir %s: path too long", r->o.checkpoint_dir);
            return CLI_EXIT_USAGE;
        }
    }
    return 0;
}

/* ---- phase 6: training --------------------------------------------------------------- */

/* Write DIR/ckpt-<step>.safetensors, then prune the old ones; 0 or -1 with
 * r->ckpt_error set. */
static int write_checkpoint(train_run *r)
{
    int64_t step = castor_model_step(r->model);
    char path[CLI_PATH_MAX], err[CLI_PATH_MAX + 256];
    if (cli_ckpt_path(path, sizeof path, r->o.checkpoint_dir, step) != 0) {
        snprintf(r->ckpt_error, sizeof r->ckpt_error, "--checkpoint-dir %s: path too long",
                 r->o.checkpoint_dir);
        return -1;
    }
    int rc = castor_model_save(r->model, path);
    if (rc != CASTOR_OK) {
        snprintf(r->ckpt_error, sizeof r->ckpt_error,
                 "cannot write the checkpoint %s: %s (training stopped at step %lld)", path,
                 cli_why(cli_about_file(castor_model_errmsg(r->model), path), rc),
                 (long long)step);
        return -1;
    }
    r->checkpoints++;
    r->last_ckpt_step = step;
    snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", path);
    note(r, "checkpoint %s", path);
    /* Only now that the new one is safely on disk may old ones go. A
     * failure to delete costs disk space, not progress: warn and go on. */
    if (cli_ckpt_prune(r->o.checkpoint_dir, r->o.keep, path, err, sizeof err) < 0) {
        cli_progress_clear(&r->progress);
        fprintf(stderr, "castor: warning: %s\n", err);
    }
    return 0;
}

static int on_progress(void *user, const castor_progress *p)
{
    train_run *r = user;
    /* Show the epochs of the whole run: a resumed run goes on counting. */
    castor_progress shown = *p;
    shown.epoch = p->epoch + (int)r->epoch0;
    shown.epochs = r->o.epochs;
    cli_progress_update(&r->progress, &shown);
    if (p->epoch_end) {
        r->val_loss = p->val_loss;
        r->val_accuracy = p->val_accuracy;
    }
    if (r->o.checkpoint_dir && p->global_step != r->last_ckpt_step &&
        (r->o.checkpoint_every == CKPT_EVERY_EPOCH ? p->epoch_end
                                                   : p->global_step % r->o.checkpoint_every == 0) &&
        write_checkpoint(r) != 0)
        return 1; /* fit stops; fit() reports r->ckpt_error */
    return g_stop_signal != 0;
}

/* SIGINT/SIGTERM: keep what was trained if there is a place for it, say
 * where, and exit 128 + the signal. */
static int report_interrupt(train_run *r)
{
    int sig = g_stop_signal;
    cli_progress_finish(&r->progress);
    if (!r->model) {
        fprintf(stderr, "castor: interrupted before training\n");
        return 128 + sig;
    }
    long long step = (long long)castor_model_step(r->model);
    if (!r->o.checkpoint_dir) {
        fprintf(stderr, "castor: interrupted after step %lld; no checkpoint directory set, "
                        "progress lost\n", step);
    } else if (r->last_ckpt_step == step || write_checkpoint(r) == 0) {
        fprintf(stderr, "castor: interrupted after step %lld; checkpoint saved to %s\n", step,
                r->last_ckpt);
    } else {
        fprintf(stderr, "castor: interrupted after step %lld; %s\n", step, r->ckpt_error);
    }
    return 128 + sig;
}

static int fit(train_run *r)
{
    if (g_stop_signal)
        return report_interrupt(r);
    r->step0 = castor_model_step(r->model);
    r->epoch0 = castor_model_epoch(r->model);
    /* --epochs is the run's total; an epoch in progress counts as one. */
    int64_t left = (int64_t)r->o.epochs - r->epoch0;
    if (left <= 0) {
        if (!r->o.quiet)
            fprintf(stderr, "castor: %s has done %lld epochs of --epochs %d: nothing left to "
                            "train; evaluating\n",
                    r->resumed_from, (long long)r->epoch0, r->o.epochs);
        r->train_m.loss = r->train_m.accuracy = NAN;
        return 0;
    }
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = (int)left;
    fo.batch_size = r->o.batch;
    fo.shuffle = 1;
    fo.validation = r->val;
    fo.progress = on_progress;
    fo.progress_user = r;

    cli_progress_init(&r->progress, r->progress_mode, r->o.batch,
                      castor_dataset_size(r->train), r->step0);
    double t0 = cli_now();
    int rc = castor_model_fit(r->model, r->train, &fo, &r->train_m);
    r->fit_seconds = cli_now() - t0;
    r->fitted = 1;
    cli_progress_finish(&r->progress);

    if (r->ckpt_error[0]) {
        cli_errorf("%s", r->ckpt_error);
        return CLI_EXIT_RUNTIME;
    }
    if (rc == CASTOR_INTERRUPTED && g_stop_signal)
        return report_interrupt(r);
    if (rc != CASTOR_OK) {
        cli_errorf("training failed: %s", cli_why(castor_model_errmsg(r->model), rc));
        return cli_exit_for(rc);
    }
    if (g_stop_signal) /* arrived after the last step: stop before evaluating */
        return report_interrupt(r);
    /* The newest checkpoint is the trained model, whatever the period. */
    if (r->o.checkpoint_dir && r->last_ckpt_step != castor_model_step(r->model) &&
        write_checkpoint(r) != 0) {
        cli_errorf("%s", r->ckpt_error);
        return CLI_EXIT_RUNTIME;
    }
    return 0;
}

static int save(train_run *r)
{
    if (!r->o.save)
        return 0;
    int rc = castor_model_save(r->model, r->o.save);
    if (rc != CASTOR_OK) {
        cli_errorf("--save %s: %s", r->o.save, cli_why(castor_model_errmsg(r->model), rc));
        return CLI_EXIT_RUNTIME;
    }
    r->saved = 1;
    note(r, "saved %s", r->o.save);
    return 0;
}

/* ---- phase 7: evaluation and the report ---------------------------------------------- */

static int evaluate(train_run *r)
{
    int rc = castor_model_evaluate(r->model, r->test, r->o.batch, &r->test_m);
    if (rc != CASTOR_OK) {
        cli_errorf("evaluation on the test set failed: %s",
                   cli_why(castor_model_errmsg(r->model), rc));
        return CLI_EXIT_RUNTIME;
    }
    if (g_stop_signal)
        return report_interrupt(r);
    return 0;
}

static double samples_per_epoch_total(const train_run *r)
{
    /* Counted step by step by the progress callback; the steps times the
     * batch if the callback saw nothing. */
    if (r->progress.samples > 0)
        return r->progress.samples;
    return (double)(castor_model_step(r->model) - r->step0) * (double)r->o.batch;
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
        cli_json_int(o, "global_step", castor_model_step(r->model)) ||
        cli_json_num(o, "seconds", r->fit_seconds) ||
        cli_json_num(o, "samples_per_second",
                     r->fit_seconds > 0 ? samples / r->fit_seconds : NAN) ||
        cli_json_str(o, "strategy", castor_strategy_kind_name(r->o.strategy)) ||
        cli_json_str(o, "devices", r->o.devices) || cli_json_int(o, "replicas", r->replicas) ||
        cli_json_int(o, "batch", r->o.batch) ||
        cli_json_int(o, "params", (int64_t)castor_model_num_params(r->model)) ||
        cli_json_str(o, "layers", r->layers_spec) ||
        cli_json_str(o, "optimizer", castor_optimizer_kind_name(r->o.optimizer)) ||
        cli_json_num(o, "learning_rate", (double)r->lr) ||
        cli_json_str(o, "loss", r->o.loss == CASTOR_LOSS_MSE ? "mse" : "xent") ||
        cli_json_str(o, "data", r->data_dir) ||
        cli_json_int(o, "train_samples", (int64_t)castor_dataset_size(r->train)) ||
        cli_json_int(o, "validation_samples",
                     r->val ? (int64_t)castor_dataset_size(r->val) : 0) ||
        cli_json_int(o, "test_samples", (int64_t)castor_dataset_size(r->test)) ||
        json_seed(o, r->o.seed) ||
        cli_json_str(o, "resumed_from", r->resumed_from[0] ? r->resumed_from : NULL) ||
        cli_json_str(o, "saved", r->saved ? r->o.save : NULL) ||
        cli_json_int(o, "checkpoints", r->checkpoints) ||
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
    if (r->resumed_from[0])
        printf("%-10s from %s at step %lld\n", "resumed:", r->resumed_from,
               (long long)r->step0);
    printf("%-10s %d epoch%s, batch %d, %lld steps in %.2f s (%.0f samples/s)\n", "training:",
           r->o.epochs, r->o.epochs == 1 ? "" : "s", r->o.batch, steps, r->fit_seconds,
           r->fit_seconds > 0 ? samples / r->fit_seconds : 0.0);
    if (r->fitted)
        print_metrics("train:", r->train_m.loss, r->train_m.accuracy);
    if (r->val && r->fitted)
        print_metrics("val:", r->val_loss, r->val_accuracy);
    print_metrics("test:", r->test_m.loss, r->test_m.accuracy);
    printf("%-10s %.1f MiB device memory at peak\n", "memory:",
           (double)castor_model_device_peak_bytes(r->model) / (1024.0 * 1024.0));
    if (r->checkpoints > 0)
        printf("%-10s %d written, the newest %s\n", "checkpoints:", r->checkpoints,
               r->last_ckpt);
    if (r->saved)
        printf("%-10s %s\n", "saved:", r->o.save);
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
    run.last_ckpt_step = -1;

    int rc = parse_args(&run.o, argc, argv);
    if (rc >= 0)
        return rc;
    run.progress_mode = cli_progress_pick_mode(run.o.quiet);
    cli_progress_init(&run.progress, CLI_PROGRESS_NONE, run.o.batch, 0, 0);
    int blas = cli_blas_threads(run.o.devices);
    if (blas > 0)
        note(&run, "OpenBLAS: %d thread%s per GEMM", blas, blas == 1 ? "" : "s");
    install_stop_handlers();

    if ((rc = make_strategy(&run)) == 0 && (rc = load_data(&run)) == 0 &&
        (rc = run.o.resume ? resume(&run) : make_model(&run)) == 0 &&
        (rc = prepare_outputs(&run)) == 0 && (rc = fit(&run)) == 0 && (rc = save(&run)) == 0 &&
        (rc = evaluate(&run)) == 0)
        rc = run.o.json ? report_json(&run) : report_text(&run);

    train_run_free(&run);
    return rc;
}
