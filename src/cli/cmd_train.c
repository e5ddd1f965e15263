/*
 * castor train: load a data set, build and compile a model on a strategy,
 * fit it with a progress display, evaluate it on the test set and report.
 *
 * The work is split into phases over one train_run (train.h), each
 * returning an exit status (0 to go on):
 *
 *   parse_args -> make_strategy -> load_data -> make_model or resume
 *              -> prepare_outputs -> fit (progress + checkpoints) -> save
 *              -> evaluate  -> report
 *
 * This file holds the flow; the flags are in train_options.c, --resume in
 * train_resume.c, the checkpoints written while fitting, the stop on a
 * signal and on divergence in train_ckpt.c, and the report in train_report.c.
 */
#include <errno.h>
#include <math.h>
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
#include "progress.h"
#include "src/atomic_file.h"
#include "src/dataset.h"
#include "train.h"

void train_note(train_run *r, const char *fmt, ...)
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

/* ---- phase 2: the strategy (first: it checks --devices cheaply) -------------- */

/* Each replica needs at least one sample per step. */
int train_check_batch(const train_run *r)
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
    if ((!r->o.resume || r->o.batch_set) && (rc = train_check_batch(r)) != 0)
        return rc;
    /* The strategy and its replicas are in the library's own log line. */
    return 0;
}

/* ---- phase 3: the data ------------------------------------------------------------ */

static int load_data(train_run *r)
{
    r->data_dir = cli_data_dir(r->o.data);
    /* Both sets' files are there before the training set is read: a test
     * set found missing after it would cost its whole load. */
    char images[CLI_PATH_MAX], labels[CLI_PATH_MAX], err[CLI_PATH_MAX + 256];
    int rc = castor__mnist_dir_find(r->data_dir, "train", images, labels, sizeof images, err,
                                    sizeof err);
    const char *which = "training";
    if (rc == CASTOR_OK) {
        which = "test";
        rc = castor__mnist_dir_find(r->data_dir, "test", images, labels, sizeof images, err,
                                    sizeof err);
    }
    if (rc != CASTOR_OK) {
        cli_errorf("cannot load the %s data from %s: %s", which, r->data_dir, cli_why(err, rc));
        return CLI_EXIT_RUNTIME;
    }
    rc = castor_dataset_load_mnist_dir(&r->train, r->data_dir, "train");
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
    /* Features alone do not tell: 16x49 images or float pixels where
     * training had 28x28 unsigned bytes are other data. */
    cli_data_kind trained = cli_data_kind_of(r->train);
    if ((rc = cli_check_data_kind(r->test, "test", r->data_dir, &trained,
                                  "the training set has")) != 0)
        return rc;
    if ((rc = train_split_validation(r)) != 0)
        return rc;
    train_note(r, "data %s: %zu training, %zu test samples of %d features", r->data_dir,
               castor_dataset_size(r->train), castor_dataset_size(r->test),
               castor_dataset_features(r->train));
    return 0;
}

int train_split_validation(train_run *r)
{
    size_t n = castor_dataset_size(r->train);
    if (r->o.validation_split <= 0)
        return 0;
    if ((size_t)r->o.validation_split >= n) {
        cli_errorf("--validation-split %d leaves no training samples (the training set has %zu)",
                   r->o.validation_split, n);
        return CLI_EXIT_USAGE;
    }
    int rc = castor_dataset_split_tail(r->train, (size_t)r->o.validation_split, &r->val);
    if (rc != CASTOR_OK) {
        cli_errorf("--validation-split %d: %s", r->o.validation_split,
                   cli_why(castor_dataset_errmsg(r->train), rc));
        return cli_exit_for(rc);
    }
    train_note(r, "--validation-split %d: %zu training, %zu validation samples",
               r->o.validation_split, castor_dataset_size(r->train), castor_dataset_size(r->val));
    return 0;
}

/* ---- phase 4: a new model (from a checkpoint: train_resume.c) ------------------------ */

/* --loss mse: every data set gets one-hot targets, a unit per class. */
int train_mse_targets(train_run *r, const char *what)
{
    int units = castor_model_output_units(r->model);
    int rc;
    if ((rc = cli_one_hot_targets(&r->train, units, "training", r->data_dir, what)) != 0 ||
        (rc = cli_one_hot_targets(&r->val, units, "validation", r->data_dir, what)) != 0 ||
        (rc = cli_one_hot_targets(&r->test, units, "test", r->data_dir, what)) != 0)
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
    if (r->o.loss == CASTOR_LOSS_MSE && (rc = train_mse_targets(r, "--loss mse")) != 0)
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
    train_note(r, "model %d -> %s: %zu parameters; %s, learning rate %g, seed %llu",
         castor_model_input_features(r->model), r->layers_spec,
         castor_model_num_params(r->model), castor_optimizer_kind_name(r->o.optimizer),
         (double)r->lr, (unsigned long long)r->o.seed);
    return 0;
}

/* ---- phase 5: the data fits the model, and the results have somewhere to go, checked
 * before training ------------------------------------------------------------------------ */

/* The test set is used only after training: a mismatch found then would
 * cost the whole run. (--loss mse checked the classes making its targets.) */
static int check_data_fits(train_run *r)
{
    int features = castor_model_input_features(r->model);
    if (castor_dataset_features(r->test) != features) {
        cli_errorf("the test set in %s has %d features per sample, the model takes %d",
                   r->data_dir, castor_dataset_features(r->test), features);
        return CLI_EXIT_USAGE;
    }
    if (r->o.loss == CASTOR_LOSS_MSE)
        return 0;
    int units = castor_model_output_units(r->model);
    const char *why = "softmax cross-entropy needs a unit per class";
    const char *dir = r->data_dir, *spec = r->layers_spec;
    int rc;
    if ((rc = cli_check_labels(r->train, units, "training", dir, spec, why)) != 0 ||
        (rc = cli_check_labels(r->val, units, "validation", dir, spec, why)) != 0 ||
        (rc = cli_check_labels(r->test, units, "test", dir, spec, why)) != 0)
        return rc;
    return 0;
}


/* Checkpoints already in --checkpoint-dir that are not this run's past
 * would mix with its own: this run would overwrite some of them, prune the
 * rest by step as if they were its own, and a later --resume DIR would pick
 * whichever is newest. So a fresh run wants a directory without
 * checkpoints, and a resumed one none newer than where it resumes. */
static int check_checkpoint_dir(train_run *r)
{
    const char *dir = r->o.checkpoint_dir;
    char newest[CLI_PATH_MAX], err[CLI_PATH_MAX + 256];
    int64_t newest_step = -1;
    int found = cli_ckpt_newest(dir, newest, sizeof newest, &newest_step, err, sizeof err);
    if (found < 0) {
        cli_errorf("--checkpoint-dir %s", err);
        return CLI_EXIT_RUNTIME;
    }
    if (found && !r->o.resume) {
        cli_errorf("--checkpoint-dir %s already holds checkpoints (the newest is %s): continue "
                   "them by adding --resume %s, or give an empty or new directory",
                   dir, newest, dir);
        return CLI_EXIT_USAGE;
    }
    int64_t from = castor_model_step(r->model);
    if (found && newest_step > from) {
        cli_errorf("--checkpoint-dir %s holds %s, newer than the step %lld resumed from: this "
                   "run's checkpoints would mix with it; resume from the newest (--resume %s) or "
                   "write to another directory",
                   dir, newest, (long long)from, dir);
        return CLI_EXIT_USAGE;
    }
    /* Older ones must be this run's too: pruning would delete them. */
    if (found) {
        char other[CLI_PATH_MAX];
        int foreign = cli_ckpt_find_foreign(dir, &r->meta, other, sizeof other, err, sizeof err);
        if (foreign < 0) {
            cli_errorf("--checkpoint-dir %s", err);
            return CLI_EXIT_RUNTIME;
        }
        if (foreign == 2) {
            cli_errorf("--checkpoint-dir %s holds %s, which cannot be read as a checkpoint (%s): "
                       "this run would prune it as its own; move it out of %s, or give another "
                       "directory",
                       dir, other, cli_about_file(err, other), dir);
            return CLI_EXIT_USAGE;
        }
        if (foreign) {
            cli_errorf("--checkpoint-dir %s holds %s, from another run than %s (%s): this run "
                       "would prune it as its own; give another directory",
                       dir, other, r->resumed_from, err);
            return CLI_EXIT_USAGE;
        }
    }
    return 0;
}

/* --save FILE, where dest is the file written: FILE, or where the symbolic
 * link FILE leads (castor_model_save writes through it). */
static int check_save_path(const train_run *r, const char *dest)
{
    /* Its directory must exist and the name of its temporary file fit:
     * found out now, not after the training. */
    char dir[CLI_PATH_MAX];
    int room = (int)(sizeof dir - CASTOR__ATOMIC_TMP_SUFFIX_LEN);
    if (snprintf(dir, sizeof dir, "%s", dest) >= room) {
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
    if (stat(dest, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            cli_errorf("--save %s: is a directory (give a file name)", r->o.save);
            return CLI_EXIT_USAGE;
        }
        /* The library replaces only regular files (a device or a FIFO is
         * refused when saving): refused now, not after the training. */
        if (!S_ISREG(st.st_mode)) {
            cli_errorf("--save %s: exists and is not a regular file", r->o.save);
            return CLI_EXIT_USAGE;
        }
    } else if (errno == ENAMETOOLONG) {
        /* A name longer than the filesystem takes (NAME_MAX) would fail
         * only at the rename, the trained model lost with it. */
        cli_errorf("--save %s: %s", r->o.save, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            cli_errorf("--save %s: the directory %s does not exist", r->o.save, dir);
        else
            cli_errorf("--save %s: the directory %s: %s", r->o.save, dir, strerror(errno));
        return CLI_EXIT_RUNTIME;
    }
    if (!S_ISDIR(st.st_mode)) {
        cli_errorf("--save %s: %s is not a directory", r->o.save, dir);
        return CLI_EXIT_RUNTIME;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        cli_errorf("--save %s: cannot write in %s: %s", r->o.save, dir, strerror(errno));
        return CLI_EXIT_RUNTIME;
    }
    return 0;
}

static int prepare_outputs(train_run *r)
{
    int rc = check_data_fits(r);
    if (rc)
        return rc;
    char err[CLI_PATH_MAX + 256];
    /* --checkpoint-dir first: made here, it may be where --save goes. */
    if (r->o.checkpoint_dir) {
        /* Before any directory is made for it; its temporary files' names
         * too, or the first checkpoint fails an epoch into the run. */
        char probe[CLI_PATH_MAX];
        size_t room = sizeof probe - CASTOR__ATOMIC_TMP_SUFFIX_LEN;
        if (cli_ckpt_path(probe, room, r->o.checkpoint_dir, 0) != 0) {
            cli_errorf("--checkpoint-dir %s: path too long", r->o.checkpoint_dir);
            return CLI_EXIT_USAGE;
        }
        if (cli_mkdir_p(r->o.checkpoint_dir, r->ckpt_dir_made, sizeof r->ckpt_dir_made, err,
                        sizeof err) != 0) {
            cli_errorf("--checkpoint-dir %s", err);
            return CLI_EXIT_RUNTIME;
        }
        /* As for --save: found out now, not at the first checkpoint, an
         * epoch of training later. */
        if (access(r->o.checkpoint_dir, W_OK | X_OK) != 0) {
            cli_errorf("--checkpoint-dir %s: cannot write in it: %s", r->o.checkpoint_dir,
                       strerror(errno));
            return CLI_EXIT_RUNTIME;
        }
        /* Before looking at what it holds: a run starting beside us sees
         * the same empty directory. */
        int free_dir = cli_ckpt_lock(r->o.checkpoint_dir, &r->ckpt_dir_lock, err, sizeof err);
        if (free_dir < 0) {
            cli_errorf("--checkpoint-dir %s", err);
            return CLI_EXIT_RUNTIME;
        }
        if (!free_dir) {
            /* Made by us perhaps, but the other run works in it now. */
            r->ckpt_dir_made[0] = '\0';
            cli_errorf("--checkpoint-dir %s is in use by another castor train, whose checkpoints "
                       "this run would overwrite and prune: give another directory, or resume "
                       "there once that run has ended",
                       r->o.checkpoint_dir);
            return CLI_EXIT_RUNTIME;
        }
        if ((rc = check_checkpoint_dir(r)) != 0)
            return rc;
    }
    if (r->o.save) {
        /* The library writes a symbolic link's target, in its directory. */
        char *dest = castor__atomic_target(r->o.save, &rc, err, sizeof err);
        if (!dest) {
            cli_errorf("--save %s", err);
            return CLI_EXIT_RUNTIME;
        }
        rc = check_save_path(r, dest);
        free(dest);
        if (rc)
            return rc;
    }
    if (r->o.checkpoint_dir) {
        /* Ours now, and this run's past: what a killed write left is
         * garbage the size of a checkpoint, and would pile up. */
        int stale = cli_ckpt_remove_stale(r->o.checkpoint_dir, err, sizeof err);
        if (stale < 0)
            fprintf(stderr, "castor: warning: %s\n", err);
        else if (stale > 0)
            train_note(r, "removed %d temporary file%s of checkpoint writes cut short from %s",
                       stale, stale == 1 ? "" : "s", r->o.checkpoint_dir);
    }
    return 0;
}

/* ---- phase 6: training --------------------------------------------------------------- */

static int save(train_run *r);

/* A checkpoint could not be written: the run fails. Where training was over
 * all the same, --save, perhaps on another disk, still keeps the model. */
static int checkpoint_failed(train_run *r)
{
    if (r->diverged_step >= 0)  /* no checkpoint of a diverged model, nor --save */
        return train_report_diverged(r);
    char kept[CLI_PATH_MAX + 96];
    train_newest_kept(r, kept, sizeof kept);
    cli_errorf("%s%s", r->ckpt_error, kept);
    if (r->o.save && castor_model_epoch(r->model) >= r->o.epochs && save(r) == 0)
        fprintf(stderr, "castor: the trained model is saved in %s\n", r->o.save);
    return CLI_EXIT_RUNTIME;
}

/* The library's stop check: a signal stops fit before its next step and
 * the test evaluation before its next batch (a long one ran to its end and
 * was then thrown away). */
static int stop_check(void *user)
{
    (void)user;
    return train_stop_signal();
}

static int fit(train_run *r)
{
    if (train_stop_signal())
        return train_report_interrupt(r);
    castor_model_set_stop_check(r->model, stop_check, NULL);
    r->step0 = castor_model_step(r->model);
    r->epoch0 = castor_model_epoch(r->model);
    /* --epochs is the run's total; an epoch in progress counts as one. */
    int64_t left = (int64_t)r->o.epochs - r->epoch0;
    if (left <= 0) {
        if (!r->o.quiet)
            fprintf(stderr, "castor: %s has done %lld epoch%s of --epochs %d%s: nothing left to "
                            "train; evaluating\n",
                    r->resumed_from, (long long)r->epoch0, r->epoch0 == 1 ? "" : "s",
                    r->o.epochs, r->epochs_from_file ? " (its run's)" : "");
        r->train_m.loss = r->train_m.accuracy = NAN;
        return 0;
    }
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = (int)left;
    fo.batch_size = r->o.batch;
    fo.shuffle = 1;
    fo.validation = r->val;
    fo.progress = train_on_progress;
    fo.progress_user = r;

    cli_progress_init(&r->progress, r->progress_mode, r->o.batch,
                      castor_dataset_size(r->train), r->step0);
    r->progress.validation = r->val != NULL;
    double t0 = cli_now();
    int rc = castor_model_fit(r->model, r->train, &fo, &r->train_m);
    r->fit_seconds = cli_now() - t0 - r->ckpt_seconds;  /* the writes so far: fit's */
    r->fitted = 1;
    cli_progress_finish(&r->progress);

    if (r->diverged_step >= 0 || r->ckpt_error[0])
        return checkpoint_failed(r);
    if (rc == CASTOR_INTERRUPTED && train_stop_signal()) {
        if (castor_model_epoch(r->model) < r->o.epochs)
            return train_report_interrupt(r);
        /* A signal in the last step, or in its epoch's validation (which
         * runs whole), stopped nothing: training is done, and ends as after
         * a signal that comes later: the last checkpoint and --save are
         * written, the test evaluation is not (evaluate()). The trained
         * model was dropped ("progress lost" where --save alone was set). */
        rc = CASTOR_OK;
    }
    if (rc != CASTOR_OK) {
        cli_errorf("training failed: %s", cli_why(castor_model_errmsg(r->model), rc));
        return cli_exit_for(rc);
    }
    /* The last step's update may have diverged though its loss had not: no
     * --save nor checkpoint of it then, and no evaluation. */
    char err[CLI_PATH_MAX + 256];
    int finite = train_model_finite(r, err, sizeof err);
    if (finite < 0) {
        cli_errorf("training failed: %s", err);
        return CLI_EXIT_RUNTIME;
    }
    if (!finite)
        return train_report_diverged(r);
    /* The newest checkpoint is the trained model, whatever the period (and
     * a signal since the last step stops the run after it and --save, before
     * the test evaluation: evaluate()). */
    if (r->o.checkpoint_dir && r->last_ckpt_step != castor_model_step(r->model) &&
        train_write_checkpoint(r) != 0)
        return checkpoint_failed(r);
    return 0;
}

static int save(train_run *r)
{
    if (!r->o.save)
        return 0;
    int rc = train_save_whole(r->model, r->o.save);
    if (rc == CASTOR_NOT_DURABLE) {
        /* The model is in place and whole: saved, and said so (it was "not
         * saved anywhere"), with the doubt about a crash; status 1 at the
         * end, as the disk failed a write. */
        cli_errorf("--save %s: %s", r->o.save,
                   cli_why(cli_about_file(castor_model_errmsg(r->model), r->o.save), rc));
        r->saved = r->save_unsynced = 1;
        return 0;
    }
    if (rc != CASTOR_OK) {
        cli_errorf("--save %s: %s", r->o.save,
                   cli_why(cli_about_file(castor_model_errmsg(r->model), r->o.save), rc));
        r->save_failed = 1;
        return CLI_EXIT_RUNTIME;
    }
    r->saved = 1;
    train_note(r, "saved %s", r->o.save);
    return 0;
}

/* ---- phase 7: evaluation (the report: train_report.c) -------------------------------- */

static int evaluate(train_run *r)
{
    if (train_stop_signal()) /* arrived since the last step: stop before evaluating */
        return train_report_interrupt(r);
    r->evaluating = 1;
    int rc = castor_model_evaluate(r->model, r->test, r->o.batch, &r->test_m);
    if (rc == CASTOR_INTERRUPTED && train_stop_signal())
        return train_report_interrupt(r);
    if (rc != CASTOR_OK) {
        cli_errorf("evaluation on the test set failed: %s",
                   cli_why(castor_model_errmsg(r->model), rc));
        return cli_exit_for(rc);
    }
    /* A signal after the last batch's check stops nothing: the results are
     * whole, and printed (they were thrown away, the run said interrupted);
     * the run's status says it came (castor_cli_train). */
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
    if (r->ckpt_dir_lock >= 0)
        close(r->ckpt_dir_lock);
}

int castor_cli_train(int argc, char **argv)
{
    train_run run;
    memset(&run, 0, sizeof run);
    run.val_loss = NAN;
    run.val_accuracy = NAN;
    run.last_ckpt_step = -1;
    run.diverged_step = -1;
    run.ckpt_dir_lock = -1;

    int rc = train_parse_args(&run.o, argc, argv);
    if (rc >= 0)
        return rc;
    run.progress_mode = cli_progress_pick_mode(run.o.quiet);
    cli_progress_init(&run.progress, CLI_PROGRESS_NONE, run.o.batch, 0, 0);
    int blas = cli_blas_threads(run.o.devices);
    if (blas > 0)
        train_note(&run, "OpenBLAS: %d thread%s per GEMM", blas, blas == 1 ? "" : "s");
    train_install_stop_handlers(!run.o.quiet, run.progress_mode == CLI_PROGRESS_BAR);

    if ((rc = make_strategy(&run)) == 0 && (rc = load_data(&run)) == 0 &&
        (rc = run.o.resume ? train_resume(&run) : make_model(&run)) == 0 &&
        (rc = prepare_outputs(&run)) == 0 && (rc = fit(&run)) == 0) {
        /* A failed --save (a full disk) loses the model, not the run's
         * results: they were thrown away with it. The test evaluation and
         * the report still come, then where the model is, and status 1. */
        int save_rc = save(&run);
        if ((rc = evaluate(&run)) == 0)
            rc = train_report(&run);
        /* A signal after the evaluation's last batch (below) does not
         * outrank this: the model is lost, which status 1 says. */
        if (save_rc && rc == 0) {
            int64_t step = castor_model_step(run.model);
            if (run.last_ckpt_step == step)
                fprintf(stderr, "castor: --save failed (above); the trained model is in the "
                                "checkpoint %s\n", run.last_ckpt);
            else if (run.resumed_from[0] && step == run.step0)  /* nothing left to train */
                fprintf(stderr, "castor: --save failed (above); the model is the one resumed "
                                "from, %s\n", run.resumed_from);
            else
                fprintf(stderr, "castor: --save failed (above); the trained model was not "
                                "saved anywhere\n");
            rc = save_rc;
        }
        /* As a --save that failed, the status says the disk failed a write
         * (the results are printed, and the file is there). */
        if (rc == 0 && run.save_unsynced)
            rc = CLI_EXIT_RUNTIME;
    }
    /* A signal after the test evaluation's last stop check (any time in a
     * one-batch evaluation) stopped nothing: the results are whole and
     * printed, and the status still says a signal came, so that a
     * scheduler's SIGTERM does not read as a run that ended by itself. */
    if (rc == 0 && train_stop_signal()) {
        fprintf(stderr, "castor: interrupted after the test evaluation's last batch; the "
                        "results are whole\n");
        rc = 128 + train_stop_signal();
    }
    /* A run that failed or was stopped before its first checkpoint leaves
     * no empty --checkpoint-dir of its own making behind. */
    if (rc != 0 && run.o.checkpoint_dir)
        cli_rmdir_made(run.o.checkpoint_dir, run.ckpt_dir_made);

    train_run_free(&run);
    return rc;
}
