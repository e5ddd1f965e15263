/*
 * castor eval and castor predict: open a saved model (a checkpoint or a
 * --save file) on a strategy and run it on the test set.
 *
 *   eval     the test loss and accuracy;
 *   predict  for the first --limit test samples: the predicted class, its
 *            softmax probability (computed here from the logits that
 *            castor_model_predict returns) and the true label.
 *
 * Both share one flag table (predict adds --limit) and one setup:
 * parse -> strategy -> open the model -> load the test set.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "args.h"
#include "ckpt.h"
#include "cli.h"
#include "common.h"
#include "json.h"
#include "progress.h"

enum {
    F_MODEL,
    F_DATA,
    F_STRATEGY,
    F_DEVICES,
    F_BATCH,
    F_JSON,
    F_QUIET,
    F_DEVICE_MEMORY,
    F_LIMIT, /* predict only: the last row, left out of eval's table */
    F_COUNT
};

#define ROW_MODEL                                                                        \
    {"model", "FILE", "none: required",                                                  \
     "the model: a file written by 'castor train --save' or a checkpoint"}
#define ROW_DATA                                                                         \
    {"data", "fashion-mnist|DIR", "fashion-mnist",                                       \
     "the test set: t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (plain\n"          \
     "or .gz) in DIR, read as train reads them (unsigned-byte pixels scaled\n"           \
     "to [0,1]); 'fashion-mnist' is $CASTOR_FASHION_MNIST, or else\n"                    \
     CLI_DEFAULT_FASHION_MNIST}
#define ROW_STRATEGY                                                                     \
    {"strategy", "central|mirrored", "central",                                          \
     "the strategy to run the model on (any works for any file)"}
#define ROW_DEVICES                                                                      \
    {"devices", "LIST", "cpu",                                                           \
     "the replicas: cpu, cpu:N, cpu:NxK, cuda, cuda:0,cuda:1, cuda:0x4;\n"                \
     "at most 64 replicas in all"}
#define ROW_BATCH                                                                        \
    {"batch", "N", "256", "samples per step, at least the number of replicas, at most 16777216"}
#define ROW_QUIET {"quiet", NULL, NULL, "no library warnings on stderr"}

static const cli_flag eval_flags[F_COUNT] = {
    [F_MODEL] = ROW_MODEL,
    [F_DATA] = ROW_DATA,
    [F_STRATEGY] = ROW_STRATEGY,
    [F_DEVICES] = ROW_DEVICES,
    [F_BATCH] = ROW_BATCH,
    [F_JSON] = {"json", NULL, NULL,
                "print one JSON object: version, test_loss, test_accuracy, samples,\n"
                "model, data, layers, loss, step, epoch, strategy, devices, replicas,\n"
                "batch"},
    [F_QUIET] = ROW_QUIET,
    [F_DEVICE_MEMORY] = CLI_ROW_DEVICE_MEMORY,
    [F_LIMIT] = {NULL, NULL, NULL, NULL}, /* ends the table: eval has no --limit */
};

static const cli_flag predict_flags[F_COUNT + 1] = {
    [F_MODEL] = ROW_MODEL,
    [F_DATA] = ROW_DATA,
    [F_STRATEGY] = ROW_STRATEGY,
    [F_DEVICES] = ROW_DEVICES,
    [F_BATCH] = ROW_BATCH,
    [F_JSON] = {"json", NULL, NULL,
                "print one JSON array, an object per sample: index, predicted\n"
                "(null where an output is NaN, or the largest logit infinite: a\n"
                "diverged model predicts nothing),\n"
                "probability (null for an MSE model), output (the predicted unit's\n"
                "logit or value) and label"},
    [F_QUIET] = ROW_QUIET,
    [F_DEVICE_MEMORY] = CLI_ROW_DEVICE_MEMORY,
    [F_LIMIT] = {"limit", "N", "10",
                 "the first N test samples, 1 to 2147483647 (all of them if fewer)"},
    [F_COUNT] = {NULL, NULL, NULL, NULL},
};

void castor_cli_eval_usage(FILE *out)
{
    fprintf(out,
            "usage: castor eval --model FILE [flags]\n"
            "\n"
            "Open a saved model on a strategy and evaluate it on the test set: the\n"
            "mean loss and, for a softmax cross-entropy model, the accuracy.\n"
            "\n"
            "flags:\n");
    cli_print_flags(out, eval_flags);
    fprintf(out,
            "  -h, --help\n"
            "      show this help\n"
            "\n"
            "example:\n"
            "  castor train --data fashion-mnist --epochs 10 --save model.safetensors\n"
            "  castor eval --model model.safetensors --data fashion-mnist --devices cpu:2\n"
            "\n"
            "Exit status 1: the model or the data could not be read, or the devices\n"
            "failed (no GPU, too little device memory); 2: a flag is wrong or the data\n"
            "does not fit the model.\n");
}

void castor_cli_predict_usage(FILE *out)
{
    fprintf(out,
            "usage: castor predict --model FILE [flags]\n"
            "\n"
            "Open a saved model and print, for the first --limit samples of the test\n"
            "set, the predicted class, its softmax probability and the true label.\n"
            "\n"
            "flags:\n");
    cli_print_flags(out, predict_flags);
    fprintf(out,
            "  -h, --help\n"
            "      show this help\n"
            "\n"
            "Exit status 1: the model or the data could not be read, or the devices\n"
            "failed (no GPU, too little device memory); 2: a flag is wrong or the data\n"
            "does not fit the model.\n");
}

typedef struct model_cmd {
    const char *cmd; /* "eval" or "predict" */
    const char *model, *data, *devices;
    castor_strategy_kind strategy;
    int batch, limit, json, quiet;
    size_t device_memory;
    const char *data_dir;
    castor_strategy *s;
    castor_model *m;
    castor_dataset *test;
    cli_ckpt_meta meta;
    char layers[CLI_LAYERS_MAX];
} model_cmd;

/* Starts *c afresh for the command cmd ("eval" or "predict"), so the two
 * entry points share all of their setup. Returns -1 to go on, else the exit
 * status. */
static int parse(model_cmd *c, const char *cmd, const cli_flag *flags, void (*usage)(FILE *),
                 int argc, char **argv)
{
    memset(c, 0, sizeof *c);
    c->cmd = cmd;
    c->data = "fashion-mnist";
    c->devices = "cpu";
    c->strategy = CASTOR_STRATEGY_CENTRAL;
    c->batch = 256;
    c->limit = 10;
    cli_parser p;
    cli_parser_init(&p, c->cmd, argc, argv);
    for (;;) {
        const char *v;
        int f = cli_next(&p, flags, &v);
        if (f == CLI_DONE)
            break;
        if (f == CLI_HELP) {
            usage(stdout);
            return CLI_EXIT_OK;
        }
        if (f == CLI_FAIL)
            return CLI_EXIT_USAGE;
        int bad = 0;
        switch (f) {
        case F_MODEL: c->model = v; break;
        case F_DATA: c->data = v; break;
        case F_STRATEGY:
            if (castor_strategy_kind_parse(v, &c->strategy) != CASTOR_OK) {
                cli_errorf("--strategy '%s': not a strategy (central or mirrored)", v);
                bad = 1;
            }
            break;
        case F_DEVICES: c->devices = v; break;
        case F_BATCH: bad = cli_parse_int("batch", v, 1, 1 << 24, &c->batch); break;
        case F_JSON: c->json = 1; break;
        case F_QUIET: c->quiet = 1; break;
        case F_LIMIT: bad = cli_parse_int("limit", v, 1, 0x7fffffff, &c->limit); break;
        case F_DEVICE_MEMORY: bad = cli_parse_size("device-memory", v, &c->device_memory); break;
        default: break;
        }
        if (bad)
            return CLI_EXIT_USAGE;
    }
    if (!c->model) {
        cli_errorf("%s: --model FILE is required (see 'castor %s --help')", c->cmd, c->cmd);
        return CLI_EXIT_USAGE;
    }
    return -1;
}

static int is_mse(const model_cmd *c)
{
    return strcmp(c->meta.loss, "mse") == 0;
}

static int setup(model_cmd *c)
{
    cli_blas_threads(c->devices);
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.log_level = c->quiet ? CASTOR_LOG_ERROR : CASTOR_LOG_WARN;
    so.log_fn = cli_log_stderr;
    so.device_memory_budget = c->device_memory;
    int rc = castor_strategy_create(&c->s, c->strategy, c->devices, &so);
    if (rc != CASTOR_OK) {
        cli_errorf("--strategy %s --devices '%s': %s", castor_strategy_kind_name(c->strategy),
                   c->devices, cli_why(castor_strategy_errmsg(c->s), rc));
        return cli_exit_for(rc);
    }
    int replicas = castor_strategy_replicas(c->s);
    if (c->batch < replicas) {
        cli_errorf("--batch %d is smaller than the %d replicas of --devices '%s'", c->batch,
                   replicas, c->devices);
        return CLI_EXIT_USAGE;
    }
    rc = castor_model_open(&c->m, c->model, c->s);
    if (rc != CASTOR_OK) {
        cli_errorf("--model %s: %s", c->model,
                   cli_why(cli_about_file(castor_model_errmsg(c->m), c->model), rc));
        return rc == CASTOR_INVALID ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
    }
    char err[CLI_PATH_MAX + 256];
    if (cli_ckpt_read_meta(c->model, &c->meta, err, sizeof err) != 0) {
        cli_errorf("--model %s", err);
        return CLI_EXIT_RUNTIME;
    }
    if (castor_model_layers_spec(c->m, c->layers, sizeof c->layers) != CASTOR_OK)
        snprintf(c->layers, sizeof c->layers, "%s", c->meta.layers);
    c->data_dir = cli_data_dir(c->data);
    rc = castor_dataset_load_mnist_dir(&c->test, c->data_dir, "test");
    if (rc != CASTOR_OK) {
        cli_errorf("cannot load the test data from %s: %s", c->data_dir,
                   cli_why(castor_dataset_errmsg(c->test), rc));
        return CLI_EXIT_RUNTIME;
    }
    int features = castor_model_input_features(c->m);
    if (features != castor_dataset_features(c->test)) {
        cli_errorf("--model %s takes %d features per sample but the test set in %s has %d",
                   c->model, features, c->data_dir, castor_dataset_features(c->test));
        return CLI_EXIT_USAGE;
    }
    /* The same features in another shape, or scaled otherwise, are other
     * data than the model was trained on (where its file says). */
    cli_data_kind trained = {c->meta.input_type, c->meta.input_rank, {0, 0, 0}};
    memcpy(trained.dims, c->meta.input_dims, sizeof trained.dims);
    char has[CLI_PATH_MAX + 32];
    snprintf(has, sizeof has, "--model %s was trained on", c->model);
    if ((rc = cli_check_data_kind(c->test, "test", c->data_dir, &trained, has)) != 0)
        return rc;
    /* Labels past the last layer's units: evaluate would refuse them
     * without saying where they came from, and predict could only call
     * every such sample wrong. */
    char what[CLI_PATH_MAX + 32];
    snprintf(what, sizeof what, "--model %s", c->model);
    return cli_check_labels(c->test, castor_model_output_units(c->m), "test", c->data_dir, what,
                            is_mse(c) ? "one-hot targets need one per class"
                                      : "softmax cross-entropy needs a unit per class");
}

static void model_cmd_free(model_cmd *c)
{
    castor_model_free(c->m);
    castor_dataset_free(c->test);
    castor_strategy_free(c->s);
}

/* ---- eval ------------------------------------------------------------------------- */

static int eval_report(const model_cmd *c, const castor_metrics *mt)
{
    if (!c->json) {
        printf("castor %s: %s (%d -> %s, step %lld, epoch %lld)\n", castor_version(), c->model,
               castor_model_input_features(c->m), c->layers, (long long)castor_model_step(c->m),
               (long long)castor_model_epoch(c->m));
        printf("%-12s loss ", "test:");
        cli_print_loss(stdout, mt->loss);
        if (!isnan(mt->accuracy))
            printf("  accuracy %.4f", mt->accuracy);
        printf("  (%zu sample%s from %s)\n", mt->samples, mt->samples == 1 ? "" : "s",
               c->data_dir);
        return cli_flush_results("eval");
    }
    cJSON *o = cJSON_CreateObject();
    int oom = !o || cli_json_str(o, "version", castor_version()) ||
        cli_json_num(o, "test_loss", mt->loss) ||
        cli_json_num(o, "test_accuracy", mt->accuracy) ||
        cli_json_int(o, "samples", (int64_t)mt->samples) ||
        cli_json_str(o, "model", c->model) || cli_json_str(o, "data", c->data_dir) ||
        cli_json_str(o, "layers", c->layers) ||
        cli_json_str(o, "loss", is_mse(c) ? "mse" : "xent") ||
        cli_json_int(o, "step", castor_model_step(c->m)) ||
        cli_json_int(o, "epoch", castor_model_epoch(c->m)) ||
        cli_json_str(o, "strategy", castor_strategy_kind_name(c->strategy)) ||
        cli_json_str(o, "devices", c->devices) ||
        cli_json_int(o, "replicas", castor_strategy_replicas(c->s)) ||
        cli_json_int(o, "batch", c->batch);
    return cli_json_emit(o, oom, "eval");
}

int castor_cli_eval(int argc, char **argv)
{
    model_cmd c;
    int rc = parse(&c, "eval", eval_flags, castor_cli_eval_usage, argc, argv);
    if (rc >= 0)
        return rc;
    if ((rc = setup(&c)) == 0 && is_mse(&c))
        rc = cli_one_hot_targets(&c.test, castor_model_output_units(c.m), "test", c.data_dir,
                                 c.model);
    if (rc == 0) {
        castor_metrics mt;
        int st = castor_model_evaluate(c.m, c.test, c.batch, &mt);
        if (st != CASTOR_OK) {
            cli_errorf("eval: %s", cli_why(castor_model_errmsg(c.m), st));
            rc = cli_exit_for(st);
        } else {
            rc = eval_report(&c, &mt);
        }
    }
    model_cmd_free(&c);
    return rc;
}

/* ---- predict ------------------------------------------------------------------------ */

typedef struct prediction {
    int predicted;      /* -1: none (a NaN output) */
    double probability; /* NaN for an MSE model */
    double output;      /* the predicted unit's logit (or value) */
    int label;          /* -1: none */
} prediction;

/* The largest unit and, from logits, its softmax probability (computed
 * with the maximum subtracted, so that exp cannot overflow). A row whose
 * loss the library finds NaN predicts nothing, as its accuracy counts it
 * no hit: one with a NaN (the scan below stops at a NaN in unit 0, and
 * predicted class 0 for a model whose outputs were all NaN), and for
 * logits one whose largest is not finite (+inf, or every unit -inf). */
static prediction predict_row(const float *y, int units, int softmax)
{
    prediction p = {0, NAN, 0.0, -1};
    for (int k = 0; k < units; k++)
        if (isnan(y[k])) {
            p.predicted = -1;
            p.output = NAN;
            return p;
        }
    for (int k = 1; k < units; k++)
        if (y[k] > y[p.predicted])
            p.predicted = k;
    double top = y[p.predicted];
    p.output = top;
    if (softmax && !isfinite(top)) {
        p.predicted = -1;
        return p;
    }
    if (softmax) {
        double sum = 0.0;
        for (int k = 0; k < units; k++)
            sum += exp((double)y[k] - top);
        p.probability = 1.0 / sum;
    }
    return p;
}

static int predict_report(const model_cmd *c, const prediction *pr, size_t n)
{
    if (!c->json) {
        printf("%-7s %-9s %-11s %s\n", "sample", "predicted", is_mse(c) ? "output" : "probability",
               "label");
        for (size_t i = 0; i < n; i++) {
            double shown = is_mse(c) ? pr[i].output : pr[i].probability;
            char predicted[16] = "-";
            if (pr[i].predicted >= 0)
                snprintf(predicted, sizeof predicted, "%d", pr[i].predicted);
            if (isnan(shown))  /* a diverged model: "nan", as train shows it, not "-nan" */
                printf("%-7zu %-9s %-11s ", i, predicted, "nan");
            else
                printf("%-7zu %-9s %-11.4f ", i, predicted, shown);
            if (pr[i].label >= 0)
                printf("%d%s\n", pr[i].label, pr[i].label == pr[i].predicted ? "" : "  (wrong)");
            else
                printf("-\n");
        }
        return cli_flush_results("predict");
    }
    cJSON *a = cJSON_CreateArray();
    int oom = !a;
    for (size_t i = 0; i < n && !oom; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(a, o)) {
            cJSON_Delete(o);
            oom = 1;
            break;
        }
        oom = cli_json_int(o, "index", (int64_t)i) ||
              (pr[i].predicted >= 0 ? cli_json_int(o, "predicted", pr[i].predicted)
                                    : cli_json_str(o, "predicted", NULL)) ||
              cli_json_num(o, "probability", pr[i].probability) ||
              cli_json_num(o, "output", pr[i].output) ||
              (pr[i].label >= 0 ? cli_json_int(o, "label", pr[i].label)
                                : cli_json_str(o, "label", NULL));
    }
    return cli_json_emit(a, oom, "predict");
}

static int run_predict(model_cmd *c)
{
    size_t n = castor_dataset_size(c->test);
    if ((size_t)c->limit < n)
        n = (size_t)c->limit;
    int units = castor_model_output_units(c->m);
    float *y = n ? calloc(n, (size_t)units * sizeof *y) : NULL;
    prediction *pr = n ? calloc(n, sizeof *pr) : NULL;
    if (n && (!y || !pr)) {
        free(y);
        free(pr);
        cli_errorf("predict: out of memory for %zu predictions of %d units", n, units);
        return CLI_EXIT_RUNTIME;
    }
    int rc = 0;
    if (n) {
        int st = castor_model_predict(c->m, castor_dataset_x(c->test), n, c->batch, y);
        if (st != CASTOR_OK) {
            cli_errorf("predict: %s", cli_why(castor_model_errmsg(c->m), st));
            rc = cli_exit_for(st);
        }
    }
    const int32_t *labels = castor_dataset_labels(c->test);
    for (size_t i = 0; i < n && rc == 0; i++) {
        pr[i] = predict_row(y + i * (size_t)units, units, !is_mse(c));
        pr[i].label = labels ? (int)labels[i] : -1;
    }
    if (rc == 0)
        rc = predict_report(c, pr, n);
    free(y);
    free(pr);
    return rc;
}

int castor_cli_predict(int argc, char **argv)
{
    model_cmd c;
    int rc = parse(&c, "predict", predict_flags, castor_cli_predict_usage, argc, argv);
    if (rc >= 0)
        return rc;
    if ((rc = setup(&c)) == 0)
        rc = run_predict(&c);
    model_cmd_free(&c);
    return rc;
}
