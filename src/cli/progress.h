/*
 * Training progress on stderr.
 *
 *   BAR    stderr is a terminal: one line redrawn with '\r' (epoch, bar,
 *          step/steps, loss, acc, samples/s, ETA), left behind at the end of
 *          every epoch as that epoch's summary line;
 *   LINES  stderr is a file or a pipe: one plain line per epoch,
 *          "epoch 3/10  loss 0.3123  acc 0.8871  val_loss ...  4.1s";
 *   NONE   --quiet: nothing is printed, but samples are still counted.
 */
#ifndef CASTOR_CLI_PROGRESS_H
#define CASTOR_CLI_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "castor.h"

typedef enum cli_progress_mode {
    CLI_PROGRESS_NONE = 0,
    CLI_PROGRESS_LINES = 1,
    CLI_PROGRESS_BAR = 2
} cli_progress_mode;

typedef struct cli_progress {
    cli_progress_mode mode;
    FILE *out;
    int batch;             /* global batch size */
    size_t train_samples;  /* samples per epoch */
    int64_t step0;         /* the model's step count when fit started */
    int64_t last_global;   /* global_step at the last call */
    double samples;        /* training samples processed in this fit */
    double t0;             /* cli_now() when fit started */
    double last_draw;      /* seconds since t0 at the last redraw */
    double epoch_mark;     /* seconds since t0 at the end of the last epoch */
    int bar_visible;       /* a partial line is on the terminal */
    int validation;        /* fit has validation data: its loss is shown, NaN too */
} cli_progress;

/* A loss as "%.4f", or "nan" however the C library spells a NaN's sign. */
void cli_print_loss(FILE *out, double loss);

/* The mode for stderr: BAR on a terminal, LINES otherwise, NONE if quiet. */
cli_progress_mode cli_progress_pick_mode(int quiet);

void cli_progress_init(cli_progress *pr, cli_progress_mode mode, int batch,
                       size_t train_samples, int64_t step0);
/* Account for and show one call of the fit progress callback. Times are
 * taken from our own clock, started by cli_progress_init. */
void cli_progress_update(cli_progress *pr, const castor_progress *p);
/* Erase a partially drawn bar (before printing something else on stderr). */
void cli_progress_clear(cli_progress *pr);
/* End the bar's line if one is partly drawn (after an interruption). */
void cli_progress_finish(cli_progress *pr);

#endif
