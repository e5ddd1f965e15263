/* Training progress on stderr: see progress.h. */
#include "progress.h"

#include "args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

cli_progress_mode cli_progress_pick_mode(int quiet)
{
    if (quiet)
        return CLI_PROGRESS_NONE;
    /* A terminal that declares it cannot move the cursor or clear a line
     * (TERM=dumb: Emacs's shell, some CI consoles) would show the bar's
     * escape codes as text: it gets the plain lines. */
    const char *term = getenv("TERM");
    if (term && strcmp(term, "dumb") == 0)
        return CLI_PROGRESS_LINES;
    return isatty(STDERR_FILENO) ? CLI_PROGRESS_BAR : CLI_PROGRESS_LINES;
}

void cli_progress_init(cli_progress *pr, cli_progress_mode mode, int batch,
                       size_t train_samples, int64_t step0)
{
    memset(pr, 0, sizeof *pr);
    pr->mode = mode;
    pr->out = stderr;
    pr->batch = batch;
    pr->train_samples = train_samples;
    pr->step0 = step0;
    pr->last_global = step0;
    pr->last_draw = -1.0;
    pr->t0 = cli_now();
}

static int terminal_columns(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

/* "1.2k", "45.3k", "1.10M" */
static void human_rate(char *buf, size_t size, double v)
{
    if (!(v >= 0.0) || !isfinite(v))
        snprintf(buf, size, "-");
    else if (v >= 1e6)
        snprintf(buf, size, "%.2fM", v / 1e6);
    else if (v >= 1e4)
        snprintf(buf, size, "%.1fk", v / 1e3);
    else
        snprintf(buf, size, "%.0f", v);
}

/* "0:42", "12:03", "1:02:03" */
static void human_duration(char *buf, size_t size, double s)
{
    if (!(s >= 0.0) || !isfinite(s) || s > 360000.0) {
        snprintf(buf, size, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, size, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(buf, size, "%ld:%02ld", t / 60, t % 60);
}

/* The samples that optimizer step `step` (1-based within the epoch) took. */
static double step_samples(const cli_progress *pr, int64_t step)
{
    double b = (double)pr->batch;
    if (pr->train_samples == 0 || step < 1)
        return b;
    double before = (double)(step - 1) * b;
    double left = (double)pr->train_samples - before;
    if (left <= 0.0)
        return b;
    return left < b ? left : b;
}

static void draw_bar(cli_progress *pr, const castor_progress *p, double now)
{
    int cols = terminal_columns();
    double done_steps = (double)(p->global_step - pr->step0);
    double per_step = done_steps > 0 ? now / done_steps : NAN;
    double left_steps = (double)(p->epochs - p->epoch - 1) * (double)p->steps_per_epoch +
                        (double)(p->steps_per_epoch - p->step_in_epoch);
    char rate[32], eta[32];
    human_rate(rate, sizeof rate, now > 0 ? pr->samples / now : NAN);
    human_duration(eta, sizeof eta, per_step * left_steps);

    char head[64], tail[160];
    snprintf(head, sizeof head, "epoch %d/%d ", p->epoch + 1, p->epochs);
    int w = 0;
    char total[24];
    int digits = snprintf(total, sizeof total, "%lld", (long long)p->steps_per_epoch);
    char loss[32];
    if (isnan(p->loss))
        snprintf(loss, sizeof loss, "nan");
    else
        snprintf(loss, sizeof loss, "%.4f", p->loss);
    w = snprintf(tail, sizeof tail, " %*lld/%s loss %s", digits, (long long)p->step_in_epoch,
                 total, loss);
    if (!isnan(p->accuracy) && w > 0 && (size_t)w < sizeof tail)
        w += snprintf(tail + w, sizeof tail - (size_t)w, " acc %.4f", p->accuracy);
    if (w > 0 && (size_t)w < sizeof tail)
        snprintf(tail + w, sizeof tail - (size_t)w, " %s samples/s ETA %s", rate, eta);

    /* The line must stay shorter than the terminal, or '\r' cannot redraw it. */
    int room = cols - 1 - (int)strlen(head) - (int)strlen(tail) - 2;
    int bar = room > 30 ? 30 : room;
    char barbuf[40];
    if (bar >= 5) {
        double frac = p->steps_per_epoch > 0
                          ? (double)p->step_in_epoch / (double)p->steps_per_epoch
                          : 0.0;
        if (frac > 1.0)
            frac = 1.0;
        int fill = (int)(frac * bar);
        barbuf[0] = '[';
        for (int k = 0; k < bar; k++)
            barbuf[1 + k] = k < fill ? '=' : (k == fill ? '>' : '.');
        barbuf[bar + 1] = ']';
        barbuf[bar + 2] = '\0';
    } else {
        barbuf[0] = '\0';
    }
    char line[512];
    snprintf(line, sizeof line, "%s%s%s", head, barbuf, tail);
    if ((int)strlen(line) > cols - 1)
        line[cols - 1] = '\0';
    fprintf(pr->out, "\r\033[K%s", line);
    fflush(pr->out);
    pr->bar_visible = 1;
}

void cli_print_loss(FILE *out, double loss)
{
    if (isnan(loss))
        fputs("nan", out);
    else
        fprintf(out, "%.4f", loss);
}

static void print_epoch_line(cli_progress *pr, const castor_progress *p, double now)
{
    double secs = now - pr->epoch_mark;
    pr->epoch_mark = now;
    if (pr->mode == CLI_PROGRESS_BAR)
        fputs("\r\033[K", pr->out);
    fprintf(pr->out, "epoch %d/%d  loss ", p->epoch + 1, p->epochs);
    cli_print_loss(pr->out, p->loss);
    if (!isnan(p->accuracy))
        fprintf(pr->out, "  acc %.4f", p->accuracy);
    if (pr->validation) {  /* a NaN loss here is a diverged model: shown */
        fputs("  val_loss ", pr->out);
        cli_print_loss(pr->out, p->val_loss);
    }
    if (!isnan(p->val_accuracy))
        fprintf(pr->out, "  val_acc %.4f", p->val_accuracy);
    fprintf(pr->out, "  %.1fs\n", secs);
    fflush(pr->out);
    pr->bar_visible = 0;
}

void cli_progress_update(cli_progress *pr, const castor_progress *p)
{
    /* Count samples by optimizer steps, so that a callback made twice for
     * the same step (e.g. once more at the end of an epoch) counts once. */
    if (p->global_step > pr->last_global) {
        int64_t d = p->global_step - pr->last_global;
        pr->samples += step_samples(pr, p->step_in_epoch) + (double)(d - 1) * pr->batch;
        pr->last_global = p->global_step;
    }
    if (pr->mode == CLI_PROGRESS_NONE)
        return;
    double now = cli_now() - pr->t0;
    if (p->epoch_end) {
        print_epoch_line(pr, p, now);
        pr->last_draw = now;
        return;
    }
    if (pr->mode == CLI_PROGRESS_BAR && (pr->last_draw < 0 || now - pr->last_draw >= 0.1)) {
        draw_bar(pr, p, now);
        pr->last_draw = now;
    }
}

void cli_progress_clear(cli_progress *pr)
{
    if (pr->bar_visible) {
        fputs("\r\033[K", pr->out);
        fflush(pr->out);
        pr->bar_visible = 0;
    }
}

void cli_progress_finish(cli_progress *pr)
{
    if (pr->bar_visible) {
        fputc('\n', pr->out);
        fflush(pr->out);
        pr->bar_visible = 0;
    }
}
