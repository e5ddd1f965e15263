/*
 * What a training run keeps on disk while it trains: a checkpoint every
 * --checkpoint-every steps or epochs, written from the progress callback,
 * and one more when SIGINT, SIGTERM or SIGHUP stops the run after a step
 * was trained, so that an interrupted run loses nothing it could have kept.
 * The names and the pruning of the files are ckpt.c's; this file decides
 * when to write and what to say.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "castor.h"
#include "common.h"
#include "train.h"

/* ---- signals: stop after the current step --------------------------------- */

/* Lock-free atomics: the handler may run on any thread of the process (its
 * OpenBLAS and CUDA threads too), and they are safe to use in one. */
static atomic_int g_stop_signal = 0;
/* A model file is being written (or the run is stopping and writes its last
 * one): a second signal then waits for the file to be whole, instead of
 * leaving its temporary file behind. A flag the handler reads, not a signal
 * mask, since any thread may take the signal. */
static atomic_int g_writing = 0, g_insisted = 0;

static void die_by(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

/* Whether the first signal is acknowledged on stderr (not with --quiet),
 * and whether that line must first clear a progress bar drawn with '\r'.
 * Set before the handlers are installed, read only by them. */
static volatile sig_atomic_t g_announce = 0, g_clear_bar = 0;

/* Append the string s to buf at *at, within size: async-signal-safe, no libc. */
static void put(char *buf, size_t size, size_t *at, const char *s)
{
    while (*s && *at < size)
        buf[(*at)++] = *s++;
}

/* One line at once: stopping waits for the current step (a slow one, or a
 * long validation, takes seconds), and a silent terminal made users press
 * Ctrl-C again, which quits without the checkpoint they were waiting for.
 * write(2) alone, as a signal handler may; errno is the interrupted code's. */
static void announce(int sig)
{
    int saved_errno = errno;
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
    char line[256];
    size_t n = 0;
    if (g_clear_bar)
        put(line, sizeof line, &n, "\r\033[K");
    put(line, sizeof line, &n, "castor: ");
    put(line, sizeof line, &n, name);
    put(line, sizeof line, &n, ": stopping as soon as it safely can; ");
    put(line, sizeof line, &n, sig == SIGINT ? "Ctrl-C again" : "another signal");
    put(line, sizeof line, &n, " quits at once, writing nothing more\n");
    for (size_t done = 0; done < n;) {
        ssize_t w = write(STDERR_FILENO, line + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    errno = saved_errno;
}

static void on_stop_signal(int sig)
{
    /* One handler may run on two threads at once (two signals, two threads
     * taking them): the exchange makes exactly one of them the first. */
    int none = 0;
    if (!atomic_compare_exchange_strong(&g_stop_signal, &none, sig)) {
        /* A second one: the user insists; die the default way now, or as
         * soon as the file being written is complete. Noted before looking
         * at g_writing, so that a writer finishing at this moment sees it. */
        g_insisted = sig;
        if (!g_writing)
            die_by(sig);
        return;
    }
    if (g_announce)
        announce(sig);
}

int train_save_whole(castor_model *m, const char *path)
{
    int was_writing = g_writing;
    g_writing = 1;
    int rc = castor_model_save(m, path);
    g_writing = was_writing;
    if (g_insisted && !g_writing)
        die_by(g_insisted);
    return rc;
}

void train_install_stop_handlers(int announce_first, int progress_bar)
{
    /* A log pipe whose reader is gone (2>&1 | tee log, tee ended by the same
     * Ctrl-C) would kill us at the next progress line, before the checkpoint
     * that keeps the run; ignored, the line is lost (EPIPE) and the run goes
     * on. A closed stdout still fails the run when the results are printed.
     * Before the stop handlers, whose acknowledgement may meet such a pipe. */
    signal(SIGPIPE, SIG_IGN);
    g_announce = announce_first != 0;
    g_clear_bar = progress_bar != 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    /* SIGHUP too: the terminal or ssh session of a run that was not started
     * under nohup is gone, and its default action would drop every step
     * since the newest checkpoint. A signal that we were started with
     * ignored stays ignored: nohup ignores SIGHUP, and a shell without job
     * control ignores SIGINT for 'cmd &', so that the Ctrl-C meant for the
     * foreground does not reach the background run. */
    static const int stop_signal_list[] = {SIGINT, SIGTERM, SIGHUP};
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    for (size_t i = 0; i < sizeof stop_signal_list / sizeof stop_signal_list[0]; i++) {
        struct sigaction old;
        int sig = stop_signal_list[i];
        if (sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        sigaction(sig, &sa, NULL);
        sigaddset(&stop_signals, sig);
    }
    /* A blocked signal mask survives exec: a launcher (a CI runner, a job
     * system) may start us with SIGINT blocked, and then the handler would
     * never run. Threads made later inherit this mask. */
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, NULL);
}

int train_stop_signal(void)
{
    return g_stop_signal;
}

/* ---- divergence: no model that is not finite is written ---------------------------------- */

/* A NaN or infinite variable never becomes finite again, and a checkpoint of
 * one, pruning the older ones, would leave nothing to resume from. */
static void diverged(train_run *r, int64_t step, const char *why)
{
    if (r->diverged_step >= 0)
        return;
    r->diverged_step = step;
    snprintf(r->diverged_why, sizeof r->diverged_why, "%s", why);
}

int train_model_finite(train_run *r, char *err, size_t errlen)
{
    int finite = 0;
    int rc = castor_model_all_finite(r->model, &finite);
    if (rc != CASTOR_OK) {
        snprintf(err, errlen, "cannot read the model to check that it is finite: %s",
                 cli_why(castor_model_errmsg(r->model), rc));
        return -1;
    }
    if (!finite)
        diverged(r, castor_model_step(r->model),
                 "its variables or optimizer state are not finite");
    return finite;
}

int train_report_diverged(train_run *r)
{
    cli_progress_finish(&r->progress);
    char kept[CLI_PATH_MAX + 64] = "";
    if (r->checkpoints > 0)
        train_newest_kept(r, kept, sizeof kept);
    else if (r->resumed_from[0])
        snprintf(kept, sizeof kept, "; the run resumed from %s", r->resumed_from);
    const char *not_to = r->o.save && r->o.checkpoint_dir ? " (no --save, no checkpoint of it)"
                         : r->o.save                      ? " (no --save of it)"
                         : r->o.checkpoint_dir            ? " (no checkpoint of it)"
                                                          : "";
    /* --resume keeps the checkpoint's --lr: a lower one is a fresh run. */
    cli_errorf("training diverged at step %lld: %s (a fresh run with a lower --lr may help); "
               "stopped%s%s",
               (long long)r->diverged_step, r->diverged_why, not_to, kept);
    return CLI_EXIT_RUNTIME;
}

/* ---- checkpoints ----------------------------------------------------------------------- */

void train_newest_kept(const train_run *r, char *buf, size_t size)
{
    /* A failed write leaves the files before it as they were (atomic, and
     * pruning comes only after a write that succeeded): the newest of them
     * is where to resume, and the user should not have to look for it. */
    /* One in place but unsynced is newer, and may be gone after a crash. */
    const char *which = r->ckpt_unsynced ? "the checkpoint before it" : "the newest checkpoint";
    if (r->checkpoints > 0)
        snprintf(buf, size, "; %s is %s (step %lld)", which, r->last_ckpt,
                 (long long)r->last_ckpt_step);
    else if (r->resumed_from[0])
        snprintf(buf, size, "; %s is %s (step %lld), which this run resumed from", which,
                 r->resumed_from, (long long)r->meta.step);
    else
        snprintf(buf, size, "; there is no earlier checkpoint");
}

static int write_checkpoint(train_run *r)
{
    int64_t step = castor_model_step(r->model);
    char path[CLI_PATH_MAX], err[CLI_PATH_MAX + 256];
    if (cli_ckpt_path(path, sizeof path, r->o.checkpoint_dir, step) != 0) {
        snprintf(r->ckpt_error, sizeof r->ckpt_error, "--checkpoint-dir %s: path too long",
                 r->o.checkpoint_dir);
        return -1;
    }
    /* Only one written while fitting, with epochs to go, stops training
     * early; at the end or on a signal it has stopped already. */
    char stopped[64] = "";
    if (!r->fitted && castor_model_epoch(r->model) < r->o.epochs)
        snprintf(stopped, sizeof stopped, " (training stopped at step %lld)", (long long)step);
    /* A checkpoint of a diverged model would prune one to go back to. */
    char why[512];
    int finite = train_model_finite(r, why, sizeof why);
    if (finite < 0) {
        snprintf(r->ckpt_error, sizeof r->ckpt_error, "cannot write the checkpoint %s: %s%s",
                 path, why, stopped);
        return -1;
    }
    if (!finite) {
        snprintf(r->ckpt_error, sizeof r->ckpt_error, "no checkpoint written: training "
                 "diverged at step %lld (%s)", (long long)step, r->diverged_why);
        return -1;
    }
    int rc = train_save_whole(r->model, path);
    if (rc == CASTOR_NOT_DURABLE) {
        /* In place and whole, but a crash may take it: the disk has failed
         * a write, so the run stops as for a checkpoint not written, and
         * keeps the older ones (no pruning) to fall back on. */
        r->ckpt_unsynced = 1;
        snprintf(r->ckpt_error, sizeof r->ckpt_error, "checkpoint %s: %s%s", path,
                 cli_why(cli_about_file(castor_model_errmsg(r->model), path), rc), stopped);
        return -1;
    }
    if (rc != CASTOR_OK) {
        snprintf(r->ckpt_error, sizeof r->ckpt_error, "cannot write the checkpoint %s: %s%s",
                 path, cli_why(cli_about_file(castor_model_errmsg(r->model), path), rc),
                 stopped);
        return -1;
    }
    r->checkpoints++;
    r->last_ckpt_step = step;
    snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", path);
    train_note(r, "checkpoint %s", path);
    /* Only now that the new one is safely on disk may old ones go. A
     * failure to delete costs disk space, not progress: warn and go on. */
    if (cli_ckpt_prune(r->o.checkpoint_dir, r->o.keep, path, err, sizeof err) < 0) {
        cli_progress_clear(&r->progress);
        fprintf(stderr, "castor: warning: %s\n", err);
    }
    return 0;
}

int train_write_checkpoint(train_run *r)
{
    /* Disk time, not training time: kept apart from fit's seconds. */
    double t0 = cli_now();
    int rc = write_checkpoint(r);
    r->ckpt_seconds += cli_now() - t0;
    return rc;
}

int train_on_progress(void *user, const castor_progress *p)
{
    train_run *r = user;
    /* Show the epochs of the whole run: a resumed run goes on counting. */
    castor_progress shown = *p;
    shown.epoch = p->epoch + (int)r->epoch0;
    shown.epochs = r->o.epochs;
    cli_progress_update(&r->progress, &shown);
    /* The epoch's running mean: a step whose loss was not finite keeps it so. */
    if (!isfinite(p->loss)) {
        diverged(r, p->global_step, isnan(p->loss) ? "the training loss is nan"
                                                   : "the training loss is infinite");
        return 1;
    }
    if (p->epoch_end) {
        r->val_loss = p->val_loss;
        r->val_accuracy = p->val_accuracy;
    }
    if (r->o.checkpoint_dir && p->global_step != r->last_ckpt_step &&
        (r->o.checkpoint_every == CKPT_EVERY_EPOCH ? p->epoch_end
                                                   : p->global_step % r->o.checkpoint_every == 0) &&
        train_write_checkpoint(r) != 0)
        return 1; /* fit stops; fit() reports r->ckpt_error */
    return g_stop_signal != 0;
}

/* SIGINT/SIGTERM/SIGHUP: keep what was trained if there is a place for it, say
 * where, and exit 128 + the signal. */
int train_report_interrupt(train_run *r)
{
    int sig = g_stop_signal;
    /* Stopping already: a further signal changes nothing but must not cut
     * the last checkpoint short. */
    g_writing = 1;
    cli_progress_finish(&r->progress);
    /* Whether this run took a step: the library's stop check can end fit
     * before its first one (fitted is set then too). */
    int trained = r->model && r->fitted && castor_model_step(r->model) > r->step0;
    if (!trained && !r->saved) {
        /* Nothing trained yet: a checkpoint now would be the untrained
         * model (or the one resumed from), and would stand in the way of a
         * fresh run into the directory. */
        fprintf(stderr, "castor: interrupted %s; nothing to save\n",
                r->evaluating ? "during the test evaluation of a model this run did not train"
                              : "before training");
        return 128 + sig;
    }
    long long step = (long long)castor_model_step(r->model);
    /* In the test evaluation training is over: say so, not "after step";
     * after a failed --save too (before the evaluation began), and once
     * every epoch is done (a signal in the last step). */
    const char *when = r->evaluating ? "during the test evaluation, after training to step"
                       : r->save_failed || castor_model_epoch(r->model) >= r->o.epochs
                           ? "after training to step"
                           : "after step";
    if (r->saved) {  /* after training: --save holds it, whatever else happens */
        fprintf(stderr, "castor: interrupted %s %lld; the model is saved in %s%s%s%s\n", when,
                step, r->o.save, r->save_unsynced ? " (unsynced: see above)" : "",
                r->last_ckpt_step == step ? " and " : "",
                r->last_ckpt_step == step ? r->last_ckpt : "");
    } else if (!r->o.checkpoint_dir) {
        fprintf(stderr, "castor: interrupted %s %lld; %s\n", when, step,
                r->save_failed   ? "--save failed and no --checkpoint-dir: the trained model "
                                   "is lost"
                : !r->evaluating ? "no checkpoint directory set, progress lost"
                                 : "no --save or --checkpoint-dir: the trained model is lost");
    } else if (r->last_ckpt_step == step || train_write_checkpoint(r) == 0) {
        fprintf(stderr, "castor: interrupted %s %lld; checkpoint saved to %s\n", when, step,
                r->last_ckpt);
    } else {
        char kept[CLI_PATH_MAX + 96];
        train_newest_kept(r, kept, sizeof kept);
        fprintf(stderr, "castor: interrupted %s %lld; %s%s\n", when, step, r->ckpt_error, kept);
    }
    return 128 + sig;
}
