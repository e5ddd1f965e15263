/*
 * castor train, private to its files: the options a command line gives and
 * the state of one run, shared by the phases that fill it in.
 *
 *   train_options.c  the flag table, --help, parsing and the checks across flags
 *   cmd_train.c      the flow: strategy, data, model, outputs, fit, save, evaluate
 *   train_resume.c   --resume: the model and the settings from a checkpoint
 *   train_ckpt.c     checkpoints written while fitting, and stopping on a signal
 *   train_report.c   the summary on stdout, as text or one JSON line
 *
 * Each phase returns an exit status (0 to go on) and prints its own error.
 */
#ifndef CASTOR_CLI_TRAIN_H
#define CASTOR_CLI_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"
#include "ckpt.h"
#include "progress.h"

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
    int layers_set, loss_set, optimizer_set, seed_set, batch_set, validation_split_set;
    int epochs_set;
    const char *save, *checkpoint_dir, *resume;
    int checkpoint_every; /* steps; CKPT_EVERY_EPOCH: at every epoch's end */
    int every_set, keep, keep_set;
} train_opts;

enum { CKPT_EVERY_EPOCH = -1 };
/* --epochs: 1 to this; 10 when not given (a resumed run: the file's). */
enum { CLI_EPOCHS_MAX = 1000000, CLI_EPOCHS_DEFAULT = 10 };

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
    double fit_seconds;       /* fit's wall time less the checkpoint writes in it */
    double ckpt_seconds;      /* writing checkpoints (all of this run's) */
    castor_metrics train_m, test_m;
    double val_loss, val_accuracy; /* at the last epoch end; NaN without */
    char layers_spec[CLI_LAYERS_MAX];
    float lr;                 /* the learning rate in effect */
    /* --resume */
    char resumed_from[CLI_PATH_MAX]; /* "" for a fresh model */
    cli_ckpt_meta meta;
    int epochs_from_file;     /* o.epochs is the checkpoint's target_epochs */
    /* --checkpoint-dir */
    int checkpoints;          /* written by this run */
    int64_t last_ckpt_step;   /* -1: none yet */
    char last_ckpt[CLI_PATH_MAX];
    char ckpt_dir_made[CLI_PATH_MAX]; /* the topmost directory made for --checkpoint-dir */
    int ckpt_dir_lock;        /* --checkpoint-dir held (cli_ckpt_lock); -1: not */
    char ckpt_error[CLI_PATH_MAX + 1024]; /* a failed write, reported after fit stops */
    int ckpt_unsynced;        /* that write put its file in place, but not synced */
    int saved;                /* --save written */
    int save_unsynced;        /* and in place, but its directory's fsync failed */
    int save_failed;          /* --save could not be written: training is over */
    int evaluating;           /* in the test evaluation: training is over */
    /* Training diverged (a loss or a variable not finite) at this step; -1:
     * not. The run stops without writing that model anywhere. */
    int64_t diverged_step;
    char diverged_why[128];
} train_run;

/* ---- train_options.c ---- */

/* Fill *o from the command line; -1 to go on, else the exit status. */
int train_parse_args(train_opts *o, int argc, char **argv);

/* ---- cmd_train.c: pieces the resume shares with a fresh model ---- */

/* With --verbose: "castor: <message>" on stderr, clear of the progress bar. */
void train_note(train_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Each replica needs at least one sample per step. */
int train_check_batch(const train_run *r);
/* --loss mse: every data set gets one-hot targets, a unit per class. */
int train_mse_targets(train_run *r, const char *what);
/* The last o.validation_split samples of the training set become the
 * validation set (none when it is 0). */
int train_split_validation(train_run *r);

/* ---- train_resume.c ---- */

/* Open the model of --resume on r->strategy and take what the file decides. */
int train_resume(train_run *r);

/* ---- train_ckpt.c ---- */

/* SIGINT/SIGTERM/SIGHUP stop training after the current step, unless they
 * were ignored when castor started; SIGPIPE is ignored. With announce_first,
 * the first of them is acknowledged at once on stderr (one line, clearing
 * the progress bar first where progress_bar says one is drawn). */
void train_install_stop_handlers(int announce_first, int progress_bar);
/* The signal that asked to stop, or 0. */
int train_stop_signal(void);
/* castor_fit_options.progress: the display, val metrics, periodic checkpoints. */
int train_on_progress(void *user, const castor_progress *p);
/* Write DIR/ckpt-<step>.safetensors, then prune the old ones; 0 or -1 with
 * r->ckpt_error set. */
int train_write_checkpoint(train_run *r);
/* castor_model_save, with a second stop signal during the write held
 * back until the file is complete (it kills at once otherwise). */
int train_save_whole(castor_model *m, const char *path);
/* "; the newest checkpoint is PATH (step N)" (this run's, or the one it
 * resumed from), or "; there is no earlier checkpoint": what a failed
 * checkpoint write leaves to resume from, for the end of its message
 * ("the checkpoint before it" where the failed one is in place, unsynced). */
void train_newest_kept(const train_run *r, char *buf, size_t size);
/* Whether the model's variables and optimizer state are all finite: 1; 0
 * when not (the run is then marked diverged at the model's step); -1 when
 * they could not be read (err says why). */
int train_model_finite(train_run *r, char *err, size_t errlen);
/* Training diverged: say where it stopped and what is kept; exit status 1. */
int train_report_diverged(train_run *r);
/* After a stop signal: keep what was trained, say where; 128 + the signal. */
int train_report_interrupt(train_run *r);

/* ---- train_report.c ---- */

/* The summary on stdout: text, or with --json one JSON line. */
int train_report(const train_run *r);

#endif
