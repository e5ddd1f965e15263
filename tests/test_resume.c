/*
 * Exact resume: a child process trains and checkpoints after every step; the
 * parent kills it with SIGKILL part-way, resumes from the newest checkpoint
 * in a fresh strategy, and must end with weights bitwise identical to a run
 * that was never interrupted.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "castor.h"
#include "src/rng.h"
#include "support.h"

#define N 1200
#define F 32
#define EPOCHS 4
#define BATCH 25  /* 48 steps an epoch */

static castor_dataset *data(void)
{
    float *x = malloc(sizeof(float) * N * F);
    int32_t *y = malloc(sizeof(int32_t) * N);
    castor__rng rng;
    castor__rng_seed(&rng, 3, 3, 3);
    for (int i = 0; i < N; i++) {
        y[i] = (int32_t)castor__rng_below(&rng, 4);
        for (int j = 0; j < F; j++)
            x[i * F + j] = castor__rng_uniform(&rng) + (j % 4 == y[i] ? 0.5f : 0.0f);
    }
    castor_dataset *ds = NULL;
    castor_dataset_from_memory(&ds, x, N, F, y, NULL, 0);
    free(x);
    free(y);
    return ds;
}

static castor_model *fresh_model(castor_strategy_kind kind, castor_strategy **s)
{
    cr_assert_eq(castor_strategy_create(s, kind, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, F);
    castor_model_add_layers(m, "24:relu,16:tanh,4");
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
    cr_assert_eq(castor_model_compile(m, *s, CASTOR_LOSS_SOFTMAX_XENT, &adam, 17), CASTOR_OK);
    return m;
}

typedef struct child_ctx {
    castor_model *m;
    const char *dir;
} child_ctx;

static int save_every_step(void *user, const castor_progress *p)
{
    child_ctx *c = user;
    char path[4200];
    snprintf(path, sizeof path, "%s/ckpt-%08lld.safetensors", c->dir, (long long)p->global_step);
    if (castor_model_save(c->m, path) != CASTOR_OK)
        _exit(3);
    struct timespec pause = {0, 3 * 1000 * 1000};  /* give the parent time to kill mid-run */
    nanosleep(&pause, NULL);
    return 0;
}

/* Newest checkpoint in dir (by step in the name); 0 if none. */
static long long newest(const char *dir, char *path, size_t size)
{
    DIR *d = opendir(dir);
    long long best = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long long step;
        char tail[32];
        if (sscanf(e->d_name, "ckpt-%lld.%31s", &step, tail) == 2 &&
            strcmp(tail, "safetensors") == 0 && step > best) {
            best = step;
            snprintf(path, size, "%s/%s", dir, e->d_name);
        }
    }
    if (d)
        closedir(d);
    return best;
}

static void kill_and_resume(castor_strategy_kind kind)
{
    castor_dataset *ds = data();
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = EPOCHS;
    fo.batch_size = BATCH;

    /* The run that is never interrupted. */
    castor_strategy *s = NULL;
    castor_model *m = fresh_model(kind, &s);
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    size_t np = castor_model_num_params(m);
    float *want = malloc(np * sizeof *want);
    castor_model_get_params(m, want, np);
    castor_model_free(m);
    castor_strategy_free(s);

    char *dir = support_tmpdir();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        castor_strategy *cs = NULL;
        castor_model *cm = fresh_model(kind, &cs);
        child_ctx c = {cm, dir};
        fo.progress = save_every_step;
        fo.progress_user = &c;
        castor_model_fit(cm, ds, &fo, NULL);
        _exit(0);  /* finishing means the parent was too slow to kill */
    }
    /* Kill somewhere inside the second epoch, mid-epoch. */
    char path[4200] = "";
    for (int i = 0; i < 20000 && newest(dir, path, sizeof path) < 60; i++) {
        struct timespec t = {0, 500 * 1000};
        nanosleep(&t, NULL);
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "the child was not killed part-way (status %d)", status);
    long long step = newest(dir, path, sizeof path);
    cr_assert(step >= 60 && step < EPOCHS * N / BATCH, "killed at step %lld", step);

    /* Resume in a fresh strategy from the newest checkpoint. */
    castor_strategy *rs = NULL;
    cr_assert_eq(castor_strategy_create(&rs, kind, "cpu:2", NULL), CASTOR_OK);
    castor_model *rm = NULL;
    int rc = castor_model_open(&rm, path, rs);
    cr_assert_eq(rc, CASTOR_OK, "%s", castor_model_errmsg(rm));
    cr_assert_eq(castor_model_step(rm), step);
    cr_assert(castor_model_step_in_epoch(rm) > 0 || step % (N / BATCH) == 0);
    castor_fit_options rest = fo;
    rest.epochs = EPOCHS - (int)castor_model_epoch(rm);
    cr_assert_eq(castor_model_fit(rm, ds, &rest, NULL), CASTOR_OK, "%s", castor_model_errmsg(rm));
    cr_assert_eq(castor_model_step(rm), EPOCHS * N / BATCH);
    float *got = malloc(np * sizeof *got);
    castor_model_get_params(rm, got, np);
    size_t first = 0;
    while (first < np && memcmp(&got[first], &want[first], sizeof *got) == 0)
        first++;
    cr_assert_eq(first, np, "resumed from step %lld: first difference at %zu: %.9g vs %.9g", step,
                 first, got[first < np ? first : 0], want[first < np ? first : 0]);
    free(got);
    free(want);
    castor_model_free(rm);
    castor_strategy_free(rs);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
}

Test(resume, sigkill_central, .timeout = 120) { kill_and_resume(CASTOR_STRATEGY_CENTRAL); }
Test(resume, sigkill_mirrored, .timeout = 120) { kill_and_resume(CASTOR_STRATEGY_MIRRORED); }
