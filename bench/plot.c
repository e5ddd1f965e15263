/*
 * bench.png: step time (measured, and the lower bound dashed) and peak device
 * memory against parameters, a line per strategy and batch, drawn by
 * gnuplot when it is installed.
 */
#include "bench/bench.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)

static int find_in_path(const char *name)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    char dir[4096];
    while (*path) {
        size_t len = strcspn(path, ":");
        char file[4200];
        snprintf(dir, sizeof dir, "%.*s", (int)len, path);
        snprintf(file, sizeof file, "%s/%s", len ? dir : ".", name);
        if (access(file, X_OK) == 0)
            return 1;
        path += len;
        if (*path == ':')
            path++;
    }
    return 0;
}

/* A gnuplot single-quoted string: '' stands for a quote. */
static void gp_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        if (*s != '\n')
            fputc(*s, f);
    }
    fputc('\'', f);
}

/* A shell single-quoted word into buf: ' becomes '\''. A word that does
 * not fit leaves buf "/dev/null". */
static void shell_quote(char *buf, size_t size, const char *s)
{
    size_t used = 0;
    if (size < 3)
        goto too_long;
    buf[used++] = '\'';
    for (; *s; s++) {
        const char *part = *s == '\'' ? "'\\''" : s;
        size_t len = *s == '\'' ? 4 : 1;
        if (used + len + 2 > size)
            goto too_long;
        memcpy(buf + used, part, len);
        used += len;
    }
    buf[used++] = '\'';
    buf[used] = '\0';
    return;
too_long:
    snprintf(buf, size, "/dev/null");
}

/* A temporary file for gnuplot's messages, in $TMPDIR where it is set, as
 * mkstemp(3) users should (a /tmp that is not writable, or not private, is
 * why it is set); its descriptor, or -1. */
static int temp_log(char *path, size_t size)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !dir[0])
        dir = "/tmp";
    int n = snprintf(path, size, "%s%scastor-gnuplot-XXXXXX", dir,
                     dir[strlen(dir) - 1] == '/' ? "" : "/");
    return n < 0 || (size_t)n >= size ? -1 : mkstemp(path);
}

typedef struct series {
    castor_strategy_kind kind;
    int batch;
    const int *idx;  /* its runs, by parameter count */
    int n;
} series;

typedef struct run_key {
    castor_strategy_kind kind;
    int batch;
    size_t params;
    int idx;
} run_key;

static int cmp_run_key(const void *pa, const void *pb)
{
    const run_key *a = pa, *b = pb;
    if (a->kind != b->kind)
        return a->kind < b->kind ? -1 : 1;
    if (a->batch != b->batch)
        return a->batch < b->batch ? -1 : 1;
    if (a->params != b->params)
        return a->params < b->params ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* A series' legend: its strategy, and its batch when the grid has several. */
static void series_name(char *buf, size_t size, const bench_config *c, const series *s)
{
    if (c->n_batches > 1)
        snprintf(buf, size, "%s, batch %d", castor_strategy_kind_name(s->kind), s->batch);
    else
        snprintf(buf, size, "%s", castor_strategy_kind_name(s->kind));
}

static void write_script(FILE *f, const char *png, const bench_config *c, const bench_result *r,
                         const series *ser, int nser)
{
    for (int k = 0; k < nser; k++) {
        fprintf(f, "$s%d << EOD\n", k);
        for (int i = 0; i < ser[k].n; i++) {
            const bench_result *x = &r[ser[k].idx[i]];
            fprintf(f, "%zu %.6g %.6g %.6g\n", x->params, x->step_median * 1e3,
                    isfinite(x->lower_bound) ? x->lower_bound * 1e3 : 0.0,
                    (double)x->device_peak / MIB);
        }
        fprintf(f, "EOD\n");
    }
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 1400,560 font 'sans,10'\n"
               "} else {\n"
               "  set terminal png size 1400,560\n"
               "}\n");
    fprintf(f, "set output ");
    gp_quoted(f, png);
    fprintf(f, "\n");
    char title[512];
    snprintf(title, sizeof title, "castor bench: %s, %d replica%s, %s, depth %s%d, %d timed steps",
             c->devices, c->replicas, c->replicas == 1 ? "" : "s",
             castor_optimizer_kind_name(c->optimizer), c->n_depths > 1 ? "from " : "",
             c->depths[0], c->steps);
    fprintf(f, "set multiplot layout 1,2 title ");
    gp_quoted(f, title);
    fprintf(f, "\nset logscale x\nset grid\nset key top left\nset xlabel 'parameters'\n"
               "set format x '%%.0s%%c'\n");
    static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f"};
    const int ncol = (int)(sizeof colors / sizeof colors[0]);
    /* Left: step time, measured and lower bound. The strategies' bounds
     * often coincide (same GEMMs, same bytes): each series' dashes differ,
     * so that one drawn over another still shows both colours. */
    fprintf(f, "set logscale y\nset ylabel 'median step time (ms)'\n"
               "set title 'step time (dashed: lower bound from the measured limits)'\nplot ");
    for (int k = 0; k < nser; k++) {
        char name[64];
        series_name(name, sizeof name, c, &ser[k]);
        fprintf(f,
                "%s$s%d using 1:2 with linespoints lw 2 pt 7 lc rgb '%s' title '%s', "
                "$s%d using 1:($3 > 0 ? $3 : NaN) with lines dt %d lw 2 lc rgb '%s' "
                "title '%s bound'",
                k ? ", " : "", k, colors[k % ncol], name, k, 2 + k % 4, colors[k % ncol], name);
    }
    fprintf(f, "\n");
    /* Right: device memory. */
    fprintf(f, "unset logscale y\nset yrange [0:*]\nset ylabel 'peak device memory per replica (MiB)'\n"
               "set title 'device memory'\nplot ");
    for (int k = 0; k < nser; k++) {
        char name[64];
        series_name(name, sizeof name, c, &ser[k]);
        fprintf(f, "%s$s%d using 1:4 with linespoints lw 2 pt 7 lc rgb '%s' title '%s'",
                k ? ", " : "", k, colors[k % ncol], name);
    }
    fprintf(f, "\nunset multiplot\nset output\n");
}

int bench_plot(const char *dir, const bench_config *c, const bench_result *r, int n)
{
    char png[4200];
    snprintf(png, sizeof png, "%s/bench.png", dir);
    unlink(png); /* never leave an old plot beside new numbers */
    if (!find_in_path("gnuplot")) {
        fprintf(stderr, "castor: warning: bench: gnuplot is not installed (scripts/install-deps "
                        "installs it): no plot, CSV and JSON are written\n");
        return 1;
    }
    /* A series per strategy and batch: the successful runs sorted by those
     * and then by size, each series a stretch of them. */
    run_key *keys = malloc((size_t)(n > 0 ? n : 1) * sizeof *keys);
    int *slots = malloc((size_t)(n > 0 ? n : 1) * sizeof *slots);
    series *ser = malloc((size_t)(n > 0 ? n : 1) * sizeof *ser);
    if (!keys || !slots || !ser) {
        free(keys);
        free(slots);
        free(ser);
        fprintf(stderr, "castor: warning: bench: out of memory: no plot\n");
        return 1;
    }
    int nok = 0, nser = 0;
    for (int i = 0; i < n; i++)
        if (r[i].ok)
            keys[nok++] = (run_key){r[i].strategy, r[i].batch, r[i].params, i};
    qsort(keys, (size_t)nok, sizeof *keys, cmp_run_key);
    for (int i = 0; i < nok; i++) {
        slots[i] = keys[i].idx;
        if (i == 0 || keys[i].kind != keys[i - 1].kind || keys[i].batch != keys[i - 1].batch)
            ser[nser++] = (series){keys[i].kind, keys[i].batch, &slots[i], 0};
        ser[nser - 1].n++;
    }
    free(keys);
    if (nser == 0) {
        free(slots);
        free(ser);
        fprintf(stderr, "castor: warning: bench: no run succeeded: no plot\n");
        return 1;
    }

    /* gnuplot may exit early: a write to its pipe must not kill us. */
    struct sigaction ign, old;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
    fflush(NULL);
    /* gnuplot's stdout is ours: where `set output` fails it writes the PNG
     * there. Its messages go to a file, for the warning if it fails. */
    char log[PATH_MAX], cmd[2 * PATH_MAX + 64];
    int log_fd = temp_log(log, sizeof log);
    if (log_fd >= 0)
        close(log_fd);
    snprintf(cmd, sizeof cmd, "gnuplot >/dev/null 2>");
    shell_quote(cmd + strlen(cmd), sizeof cmd - strlen(cmd), log_fd >= 0 ? log : "/dev/null");
    FILE *f = popen(cmd, "w");
    int status = -1;
    if (f) {
        write_script(f, png, c, r, ser, nser);
        status = pclose(f);
    }
    free(slots);
    free(ser);
    sigaction(SIGPIPE, &old, NULL);
    char why[200] = "";
    if (log_fd >= 0) {
        FILE *lf = fopen(log, "r");
        char line[200];
        /* Its messages, without the echoed command and the caret under it. */
        for (int kept = 0; lf && kept < 2 && fgets(line, sizeof line, lf);) {
            line[strcspn(line, "\r\n")] = '\0';
            const char *text = line + strspn(line, " \t");
            if (!text[strspn(text, " \t^")] || strncmp(text, "gnuplot>", 8) == 0)
                continue;
            size_t used = strlen(why);
            used += (size_t)snprintf(why + used, sizeof why - used, "%s", kept++ ? "; " : ": ");
            if (used >= sizeof why)
                used = sizeof why - 1;
            for (; *text && used + 1 < sizeof why; text++)
                if (!(*text == ' ' && text[1] == ' '))  /* runs of spaces as one */
                    why[used++] = *text;
            why[used] = '\0';
        }
        if (lf)
            fclose(lf);
        unlink(log);
    }
    struct stat sb;
    if (!f || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        stat(png, &sb) != 0 || sb.st_size == 0) {
        fprintf(stderr, "castor: warning: bench: gnuplot failed (status %d%s): no plot, CSV "
                        "and JSON are written\n",
                status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, why);
        return 1;
    }
    return 0;
}
