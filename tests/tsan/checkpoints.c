/*
 * Checkpoints written and read by several application threads at once:
 * each its own file (save, open, load, and training resumed from the file
 * going on as the saved model does, bit for bit), and all of them one file,
 * which two threads keep replacing while two others keep reading it: the
 * replacement is atomic (castor.h), so every read finds one whole file of
 * one writer or the other, and no temporary file stays behind.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tsan.h"

enum { SAMPLES = 120, BATCH = 20, SAVES = 12 };

/* ---- a file each ---- */

typedef struct own_file {
    tsan_setup setup;
    char path[4200];
} own_file;

static void *own_file_thread(void *arg)
{
    own_file *o = arg;
    const char *dev = o->setup.devices;
    castor_dataset *ds = tsan_data(o->setup.seed, SAMPLES);
    castor_strategy *s = NULL, *s2 = NULL, *s3 = NULL;
    castor_model *m = tsan_model(&o->setup, NULL, &s), *opened = NULL, *loaded = NULL;
    tsan_setup other = o->setup;
    other.seed += 100;  /* other variables, until the load replaces them */
    if (m && ds && (loaded = tsan_model(&other, NULL, &s3))) {
        size_t np = castor_model_num_params(m);
        int rc = tsan_fit(m, ds, 1, BATCH, 0);
        CHECK(rc == CASTOR_OK, "own file %s: fit: %s", dev, castor_model_errmsg(m));
        rc = castor_model_save(m, o->path);
        CHECK(rc == CASTOR_OK, "own file %s: save: %s", dev, castor_model_errmsg(m));
        float *saved = tsan_params(m);
        rc = castor_strategy_create(&s2, o->setup.kind, dev, NULL);
        if (!rc)
            rc = castor_model_open(&opened, o->path, s2);
        CHECK(rc == CASTOR_OK, "own file %s: open: %s", dev, castor_model_errmsg(opened));
        rc = castor_model_load(loaded, o->path);
        CHECK(rc == CASTOR_OK, "own file %s: load: %s", dev, castor_model_errmsg(loaded));
        float *p_open = opened ? tsan_params(opened) : NULL, *p_load = tsan_params(loaded);
        CHECK(tsan_same(p_open, saved, np) && tsan_same(p_load, saved, np),
              "own file %s: what open and load give is not what was saved", dev);
        free(p_open);
        free(p_load);
        /* Training goes on from the file as from the model saved. */
        rc = tsan_fit(m, ds, 1, BATCH, 0) || (opened && tsan_fit(opened, ds, 1, BATCH, 0)) ||
             tsan_fit(loaded, ds, 1, BATCH, 0);
        CHECK(rc == CASTOR_OK && opened, "own file %s: fit after open/load", dev);
        float *a = tsan_params(m), *b = opened ? tsan_params(opened) : NULL;
        float *c = tsan_params(loaded);
        CHECK(tsan_same(b, a, np) && tsan_same(c, a, np),
              "own file %s: an epoch after open or load differs from one after save", dev);
        free(a);
        free(b);
        free(c);
        free(saved);
    }
    castor_model_free(opened);
    castor_model_free(loaded);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_strategy_free(s2);
    castor_strategy_free(s3);
    castor_dataset_free(ds);
    return NULL;
}

static void own_files(const char *dir)
{
    own_file f[4] = {{.setup = {CASTOR_STRATEGY_CENTRAL, "cpu:3", TSAN_BIG, 2, 41}},
                     {.setup = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", TSAN_SMALL, 2, 42}},
                     {.setup = {CASTOR_STRATEGY_MIRRORED, "cpu:3", TSAN_BIG, 3, 43}},
                     {.setup = {CASTOR_STRATEGY_CENTRAL, "cpu:2", TSAN_SMALL, 1, 44}}};
    for (int i = 0; i < 4; i++)
        snprintf(f[i].path, sizeof f[i].path, "%s/own%d.safetensors", dir, i);
    tsan_parallel(4, own_file_thread, f, sizeof *f);
    for (int i = 0; i < 4; i++)
        remove(f[i].path);
}

/* ---- one file for all ---- */

typedef struct shared_file {
    const char *path;
    atomic_int *writing;        /* writers still at it */
    const float *variables[2];  /* each writer's */
    size_t n_params;
    /* a writer */
    castor_model *m;
    /* a reader */
    int use_open;
    int reads, from[2];
    char first_error[512];      /* of the reads that failed (how many varies with timing) */
} shared_file;

static const tsan_setup shared_setup = {CASTOR_STRATEGY_MIRRORED, "cpu:3", TSAN_SMALL, 2, 51};

static void *writer_thread(void *arg)
{
    shared_file *w = arg;
    for (int i = 0; i < SAVES; i++) {
        int rc = castor_model_save(w->m, w->path);
        CHECK(rc == CASTOR_OK, "shared file: save %d: %s", i, castor_model_errmsg(w->m));
    }
    atomic_fetch_sub(w->writing, 1);
    return NULL;
}

/* Which writer's variables p are (0 or 1), or -1. */
static int whose(const shared_file *r, const float *p)
{
    for (int k = 0; k < 2; k++)
        if (tsan_same(p, r->variables[k], r->n_params))
            return k;
    return -1;
}

static void *reader_thread(void *arg)
{
    shared_file *r = arg;
    castor_strategy *s = NULL;
    castor_model *into = r->use_open ? NULL : tsan_model(&shared_setup, NULL, &s);
    if (!r->use_open && !into)
        return NULL;
    if (r->use_open && castor_strategy_create(&s, shared_setup.kind, "cpu:2", NULL)) {
        CHECK(0, "shared file: strategy: %s", castor_strategy_errmsg(s));
        return NULL;
    }
    /* Until the writers are done, and a few times at least. */
    for (int i = 0; atomic_load(r->writing) > 0 || i < 3; i++) {
        castor_model *m = into;
        int rc = r->use_open ? castor_model_open(&m, r->path, s) : castor_model_load(m, r->path);
        int k = -1;
        if (!rc) {
            float *p = tsan_params(m);
            if ((k = whose(r, p)) >= 0)
                r->from[k]++;
            free(p);
        }
        if (k < 0 && !r->first_error[0])
            snprintf(r->first_error, sizeof r->first_error, "read %d: %s", i,
                     rc ? castor_model_errmsg(m) : "the variables of neither writer");
        r->reads++;
        if (r->use_open)
            castor_model_free(m);
    }
    castor_model_free(into);
    castor_strategy_free(s);
    return NULL;
}

static void shared_file_runs(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/shared.safetensors", dir);
    castor_dataset *ds = tsan_data(51, SAMPLES);
    castor_strategy *s[2] = {NULL, NULL};
    castor_model *m[2] = {NULL, NULL};
    float *vars[2] = {NULL, NULL};
    atomic_int writing = 2;
    for (int k = 0; k < 2; k++) {
        tsan_setup setup = shared_setup;
        setup.seed += (unsigned)k;
        m[k] = tsan_model(&setup, NULL, &s[k]);
        if (!m[k] || tsan_fit(m[k], ds, 1, BATCH, 2 + k))
            goto out;
        vars[k] = tsan_params(m[k]);
    }
    if (!vars[0] || !vars[1] || castor_model_save(m[0], path)) {
        CHECK(0, "shared file: the writers' models");
        goto out;
    }
    shared_file t[4];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 4; i++) {
        t[i].path = path;
        t[i].writing = &writing;
        t[i].variables[0] = vars[0];
        t[i].variables[1] = vars[1];
        t[i].n_params = castor_model_num_params(m[0]);
    }
    t[0].m = m[0];
    t[1].m = m[1];
    t[3].use_open = 1;
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, i < 2 ? writer_thread : reader_thread, &t[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 2; i < 4; i++)
        CHECK(t[i].reads >= 3 && t[i].from[0] + t[i].from[1] == t[i].reads,
              "shared file: %s read %d times, %d and %d of them one writer's file; %s",
              t[i].use_open ? "open" : "load", t[i].reads, t[i].from[0], t[i].from[1],
              t[i].first_error);
    CHECK(tsan_dir_entries(dir) == 1, "shared file: %d files in the directory, want 1 (a "
          "temporary file left behind?)", tsan_dir_entries(dir));
    remove(path);
out:
    for (int k = 0; k < 2; k++) {
        free(vars[k]);
        castor_model_free(m[k]);
        castor_strategy_free(s[k]);
    }
    castor_dataset_free(ds);
}

void tsan_checkpoints(void)
{
    char *dir = tsan_tmpdir();
    own_files(dir);
    shared_file_runs(dir);
    tsan_rmdir(dir);
    free(dir);
}
