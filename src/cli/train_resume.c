/*
 * castor train --resume: rebuild the model from a checkpoint on this
 * command line's strategy and devices. The file decides the layers, the
 * loss, the optimizer and its hyper-parameters and the seed, so flags that
 * disagree with it are refused rather than silently ignored.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "castor.h"
#include "args.h"
#include "ckpt.h"
#include "common.h"
#include "train.h"

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
        char want[CLI_LAYERS_MAX];
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
    /* As for a fresh run (train_options.c), with the file's optimizer; unless
     * --optimizer names another, which is then the flag to blame (below). */
    int other_optimizer = r->o.optimizer_set &&
                          strcmp(m->optimizer, castor_optimizer_kind_name(r->o.optimizer)) != 0;
    if (!other_optimizer && strcmp(m->optimizer, "sgd") != 0 &&
        (r->o.momentum_set || r->o.nesterov)) {
        cli_errorf("--%s applies to --optimizer sgd only, and the checkpoint %s is %s",
                   r->o.momentum_set ? "momentum" : "nesterov", f, m->optimizer);
        return CLI_EXIT_USAGE;
    }
    if (!other_optimizer && strcmp(m->optimizer, "adamw") != 0 && r->o.weight_decay_set) {
        cli_errorf("--weight-decay applies to --optimizer adamw only, and the checkpoint %s is %s",
                   f, m->optimizer);
        return CLI_EXIT_USAGE;
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

/* A checkpoint of a diverged model loads (eval and predict read it), and
 * fit refuses it: say so in --resume's words, before anything is set up. */
static int check_finite(train_run *r, const char *path)
{
    int finite = 0;
    int rc = castor_model_all_finite(r->model, &finite);
    if (rc != CASTOR_OK) {
        cli_errorf("--resume %s: %s", path, cli_why(castor_model_errmsg(r->model), rc));
        return cli_exit_for(rc);
    }
    if (finite)
        return 0;
    cli_errorf("--resume %s: its variables or optimizer state are not finite (NaN or inf): the "
               "run that wrote it diverged, and training cannot go on from it; resume from an "
               "earlier checkpoint (eval and predict read this one)",
               path);
    return CLI_EXIT_RUNTIME;
}

int train_resume(train_run *r)
{
    const char *from = r->o.resume;
    char err[CLI_PATH_MAX + 256];
    struct stat st;
    if (stat(from, &st) != 0) {
        cli_errorf("--resume %s: %s", from, strerror(errno));
        return CLI_EXIT_RUNTIME;
    }
    int64_t newest_step = -1;
    if (S_ISDIR(st.st_mode)) {
        int found = cli_ckpt_newest(from, r->resumed_from, sizeof r->resumed_from, &newest_step,
                                    err, sizeof err);
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
        return CLI_EXIT_USAGE;
    }
    const char *path = r->resumed_from;

    int rc = castor_model_open(&r->model, path, r->strategy);
    if (rc != CASTOR_OK) {
        /* A damaged newest checkpoint is a dead end for --resume DIR, and
         * --resume of an older one into DIR is refused while it is there:
         * say what to do. */
        char before[CLI_PATH_MAX], hint[CLI_PATH_MAX + 128] = "";
        if ((rc == CASTOR_FORMAT || rc == CASTOR_IO) && newest_step > 0 &&
            cli_ckpt_newest_before(from, newest_step, before, sizeof before, NULL, err,
                                   sizeof err) == 1)
            snprintf(hint, sizeof hint, " (to resume from the checkpoint before it, %s, move "
                     "this one out of %s)", before, from);
        cli_errorf("--resume %s: %s%s", path,
                   cli_why(cli_about_file(castor_model_errmsg(r->model), path), rc), hint);
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
    /* Other features first: the most basic difference, and the one to name
     * (a mid-epoch file on other data spoke of its sample count, after a
     * --validation-split inferred from it). */
    int features = castor_model_input_features(r->model);
    if (features != castor_dataset_features(r->train)) {
        cli_errorf("--resume %s: the model takes %d features per sample but the data in %s has "
                   "%d",
                   path, features, r->data_dir, castor_dataset_features(r->train));
        return CLI_EXIT_USAGE;
    }
    /* The same features in another shape, or scaled otherwise, are other
     * data than the file was trained on. */
    cli_data_kind trained = {r->meta.input_type, r->meta.input_rank, {0, 0, 0}};
    memcpy(trained.dims, r->meta.input_dims, sizeof trained.dims);
    char has[CLI_PATH_MAX + 32];
    snprintf(has, sizeof has, "--resume %s was trained on", path);
    if ((rc = cli_check_data_kind(r->train, "training", r->data_dir, &trained, has)) != 0)
        return rc;
    size_t samples = castor_dataset_size(r->train);
    /* The file's epochs were over epoch_samples training samples: on the
     * same --data, a run started with --validation-split held the rest
     * back, and left out here that split would fold the held-out samples
     * into training. */
    int64_t had = r->meta.epoch_samples;
    if (!r->o.validation_split_set && had > 0 && (uint64_t)had < samples &&
        samples - (uint64_t)had <= INT_MAX) {
        r->o.validation_split = (int)(samples - (uint64_t)had);
        if (!r->o.quiet)
            fprintf(stderr, "castor: --validation-split %d, as %s trained on %lld of the %zu "
                            "training samples\n",
                    r->o.validation_split, path, (long long)had, samples);
        if ((rc = train_split_validation(r)) != 0)
            return rc;
        samples = castor_dataset_size(r->train);
    }
    /* Without --epochs, the run goes on to the end it was given (it trained
     * to the default 10, past a run of 3 or short of one of 50). */
    if (!r->o.epochs_set && r->meta.target_epochs > 0 &&
        r->meta.target_epochs <= CLI_EPOCHS_MAX) {
        r->o.epochs = (int)r->meta.target_epochs;
        r->epochs_from_file = 1;
        train_note(r, "--epochs %d, as the run that wrote %s was given", r->o.epochs, path);
    } else if (!r->o.epochs_set && !r->o.quiet) {
        char why[112] = "it does not say how many its run was to train (an older castor, or "
                        "a model never trained, wrote it)";
        if (r->meta.target_epochs > 0)
            snprintf(why, sizeof why, "its run was to train %lld, more than --epochs takes",
                     (long long)r->meta.target_epochs);
        fprintf(stderr, "castor: warning: --resume %s: %s; training to --epochs %d, the "
                        "default\n", path, why, r->o.epochs);
    }
    int trains = castor_model_epoch(r->model) < r->o.epochs;
    if (r->meta.step_in_epoch > 0 && r->meta.epoch_samples > 0 &&
        (uint64_t)r->meta.epoch_samples != samples) {
        char split[64] = "";
        if (r->o.validation_split > 0)
            snprintf(split, sizeof split, " (after --validation-split %d)",
                     r->o.validation_split);
        cli_errorf("--resume %s is %lld steps into an epoch over %lld training samples, but the "
                   "training data here has %zu%s: finish that epoch on the same data (the same "
                   "--data and --validation-split)",
                   path, (long long)r->meta.step_in_epoch, (long long)r->meta.epoch_samples,
                   samples, split);
        return CLI_EXIT_USAGE;
    }
    /* fit refused it ("finish it unshuffled"), which no flag of castor
     * train can do. */
    if (trains && r->meta.step_in_epoch > 0 && r->meta.epoch_shuffle == 0) {
        cli_errorf("--resume %s is %lld steps into an epoch that a program started unshuffled; "
                   "castor train always shuffles, so it cannot finish that epoch: finish it "
                   "with the library (castor_model_fit, shuffle 0), or resume from a "
                   "checkpoint at an epoch's end",
                   path, (long long)r->meta.step_in_epoch);
        return CLI_EXIT_USAGE;
    }

    if (trains && (rc = check_finite(r, path)) != 0)
        return rc;

    /* What the file decides is what the run reports. */
    r->o.loss = strcmp(r->meta.loss, "mse") == 0 ? CASTOR_LOSS_MSE : CASTOR_LOSS_SOFTMAX_XENT;
    if (castor_optimizer_kind_parse(r->meta.optimizer, &r->o.optimizer) != CASTOR_OK)
        r->o.optimizer = CASTOR_OPT_ADAM;
    r->lr = (float)r->meta.learning_rate;
    r->o.seed = r->meta.seed;
    if (!r->o.batch_set && r->meta.epoch_batch > 0)
        r->o.batch = r->meta.epoch_batch;
    if ((rc = train_check_batch(r)) != 0)
        return rc;
    if (r->o.loss == CASTOR_LOSS_MSE && (rc = train_mse_targets(r, path)) != 0)
        return rc;

    /* Nothing to train (fit says so), or refused above: no warning of how
     * it would go on. */
    if (trains && r->meta.step_in_epoch == 0 && had > 0 && (uint64_t)had != samples)
        fprintf(stderr, "castor: warning: %s trained its epochs on %lld samples; this run trains "
                        "on %zu\n",
                path, (long long)had, samples);
    if (trains && !r->o.quiet && r->meta.strategy[0] &&
        (strcmp(r->meta.strategy, castor_strategy_kind_name(r->o.strategy)) != 0 ||
         (r->meta.replicas > 0 && r->meta.replicas != r->replicas)))
        fprintf(stderr,
                "castor: warning: %s was written by the %s strategy on %d replica%s; going on "
                "with %s on %d, training continues but not bit for bit as it would have\n",
                path, r->meta.strategy, r->meta.replicas, r->meta.replicas == 1 ? "" : "s",
                castor_strategy_kind_name(r->o.strategy), r->replicas);
    /* OpenBLAS splits a GEMM's sums by thread: another count, another
     * rounding (as another strategy or replica count above). */
    int blas = cli_blas_threads_in_use(r->o.devices);
    if (trains && !r->o.quiet && r->meta.blas_threads > 0 && blas > 0 &&
        blas != r->meta.blas_threads)
        fprintf(stderr,
                "castor: warning: %s was trained with %d OpenBLAS thread%s per GEMM; going on "
                "with %d, training continues but not bit for bit as it would have "
                "(OPENBLAS_NUM_THREADS=%d gives the file's)\n",
                path, r->meta.blas_threads, r->meta.blas_threads == 1 ? "" : "s", blas,
                r->meta.blas_threads);
    train_note(r, "resumed from %s: step %lld, epoch %lld + %lld steps; %d -> %s, %s, "
            "learning rate %g, seed %llu",
         path, (long long)castor_model_step(r->model), (long long)castor_model_epoch(r->model),
         (long long)castor_model_step_in_epoch(r->model), features, r->layers_spec,
         r->meta.optimizer, (double)r->lr, (unsigned long long)r->o.seed);
    return 0;
}
