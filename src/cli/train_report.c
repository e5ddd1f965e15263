/*
 * castor train's summary on stdout: a few aligned lines of text, or with
 * --json one object on the last line for scripts (its keys are listed in
 * castor train --help). Progress and messages go to stderr, so stdout holds
 * only this.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "castor.h"
#include "common.h"
#include "json.h"
#include "progress.h"
#include "train.h"

static double samples_per_epoch_total(const train_run *r)
{
    /* Counted step by step by the progress callback; the steps times the
     * batch if the callback saw nothing. */
    if (r->progress.samples > 0)
        return r->progress.samples;
    return (double)(castor_model_step(r->model) - r->step0) * (double)r->o.batch;
}

static int report_json(const train_run *r)
{
    double samples = samples_per_epoch_total(r);
    int64_t steps = castor_model_step(r->model) - r->step0;
    cJSON *o = cJSON_CreateObject();
    int oom = !o || cli_json_str(o, "version", castor_version()) ||
        cli_json_num(o, "test_accuracy", r->test_m.accuracy) ||
        cli_json_num(o, "test_loss", r->test_m.loss) ||
        cli_json_num(o, "train_accuracy", r->train_m.accuracy) ||
        cli_json_num(o, "train_loss", r->train_m.loss) ||
        cli_json_int(o, "train_metric_samples", (int64_t)r->train_m.samples) ||
        cli_json_num(o, "val_accuracy", r->val_accuracy) ||
        cli_json_num(o, "val_loss", r->val_loss) ||
        cli_json_int(o, "epochs", r->o.epochs) || cli_json_int(o, "steps", steps) ||
        cli_json_int(o, "global_step", castor_model_step(r->model)) ||
        cli_json_num(o, "seconds", r->fit_seconds) ||
        cli_json_num(o, "checkpoint_seconds", r->ckpt_seconds) ||
        cli_json_num(o, "samples_per_second",
                     r->fit_seconds > 0 ? samples / r->fit_seconds : NAN) ||
        cli_json_str(o, "strategy", castor_strategy_kind_name(r->o.strategy)) ||
        cli_json_str(o, "devices", r->o.devices) || cli_json_int(o, "replicas", r->replicas) ||
        cli_json_int(o, "batch", r->o.batch) ||
        cli_json_int(o, "params", (int64_t)castor_model_num_params(r->model)) ||
        cli_json_str(o, "layers", r->layers_spec) ||
        cli_json_str(o, "optimizer", castor_optimizer_kind_name(r->o.optimizer)) ||
        cli_json_float(o, "learning_rate", r->lr) ||
        cli_json_str(o, "loss", r->o.loss == CASTOR_LOSS_MSE ? "mse" : "xent") ||
        cli_json_str(o, "data", r->data_dir) ||
        cli_json_int(o, "train_samples", (int64_t)castor_dataset_size(r->train)) ||
        cli_json_int(o, "validation_samples",
                     r->val ? (int64_t)castor_dataset_size(r->val) : 0) ||
        cli_json_int(o, "test_samples", (int64_t)castor_dataset_size(r->test)) ||
        cli_json_u64(o, "seed", r->o.seed) ||
        cli_json_str(o, "resumed_from", r->resumed_from[0] ? r->resumed_from : NULL) ||
        cli_json_str(o, "saved", r->saved ? r->o.save : NULL) ||
        cli_json_int(o, "checkpoints", r->checkpoints) ||
        cli_json_int(o, "device_peak_bytes",
                     (int64_t)castor_model_device_peak_bytes(r->model)) ||
        cli_json_str(o, "features", castor_build_features());
    return cli_json_emit(o, oom, NULL);
}

/* The summary's labels, in one column wide enough for the longest,
 * "checkpoints:". */
#define LABEL "%-12s"

static void print_metrics(const char *what, double loss, double acc)
{
    printf(LABEL " loss ", what);
    cli_print_loss(stdout, loss);
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
    printf(LABEL " %d -> %s, %zu parameters, %s\n", "model:",
           castor_model_input_features(r->model), r->layers_spec,
           castor_model_num_params(r->model), castor_optimizer_kind_name(r->o.optimizer));
    printf(LABEL " %zu training, %zu validation, %zu test samples from %s\n", "data:",
           castor_dataset_size(r->train), r->val ? castor_dataset_size(r->val) : 0,
           castor_dataset_size(r->test), r->data_dir);
    if (r->resumed_from[0])
        printf(LABEL " from %s at step %lld\n", "resumed:", r->resumed_from,
               (long long)r->step0);
    printf(LABEL " %d epoch%s, batch %d, %lld step%s in %.2f s (%.0f samples/s)\n", "training:",
           r->o.epochs, r->o.epochs == 1 ? "" : "s", r->o.batch, steps, steps == 1 ? "" : "s",
           r->fit_seconds, r->fit_seconds > 0 ? samples / r->fit_seconds : 0.0);
    if (r->fitted) {
        print_metrics("train:", r->train_m.loss, r->train_m.accuracy);
        /* A run resumed part-way through its last epoch saw only the rest. */
        size_t epoch = castor_dataset_size(r->train);
        if (r->train_m.samples < epoch)
            printf(LABEL " (over the last %zu of the epoch's %zu samples, trained by this run)\n",
                   "", r->train_m.samples, epoch);
    }
    if (r->val && r->fitted)
        print_metrics("val:", r->val_loss, r->val_accuracy);
    print_metrics("test:", r->test_m.loss, r->test_m.accuracy);
    printf(LABEL " %.1f MiB device memory at peak, per replica\n", "memory:",
           (double)castor_model_device_peak_bytes(r->model) / (1024.0 * 1024.0));
    if (r->checkpoints > 0)
        printf(LABEL " %d written in %.2f s, the newest %s\n", "checkpoints:", r->checkpoints,
               r->ckpt_seconds, r->last_ckpt);
    if (r->saved)
        printf(LABEL " %s\n", "saved:", r->o.save);
    return cli_flush_results(NULL);
}

int train_report(const train_run *r)
{
    return r->o.json ? report_json(r) : report_text(r);
}
