/*
 * Checkpoints with each allocation failing in turn. A failed save leaves
 * the file it was to replace as it was and no temporary file behind, and a
 * save right after writes the bytes a save that never failed writes. A
 * failed load leaves the model unchanged (castor.h: "on any error the
 * model is unchanged"), and a load right after gives what a load that
 * never failed gives. A failed open hands out a model (or none, when not
 * even that could be had) that says memory ran out, leaving the strategy
 * free for the open right after.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_model.h"
#include "alloc_sweep.h"
#include "tests/support.h"

enum { SAVE, LOAD, OPEN, CALLS };
static const char *const call_names[CALLS] = {"save", "load", "open"};

typedef struct state {
    int call;
    const am_place *place;
    castor_strategy *s;
    castor_model *m;
    castor_dataset *train;
    char path[SUPPORT_PATH_LEN];    /* save's, over a file saved a step before */
    char source[SUPPORT_PATH_LEN];  /* what load and open read */
    unsigned char *old;             /* the file save is to replace */
    size_t old_len;
    am_snap before;                 /* load: the model before */
    /* From the first round: the file save writes, the model load and open
     * make. */
    unsigned char *want;
    size_t want_len;
    am_snap want_snap;
} state;

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s: cannot open %s", alloc_where(), path);
    unsigned char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len == cap) {
            cap = cap ? 2 * cap : 4096;
            buf = realloc(buf, cap);
            cr_assert(buf);
        }
        size_t got = fread(buf + *len, 1, cap - *len, f);
        *len += got;
        if (!got)
            break;
    }
    fclose(f);
    return buf;
}

static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* A checkpoint of the model trained two steps from another seed, for load
 * and open to read. */
static void write_source(state *st)
{
    castor_strategy *s = am_strategy(st->place);
    castor_model *m = am_layers();
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &adam, 99), CASTOR_OK);
    castor_dataset *train = am_train();
    cr_assert_eq(am_fit(m, train, NULL, 2), CASTOR_OK);
    support_path_in(st->source, "source.safetensors");
    cr_assert_eq(castor_model_save(m, st->source), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(train);
}

static void setup(void *arg)
{
    state *st = arg;
    st->s = am_strategy(st->place);
    if (st->call == OPEN)
        return;
    st->m = am_model(st->s);
    st->train = am_train();
    if (st->call == SAVE) {
        support_path_in(st->path, "saved.safetensors");
        cr_assert_eq(castor_model_save(st->m, st->path), CASTOR_OK);
        st->old = slurp(st->path, &st->old_len);
    }
    cr_assert_eq(am_fit(st->m, st->train, NULL, 1), CASTOR_OK, "%s: fit: %s", alloc_where(),
                 castor_model_errmsg(st->m));
    if (st->call == LOAD)
        st->before = am_take(st->m);
}

static int call(void *arg)
{
    state *st = arg;
    switch (st->call) {
    case SAVE:
        return castor_model_save(st->m, st->path);
    case LOAD:
        return castor_model_load(st->m, st->source);
    default:
        return castor_model_open(&st->m, st->source, st->s);
    }
}

static const char *errmsg(void *arg)
{
    return castor_model_errmsg(((state *)arg)->m);
}

static void check_save(state *st, int rc)
{
    /* support_dir holds the source, and the saved file: nothing else. */
    cr_assert_eq(dir_entries(support_dir), 2, "%s: a temporary file is left behind",
                 alloc_where());
    size_t len;
    unsigned char *got = slurp(st->path, &len);
    if (rc) {
        cr_assert(len == st->old_len && memcmp(got, st->old, len) == 0,
                  "%s: a failed save changed the file", alloc_where());
        free(got);
        cr_assert_eq(call(st), CASTOR_OK, "%s: save again: %s", alloc_where(), errmsg(st));
        got = slurp(st->path, &len);
    }
    if (alloc_first_round()) {
        st->want = got;
        st->want_len = len;
        return;
    }
    int same = len == st->want_len && memcmp(got, st->want, len) == 0;
    free(got);
    cr_assert(same, "%s: the file differs from one saved with nothing failing", alloc_where());
}

static void check(void *arg, int rc)
{
    state *st = arg;
    am_assert_idle(st->s);
    if (st->call == SAVE) {
        check_save(st, rc);
        return;
    }
    if (rc && st->call == LOAD) {
        cr_assert(!am_inconsistent(st->m), "%s: CASTOR_NOMEM left the model inconsistent",
                  alloc_where());
        am_snap now = am_take(st->m);
        am_assert_same(&now, &st->before, "a model a load failed on");
        am_snap_free(&now);
    } else if (rc) {
        am_assert_unbound(st->s);
        castor_model_free(st->m);
        st->m = NULL;
    }
    if (rc)
        cr_assert_eq(call(st), CASTOR_OK, "%s: %s again: %s", alloc_where(),
                     call_names[st->call], errmsg(st));
    am_snap now = am_take(st->m);
    if (alloc_first_round()) {
        st->want_snap = now;
        return;
    }
    am_assert_same(&now, &st->want_snap, "after the checkpoint was read");
    am_snap_free(&now);
}

static void teardown(void *arg)
{
    state *st = arg;
    castor_model_free(st->m);
    castor_strategy_free(st->s);
    castor_dataset_free(st->train);
    free(st->old);
    am_snap_free(&st->before);
    st->m = NULL;
    st->s = NULL;
    st->train = NULL;
    st->old = NULL;
}

static void sweep(int which)
{
    for (int p = 0; p < AM_PLACES; p++) {
        state *st = calloc(1, sizeof *st);
        cr_assert(st);
        st->call = which;
        st->place = &am_places[p];
        write_source(st);
        char what[128];
        snprintf(what, sizeof what, "%s on %s", call_names[which], am_place_name(st->place));
        alloc_case c = {what, st, setup, call, errmsg, check, teardown};
        alloc_sweep(&c);
        free(st->want);
        am_snap_free(&st->want_snap);
        free(st);
    }
}

TestSuite(alloc_checkpoint, .init = support_dir_init, .fini = support_dir_fini,
          .timeout = 300);

Test(alloc_checkpoint, save)
{
    sweep(SAVE);
}

Test(alloc_checkpoint, load)
{
    sweep(LOAD);
}

Test(alloc_checkpoint, open)
{
    sweep(OPEN);
}
