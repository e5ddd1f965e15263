/* The TSan program's shared pieces: see tsan.h. */
#include "tsan.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

atomic_int tsan_passes, tsan_failures;

void tsan_report(const char *file, int line, const char *fmt, ...)
{
    /* One line at a time, so that two threads' reports do not interleave. */
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL %s:%d: %s\n", file, line, msg);
}

castor_dataset *tsan_data(unsigned seed, int n)
{
    float *x = malloc(sizeof(float) * (size_t)n * TSAN_F);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        y[i] = (int32_t)((seed >> 16) % TSAN_C);
        for (int j = 0; j < TSAN_F; j++) {
            seed = seed * 1103515245u + 12345u;
            x[i * TSAN_F + j] =
                (float)((seed >> 16) & 0xff) / 255.0f + (j % TSAN_C == y[i] ? 0.5f : 0.0f);
        }
    }
    castor_dataset *ds = NULL;
    if (castor_dataset_from_memory(&ds, x, (size_t)n, TSAN_F, y, NULL, 0)) {
        CHECK(0, "dataset: %s", castor_dataset_errmsg(ds));
        castor_dataset_free(ds);
        ds = NULL;
    }
    free(x);
    free(y);
    return ds;
}

castor_model *tsan_model(const tsan_setup *setup, const castor_strategy_options *so,
                         castor_strategy **s)
{
    castor_strategy_options opts = CASTOR_STRATEGY_OPTIONS_INIT;
    if (so)
        opts = *so;
    else
        opts.host_threads = setup->host_threads;
    castor_model *m = NULL;
    *s = NULL;
    if (castor_strategy_create(s, setup->kind, setup->devices, &opts)) {
        CHECK(0, "strategy %s: %s", setup->devices, castor_strategy_errmsg(*s));
    } else if (castor_model_create(&m, TSAN_F) || castor_model_add_layers(m, setup->layers) ||
               castor_model_compile(m, *s, CASTOR_LOSS_SOFTMAX_XENT, NULL, setup->seed)) {
        CHECK(0, "model %s on %s: %s", setup->layers, setup->devices, castor_model_errmsg(m));
    } else {
        return m;
    }
    castor_model_free(m);
    castor_strategy_free(*s);
    *s = NULL;
    return NULL;
}

float *tsan_params(castor_model *m)
{
    size_t n = castor_model_num_params(m);
    float *p = malloc(n * sizeof *p);
    int rc = castor_model_get_params(m, p, n);
    if (rc) {
        CHECK(0, "get_params: %s", castor_model_errmsg(m));
        free(p);
        return NULL;
    }
    return p;
}

int tsan_same(const float *a, const float *b, size_t n)
{
    return a && b && memcmp(a, b, n * sizeof *a) == 0;
}

int tsan_fit(castor_model *m, const castor_dataset *ds, int epochs, int batch, int max_steps)
{
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = epochs;
    fo.batch_size = batch;
    fo.max_steps = max_steps;
    return castor_model_fit(m, ds, &fo, NULL);
}

void tsan_parallel(int n, void *(*fn)(void *), void *args, size_t stride)
{
    pthread_t t[16];
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * stride)) {
            fprintf(stderr, "cannot start a thread\n");
            exit(2);
        }
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

char *tsan_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/castor-tsan-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        exit(2);
    }
    return strdup(tmpl);
}

static int each_entry(const char *dir, int remove)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        n++;
        if (remove) {
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    return n;
}

int tsan_dir_entries(const char *dir)
{
    return each_entry(dir, 0);
}

void tsan_rmdir(const char *dir)
{
    each_entry(dir, 1);
    rmdir(dir);
}
