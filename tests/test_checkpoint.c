/*
 * Checkpoints: the safetensors reader on hostile input, save/load round
 * trips (variables, optimizer state, position) on both strategies, exact
 * resume part-way through an epoch, corrupt files that must change nothing,
 * atomic writes, and a file read back by Python's safetensors.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <zlib.h>

#include "castor.h"
#include "src/model.h"
#include "src/rng.h"
#include "src/safetensors.h"
#include "support.h"

#define N 101  /* 7 batches of 16 per epoch, the last one short */
#define F 12
#define C 3
#define LAYERS "16:tanh,8:relu,3"
#define BATCH 16

/* ---- helpers ------------------------------------------------------------- */

static castor_dataset *synthetic(void)
{
    float *x = malloc(sizeof(float) * N * F);
    int32_t *y = malloc(sizeof(int32_t) * N);
    castor__rng rng;
    castor__rng_seed(&rng, 5, 9, 0);
    for (int i = 0; i < N; i++) {
        y[i] = (int32_t)castor__rng_below(&rng, C);
        for (int j = 0; j < F; j++)
            x[i * F + j] = castor__rng_uniform(&rng) + (j % C == y[i] ? 0.7f : 0.0f);
    }
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, x, N, F, y, NULL, 0), CASTOR_OK);
    free(x);
    free(y);
    return ds;
}

static castor_optimizer make_opt(castor_optimizer_kind kind)
{
    castor_optimizer opt = castor_optimizer_defaults(kind);
    if (kind == CASTOR_OPT_SGD) {
        opt.learning_rate = 0.05f;
        opt.momentum = 0.9f;
        opt.nesterov = 1;
    }
    return opt;
}

static castor_strategy *make_strategy(castor_strategy_kind kind, const char *devices)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, kind, devices, NULL), CASTOR_OK, "%s",
                 castor_strategy_errmsg(s));
    return s;
}

static castor_model *make_model(castor_strategy *s, const char *layers, castor_optimizer opt,
                                uint64_t seed)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, layers), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, seed), CASTOR_OK,
                 "%s", castor_model_errmsg(m));
    return m;
}

static void train_steps(castor_model *m, const castor_dataset *ds, int64_t steps)
{
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 1000;
    fo.batch_size = BATCH;
    fo.shuffle = 1;
    fo.max_steps = steps;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
}

/* Everything a checkpoint holds, read out of a model. */
typedef struct snap {
    float *params, *state;
    size_t n, ns;
    int64_t step, epoch, step_in_epoch;
    int epoch_batch;
    uint64_t seed;
    castor_optimizer opt;
} snap;

static snap take(castor_model *m)
{
    snap s = {0};
    s.n = castor_model_num_params(m);
    s.params = malloc(s.n * sizeof(float));
    /* get_params pulls the variables and the optimizer state to the host. */
    cr_assert_eq(castor_model_get_params(m, s.params, s.n), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    s.ns = (size_t)m->opt_slots * s.n;
    s.state = malloc((s.ns ? s.ns : 1) * sizeof(float));
    if (s.ns)
        memcpy(s.state, m->opt_state.ptr, s.ns * sizeof(float));
    s.step = castor_model_step(m);
    s.epoch = castor_model_epoch(m);
    s.step_in_epoch = castor_model_step_in_epoch(m);
    s.epoch_batch = m->epoch_batch;
    s.seed = m->seed;
    s.opt = m->opt;
    return s;
}

static void snap_free(snap *s)
{
    free(s->params);
    free(s->state);
}

static void assert_same(const snap *a, const snap *b, const char *what)
{
    cr_assert_eq(a->n, b->n, "%s: parameter counts differ", what);
    cr_assert_eq(a->ns, b->ns, "%s: optimizer state sizes differ", what);
    for (size_t i = 0; i < a->n; i++)
        cr_assert_eq(memcmp(&a->params[i], &b->params[i], sizeof(float)), 0,
                     "%s: parameter %zu differs: %.9g vs %.9g", what, i, (double)a->params[i],
                     (double)b->params[i]);
    for (size_t i = 0; i < a->ns; i++)
        cr_assert_eq(memcmp(&a->state[i], &b->state[i], sizeof(float)), 0,
                     "%s: optimizer state %zu differs: %.9g vs %.9g", what, i,
                     (double)a->state[i], (double)b->state[i]);
    cr_assert_eq(a->step, b->step, "%s: step %lld vs %lld", what, (long long)a->step,
                 (long long)b->step);
    cr_assert_eq(a->epoch, b->epoch, "%s: epoch", what);
    cr_assert_eq(a->step_in_epoch, b->step_in_epoch, "%s: step_in_epoch", what);
    cr_assert_eq(a->epoch_batch, b->epoch_batch, "%s: epoch_batch", what);
    cr_assert_eq(a->seed, b->seed, "%s: seed", what);
    cr_assert_eq(memcmp(&a->opt, &b->opt, sizeof a->opt), 0, "%s: optimizer differs", what);
}

static char *path_in(const char *dir, const char *name)
{
    size_t len = strlen(dir) + strlen(name) + 2;
    char *p = malloc(len);
    snprintf(p, len, "%s/%s", dir, name);
    return p;
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(size > 0 ? (size_t)size : 1);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *len = (size_t)size;
    return buf;
}

/* Names in dir other than "." and ".."; *count of them. */
static int dir_entries(const char *dir, const char *skip)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            (!skip || strcmp(e->d_name, skip)))
            count++;
    closedir(d);
    return count;
}

/* ---- the safetensors reader ---------------------------------------------------- */

/* A file image from a header text (padded to 8) and data bytes. */
static unsigned char *image(const char *header, const void *data, size_t data_len, size_t *len)
{
    size_t h = strlen(header);
    size_t pad = (8 - (8 + h) % 8) % 8;
    *len = 8 + h + pad + data_len;
    unsigned char *b = malloc(*len);
    uint64_t hl = h + pad;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hl >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, ' ', pad);
    if (data_len)
        memcpy(b + 8 + h + pad, data, data_len);
    return b;
}

static int parse_text(const char *header, size_t data_len, char *err, size_t errlen)
{
    unsigned char zeros[64] = {0};
    cr_assert(data_len <= sizeof zeros);
    size_t len;
    unsigned char *b = image(header, zeros, data_len, &len);
    castor__st_file f;
    int rc = castor__st_parse(b, len, "mem.safetensors", &f, err, errlen);
    castor__st_free(&f);
    free(b);
    return rc;
}

Test(checkpoint, st_accepts_valid)
{
    char err[256] = "";
    cr_assert_eq(parse_text("{}", 0, err, sizeof err), CASTOR_OK, "%s", err);
    cr_assert_eq(parse_text("{\"__metadata__\":{\"a\":\"b\"}}", 0, err, sizeof err), CASTOR_OK,
                 "%s", err);
    /* A scalar, a zero-size tensor and trailing padding. */
    cr_assert_eq(parse_text("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                            "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
                            "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}  ",
                            12, err, sizeof err),
                 CASTOR_OK, "%s", err);
}

static void expect_reject(const char *header, size_t data_len, const char *fragment)
{
    char err[256] = "";
    cr_assert_eq(parse_text(header, data_len, err, sizeof err), CASTOR_FORMAT,
                 "accepted: %s", header);
    cr_assert(strncmp(err, "mem.safetensors: ", 17) == 0, "message: %s", err);
    cr_assert(strstr(err, fragment), "'%s' not in: %s", fragment, err);
}

Test(checkpoint, st_rejects_bad_headers)
{
    expect_reject("[1,2]", 0, "does not start with '{'");
    expect_reject("{\"a\":", 0, "not valid JSON");
    expect_reject("{} x", 0, "after its JSON object");
    expect_reject("{\"a\":1}", 0, "not a JSON object");
    expect_reject("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                  "dtype 'F16'");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                  "dimension 0");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                  "dimension 0");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                  "\"data_offsets\":[0,0]}}", 0, "overflows");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                  "end before");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                  "past the end");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                  "its shape needs 8");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                  "overlap");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                  "belong to no tensor");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                  "belong to no tensor");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
                  "appears twice");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[0],"
                  "\"data_offsets\":[0,0]}}", 0, "twice");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":1}}", 0,
                  "unknown field");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[0]}}", 0, "no 'data_offsets'");
    expect_reject("{\"__metadata__\":{\"n\":1}}", 0, "not a string");
    expect_reject("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "appears twice");
    expect_reject("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "appears twice");
    expect_reject("{\"\xff\":1}", 0, "UTF-8");
    expect_reject("{\"\xc0\x80\":1}", 0, "UTF-8");  /* overlong NUL */
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                  "\"data_offsets\":[0,4]}}", 4, "dimensions");
}

Test(checkpoint, st_rejects_bad_lengths)
{
    char err[256];
    castor__st_file f;
    unsigned char small[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(castor__st_parse(small, 0, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "empty"), "%s", err);
    cr_assert_eq(castor__st_parse(small, sizeof small, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "truncated"), "%s", err);
    unsigned char huge[16] = {0};
    huge[7] = 0x80;  /* 2^63 */
    cr_assert_eq(castor__st_parse(huge, sizeof huge, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "limit"), "%s", err);
    unsigned char over[16] = {9, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    cr_assert_eq(castor__st_parse(over, 10, "x", &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, "larger than"), "%s", err);
    unsigned char zero[16] = {0};
    cr_assert_eq(castor__st_parse(zero, sizeof zero, "x", &f, err, sizeof err), CASTOR_FORMAT);
    castor__st_free(&f);
}

Test(checkpoint, st_read_rejects_non_files)
{
    char *dir = support_tmpdir();
    char err[512];
    castor__st_file f;
    cr_assert_eq(castor__st_read(dir, &f, err, sizeof err), CASTOR_IO);
    cr_assert(strstr(err, dir) && strstr(err, "directory"), "%s", err);
    char *missing = path_in(dir, "missing.safetensors");
    cr_assert_eq(castor__st_read(missing, &f, err, sizeof err), CASTOR_IO);
    cr_assert(strstr(err, missing), "%s", err);
    char *empty = path_in(dir, "empty.safetensors");
    cr_assert_eq(support_write_file(empty, "", 0), 0);
    cr_assert_eq(castor__st_read(empty, &f, err, sizeof err), CASTOR_FORMAT);
    cr_assert(strstr(err, empty) && strstr(err, "empty"), "%s", err);
    free(missing);
    free(empty);
    support_rmrf(dir);
    free(dir);
}

/* ---- round trips ------------------------------------------------------------------- */

static void round_trip(castor_strategy_kind kind, const char *devices, castor_optimizer_kind ok)
{
    char *dir = support_tmpdir();
    char *path = path_in(dir, "ckpt.safetensors");
    castor_dataset *ds = synthetic();
    castor_strategy *s = make_strategy(kind, devices);
    castor_model *m = make_model(s, LAYERS, make_opt(ok), 42);
    train_steps(m, ds, 10);  /* epoch 1, 3 steps into it */
    cr_assert_eq(castor_model_epoch(m), 1);
    cr_assert_eq(castor_model_step_in_epoch(m), 3);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    snap a = take(m);
    cr_assert(a.ns == (ok == CASTOR_OPT_SGD ? 1 : 2) * a.n);

    /* load into a model compiled differently (seed, learning rate) */
    castor_strategy *s2 = make_strategy(kind, devices);
    castor_optimizer other = make_opt(ok);
    other.learning_rate *= 3;
    castor_model *m2 = make_model(s2, LAYERS, other, 7);
    cr_assert_eq(castor_model_load(m2, path), CASTOR_OK, "%s", castor_model_errmsg(m2));
    snap b = take(m2);
    assert_same(&a, &b, "load");

    /* open on a fresh strategy */
    castor_model_free(m2);
    castor_model *m3 = NULL;
    cr_assert_eq(castor_model_open(&m3, path, s2), CASTOR_OK, "%s", castor_model_errmsg(m3));
    snap c = take(m3);
    assert_same(&a, &c, "open");
    cr_assert_eq(castor_model_input_features(m3), F);
    char spec[64];
    cr_assert_eq(castor_model_layers_spec(m3, spec, sizeof spec), CASTOR_OK);
    cr_assert_str_eq(spec, "16:tanh,8:relu,3:linear");

    /* saving what was loaded gives the same bytes */
    char *again = path_in(dir, "again.safetensors");
    cr_assert_eq(castor_model_save(m3, again), CASTOR_OK, "%s", castor_model_errmsg(m3));
    size_t l1, l2;
    unsigned char *b1 = slurp(path, &l1), *b2 = slurp(again, &l2);
    cr_assert(l1 == l2 && memcmp(b1, b2, l1) == 0, "a re-saved checkpoint differs");
    free(b1);
    free(b2);
    free(again);

    snap_free(&a);
    snap_free(&b);
    snap_free(&c);
    castor_model_free(m3);
    castor_model_free(m);
    castor_strategy_free(s2);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

Test(checkpoint, round_trip_central_sgd)
{
    round_trip(CASTOR_STRATEGY_CENTRAL, "cpu:2", CASTOR_OPT_SGD);
}

Test(checkpoint, round_trip_central_adam)
{
    round_trip(CASTOR_STRATEGY_CENTRAL, "cpu:2", CASTOR_OPT_ADAM);
}

Test(checkpoint, round_trip_central_adamw)
{
    round_trip(CASTOR_STRATEGY_CENTRAL, "cpu", CASTOR_OPT_ADAMW);
}

Test(checkpoint, round_trip_mirrored_sgd)
{
    round_trip(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_SGD);
}

Test(checkpoint, round_trip_mirrored_adam)
{
    round_trip(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_ADAM);
}

Test(checkpoint, round_trip_mirrored_adamw)
{
    round_trip(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_ADAMW);
}

Test(checkpoint, plain_sgd_has_no_slots)
{
    char *dir = support_tmpdir();
    char *path = path_in(dir, "sgd.safetensors");
    castor_dataset *ds = synthetic();
    castor_strategy *s = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = make_model(s, LAYERS, castor_optimizer_defaults(CASTOR_OPT_SGD), 3);
    train_steps(m, ds, 4);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor__st_file f;
    char err[256];
    cr_assert_eq(castor__st_read(path, &f, err, sizeof err), CASTOR_OK, "%s", err);
    cr_assert_eq(f.n_tensors, 6);
    castor__st_free(&f);
    /* A model with momentum keeps a slot the file lacks. */
    castor_strategy *s2 = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m2 = make_model(s2, LAYERS, make_opt(CASTOR_OPT_SGD), 3);
    cr_assert_eq(castor_model_load(m2, path), CASTOR_MISMATCH);
    cr_assert(strstr(castor_model_errmsg(m2), "slot"), "%s", castor_model_errmsg(m2));
    castor_model_free(m2);
    castor_strategy_free(s2);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/* ---- exact resume -------------------------------------------------------------------- */

/* total steps uninterrupted vs `first` steps, save, free everything, open
 * from the file on a fresh strategy, the rest: bitwise the same. */
static void resume(castor_strategy_kind kind, const char *devices, castor_optimizer_kind ok,
                   int64_t first, int64_t total)
{
    castor_dataset *ds = synthetic();
    castor_strategy *s = make_strategy(kind, devices);
    castor_model *m = make_model(s, LAYERS, make_opt(ok), 11);
    train_steps(m, ds, total);
    snap want = take(m);
    castor_model_free(m);
    castor_strategy_free(s);

    char *dir = support_tmpdir();
    char *path = path_in(dir, "resume.safetensors");
    s = make_strategy(kind, devices);
    m = make_model(s, LAYERS, make_opt(ok), 11);
    train_steps(m, ds, first);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);

    s = make_strategy(kind, devices);
    m = NULL;
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), first);
    train_steps(m, ds, total - first);
    snap got = take(m);
    assert_same(&want, &got, "resumed run");
    snap_free(&want);
    snap_free(&got);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/* 7 steps per epoch: 10 is 3 steps into the second epoch, 7 an epoch end. */
Test(checkpoint, resume_mid_epoch_central_adam)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu:2", CASTOR_OPT_ADAM, 10, 23);
}

Test(checkpoint, resume_mid_epoch_central_sgd)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu:3", CASTOR_OPT_SGD, 5, 16);
}

Test(checkpoint, resume_epoch_end_central_adamw)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu", CASTOR_OPT_ADAMW, 7, 20);
}

Test(checkpoint, resume_mid_epoch_mirrored_adam)
{
    resume(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_ADAM, 10, 23);
}

Test(checkpoint, resume_mid_epoch_mirrored_sgd)
{
    resume(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_SGD, 13, 19);
}

Test(checkpoint, resume_with_another_batch_size_is_refused)
{
    char *dir = support_tmpdir();
    char *path = path_in(dir, "b.safetensors");
    castor_dataset *ds = synthetic();
    castor_strategy *s = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = make_model(s, LAYERS, make_opt(CASTOR_OPT_ADAM), 1);
    train_steps(m, ds, 3);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    m = NULL;
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH * 2;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_MISMATCH);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/* ---- corrupt files --------------------------------------------------------------------- */

/* A checkpoint split into its header text and data section. */
typedef struct parts {
    char *header;
    unsigned char *data;
    size_t data_len;
} parts;

static parts split_file(const char *path)
{
    size_t len;
    unsigned char *b = slurp(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | b[i];
    cr_assert(hl <= len - 8);
    parts p;
    p.header = malloc(hl + 1);
    memcpy(p.header, b + 8, hl);
    p.header[hl] = '\0';
    for (size_t h = hl; h && p.header[h - 1] == ' '; h--)
        p.header[h - 1] = '\0';  /* the padding; image() adds it again */
    p.data_len = len - 8 - (size_t)hl;
    p.data = malloc(p.data_len ? p.data_len : 1);
    memcpy(p.data, b + 8 + hl, p.data_len);
    free(b);
    return p;
}

static void parts_free(parts *p)
{
    free(p->header);
    free(p->data);
}

/* Replace the one occurrence of `from` in the header with `to`. */
static void edit(parts *p, const char *from, const char *to)
{
    char *at = strstr(p->header, from);
    cr_assert(at, "'%s' not in the header", from);
    cr_assert(!strstr(at + 1, from), "'%s' is in the header twice", from);
    size_t len = strlen(p->header) - strlen(from) + strlen(to);
    char *h = malloc(len + 1);
    size_t pre = (size_t)(at - p->header);
    memcpy(h, p->header, pre);
    strcpy(h + pre, to);
    strcat(h, at + strlen(from));
    free(p->header);
    p->header = h;
}

/* Put the data section's CRC into the header (after edits to the data). */
static void fix_crc(parts *p)
{
    char *at = strstr(p->header, "\"crc32\":\"");
    cr_assert(at);
    char hex[9];
    snprintf(hex, sizeof hex, "%08lx", crc32(0, p->data, (uInt)p->data_len));
    memcpy(at + 9, hex, 8);
}

static void write_parts(const parts *p, const char *path)
{
    size_t len;
    unsigned char *b = image(p->header, p->data, p->data_len, &len);
    cr_assert_eq(support_write_file(path, b, len), 0);
    free(b);
}

typedef struct fixture {
    char *dir, *good, *bad;
    castor_dataset *ds;
    castor_strategy *s;
    castor_model *m;   /* the model a bad file is loaded into */
    snap before;
} fixture;

/* A good checkpoint (3 Adam steps, "16:tanh,8:relu,3"); a model trained
 * differently to load into. */
static void setup(fixture *fx)
{
    fx->dir = support_tmpdir();
    fx->good = path_in(fx->dir, "good.safetensors");
    fx->bad = path_in(fx->dir, "bad.safetensors");
    fx->ds = synthetic();
    castor_strategy *s = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = make_model(s, LAYERS, make_opt(CASTOR_OPT_ADAM), 42);
    train_steps(m, fx->ds, 3);
    cr_assert_eq(castor_model_save(m, fx->good), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    fx->s = make_strategy(CASTOR_STRATEGY_MIRRORED, "cpu:2");
    fx->m = make_model(fx->s, LAYERS, make_opt(CASTOR_OPT_ADAM), 9);
    train_steps(fx->m, fx->ds, 2);
    fx->before = take(fx->m);
}

static void teardown(fixture *fx)
{
    snap_free(&fx->before);
    castor_model_free(fx->m);
    castor_strategy_free(fx->s);
    castor_dataset_free(fx->ds);
    support_rmrf(fx->dir);
    free(fx->dir);
    free(fx->good);
    free(fx->bad);
}

/* Loading `path` fails with `code`, a message naming it and holding
 * `fragment`; the model is as it was; open fails the same way. */
static void expect_load_fails(fixture *fx, const char *path, int code, const char *fragment)
{
    int rc = castor_model_load(fx->m, path);
    const char *msg = castor_model_errmsg(fx->m);
    cr_assert_eq(rc, code, "load gave %d (%s), expected %d", rc, msg, code);
    cr_assert(strstr(msg, path), "the message does not name the file: %s", msg);
    cr_assert(strstr(msg, fragment), "'%s' not in: %s", fragment, msg);
    cr_assert(!strchr(msg, '\n'), "not one line: %s", msg);
    snap after = take(fx->m);
    assert_same(&fx->before, &after, "after a failed load");
    snap_free(&after);
    /* and training still works on it */
    train_steps(fx->m, fx->ds, 1);
    castor_model_free(fx->m);
    fx->m = make_model(fx->s, LAYERS, make_opt(CASTOR_OPT_ADAM), 9);
    train_steps(fx->m, fx->ds, 2);
}

/* fx->bad: fx->good changed by mutate. */
static void write_bad(fixture *fx, void (*mutate)(parts *))
{
    parts p = split_file(fx->good);
    mutate(&p);
    write_parts(&p, fx->bad);
    parts_free(&p);
}

static void corrupt_case(void (*mutate)(parts *), int code, const char *fragment)
{
    fixture fx;
    setup(&fx);
    write_bad(&fx, mutate);
    expect_load_fails(&fx, fx.bad, code, fragment);
    /* open() reports the same problem */
    castor_strategy *s = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.bad, s), code);
    cr_assert(m && strstr(castor_model_errmsg(m), fx.bad), "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    teardown(&fx);
}

Test(checkpoint, good_file_loads)
{
    fixture fx;
    setup(&fx);
    cr_assert_eq(castor_model_load(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(castor_model_step(fx.m), 3);
    teardown(&fx);
}

Test(checkpoint, truncated_file)
{
    fixture fx;
    setup(&fx);
    size_t len;
    unsigned char *b = slurp(fx.good, &len);
    cr_assert_eq(support_write_file(fx.bad, b, len - 10), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "truncated");
    cr_assert_eq(support_write_file(fx.bad, b, 6), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "truncated");
    free(b);
    teardown(&fx);
}

Test(checkpoint, empty_file)
{
    fixture fx;
    setup(&fx);
    cr_assert_eq(support_write_file(fx.bad, "", 0), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "empty file");
    teardown(&fx);
}

Test(checkpoint, directory_as_file)
{
    fixture fx;
    setup(&fx);
    expect_load_fails(&fx, fx.dir, CASTOR_IO, "directory");
    teardown(&fx);
}

Test(checkpoint, missing_file)
{
    fixture fx;
    setup(&fx);
    expect_load_fails(&fx, fx.bad, CASTOR_IO, "No such file");
    castor_model *m = NULL;
    castor_strategy *s = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    cr_assert_eq(castor_model_open(&m, fx.bad, s), CASTOR_IO);
    cr_assert(m && strstr(castor_model_errmsg(m), fx.bad), "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    teardown(&fx);
}

Test(checkpoint, header_length_past_end)
{
    fixture fx;
    setup(&fx);
    size_t len;
    unsigned char *b = slurp(fx.good, &len);
    uint64_t hl = len;  /* more than follows it */
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hl >> (8 * i));
    cr_assert_eq(support_write_file(fx.bad, b, len), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "header length");
    free(b);
    teardown(&fx);
}

static void not_json(parts *p) { p->header[1] = 'x'; }
static void wrong_dtype(parts *p)
{
    edit(p, "\"dense_0.kernel\":{\"dtype\":\"F32\"", "\"dense_0.kernel\":{\"dtype\":\"F64\"");
}
static void swapped_shape(parts *p)
{
    edit(p, "\"dense_0.kernel\":{\"dtype\":\"F32\",\"shape\":[12,16]",
         "\"dense_0.kernel\":{\"dtype\":\"F32\",\"shape\":[16,12]");
}
static void overlapping(parts *p)
{
    /* the bias moved back by 16 bytes onto the kernel; its old end leaves a hole too */
    edit(p, "\"data_offsets\":[768,832]", "\"data_offsets\":[752,816]");
}
static void out_of_range(parts *p)
{
    edit(p, "\"data_offsets\":[0,768]", "\"data_offsets\":[1000000,1000768]");
}
static void flipped_byte(parts *p) { p->data[p->data_len / 2] ^= 0x10; }
static void renamed_tensor(parts *p) { edit(p, "\"dense_1.bias\":", "\"dense_1.b\":"); }
/* One more F32 tensor of one zero, named json_name (as JSON string text),
 * at the end of the header and the data; the CRC made right again. */
static void append_tensor(parts *p, const char *json_name)
{
    char entry[160];
    snprintf(entry, sizeof entry, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[%zu,%zu]}}", json_name, p->data_len, p->data_len + 4);
    size_t hl = strlen(p->header);
    cr_assert_eq(p->header[hl - 1], '}');
    p->header[hl - 1] = '\0';
    char *h = malloc(hl + strlen(entry) + 1);
    strcpy(h, p->header);
    strcat(h, entry);
    free(p->header);
    p->header = h;
    p->data = realloc(p->data, p->data_len + 4);
    memset(p->data + p->data_len, 0, 4);
    p->data_len += 4;
    fix_crc(p);
}
static void extra_tensor(parts *p) { append_tensor(p, "dense_9.kernel"); }
static void bad_step(parts *p)
{
    char *at = strstr(p->header, "\"step\":\"");
    cr_assert(at);
    at[8] = '-';
}
static void other_layers(parts *p) { edit(p, "\"layers\":\"16:tanh,", "\"layers\":\"16:relu,"); }
static void other_optimizer(parts *p)
{
    edit(p, "\"optimizer\":\"adam\"", "\"optimizer\":\"adamw\"");
}
static void no_format(parts *p) { edit(p, "\"format\":", "\"formax\":"); }

Test(checkpoint, header_not_json) { corrupt_case(not_json, CASTOR_FORMAT, "not valid JSON"); }

Test(checkpoint, wrong_dtype) { corrupt_case(wrong_dtype, CASTOR_FORMAT, "dtype 'F64'"); }

Test(checkpoint, shape_mismatch)
{
    corrupt_case(swapped_shape, CASTOR_MISMATCH,
                 "tensor dense_0.kernel has shape [16,12], the model expects [12,16]");
}

Test(checkpoint, overlapping_offsets) { corrupt_case(overlapping, CASTOR_FORMAT, "overlap"); }

Test(checkpoint, out_of_range_offsets)
{
    corrupt_case(out_of_range, CASTOR_FORMAT, "past the end");
}

Test(checkpoint, flipped_data_byte) { corrupt_case(flipped_byte, CASTOR_FORMAT, "CRC-32"); }

Test(checkpoint, missing_tensor)
{
    corrupt_case(renamed_tensor, CASTOR_MISMATCH, "dense_1.bias is missing");
}

Test(checkpoint, extra_tensor)
{
    corrupt_case(extra_tensor, CASTOR_MISMATCH, "unexpected tensor 'dense_9.kernel'");
}

Test(checkpoint, bad_metadata_value) { corrupt_case(bad_step, CASTOR_FORMAT, "'step'"); }

Test(checkpoint, not_a_castor_checkpoint)
{
    corrupt_case(no_format, CASTOR_FORMAT, "not a castor checkpoint");
}

Test(checkpoint, architecture_mismatch)
{
    fixture fx;
    setup(&fx);
    write_bad(&fx, other_layers);
    expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "layers");
    write_bad(&fx, other_optimizer);
    expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "optimizer is adamw");
    /* a model of another width */
    castor_strategy *s = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = make_model(s, "32:tanh,8:relu,3", make_opt(CASTOR_OPT_ADAM), 1);
    cr_assert_eq(castor_model_load(m, fx.good), CASTOR_MISMATCH);
    cr_assert(strstr(castor_model_errmsg(m), "16:tanh"), "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    teardown(&fx);
}

Test(checkpoint, load_needs_compiled_model)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_load(m, "/nonexistent.safetensors"), CASTOR_MISUSE);
    cr_assert_eq(castor_model_save(m, "/tmp/x.safetensors"), CASTOR_MISUSE);
    cr_assert_eq(castor_model_load(NULL, "x"), CASTOR_MISUSE);
    cr_assert_eq(castor_model_open(NULL, "x", NULL), CASTOR_MISUSE);
    cr_assert_eq(castor_model_epoch(NULL), 0);
    castor_model_free(m);
}

/* ---- atomic writes ------------------------------------------------------------------------ */

Test(checkpoint, failed_save_leaves_old_file)
{
    fixture fx;
    setup(&fx);
    size_t len0;
    unsigned char *old = slurp(fx.good, &len0);

    /* a directory that does not exist */
    char *nodir = path_in(fx.dir, "no/such/dir/x.safetensors");
    cr_assert_eq(castor_model_save(fx.m, nodir), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), nodir), "%s", castor_model_errmsg(fx.m));
    free(nodir);
    /* a path that is a directory */
    char *sub = path_in(fx.dir, "sub");
    cr_assert_eq(mkdir(sub, 0755), 0);
    cr_assert_eq(castor_model_save(fx.m, sub), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), sub), "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(sub, NULL), 0);
    support_rmrf(sub);
    free(sub);

    /* a write that fails half-way (file size limit: EFBIG) over the old file */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit saved, small;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    small = saved;
    small.rlim_cur = 1000;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = castor_model_save(fx.m, fx.good);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
    cr_assert_eq(rc, CASTOR_IO, "save under a 1000-byte limit: %d %s", rc,
                 castor_model_errmsg(fx.m));
    cr_assert(strstr(castor_model_errmsg(fx.m), fx.good), "%s", castor_model_errmsg(fx.m));
    size_t len1;
    unsigned char *now = slurp(fx.good, &len1);
    cr_assert(len0 == len1 && memcmp(old, now, len0) == 0, "the old checkpoint changed");
    free(now);
    /* no temporary file left behind: only good.safetensors */
    cr_assert_eq(dir_entries(fx.dir, NULL), 1);

    /* a save that works replaces it, and the old one loaded is the old state */
    cr_assert_eq(castor_model_save(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(fx.dir, NULL), 1);
    struct stat st;
    cr_assert_eq(stat(fx.good, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0644);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.good, make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu")),
                 CASTOR_OK);
    cr_assert_eq(castor_model_step(m), 2);
    castor_strategy *ms = m->strategy;
    castor_model_free(m);
    castor_strategy_free(ms);
    free(old);
    teardown(&fx);
}

/* ---- Python ------------------------------------------------------------------------------- */

Test(checkpoint, python_safetensors_reads_it)
{
    if (system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0)
        cr_skip_test("python3 with safetensors and numpy is not available");
    fixture fx;
    setup(&fx);
    cr_assert_eq(castor_model_load(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    snap s = take(fx.m);
    /* dense_0.kernel[2][5] is params[2*16+5]; dense_1.bias[3] at 12*16+16+16*8+3;
     * adam_v of dense_0.kernel[0][1] at state[n + 1]. */
    size_t b1 = 12 * 16 + 16 + 16 * 8 + 3;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c '\n"
             "import sys, numpy as np\n"
             "from safetensors import safe_open\n"
             "from safetensors.numpy import load_file\n"
             "t = load_file(sys.argv[1])\n"
             "meta = safe_open(sys.argv[1], \"np\").metadata()\n"
             "k = t[\"dense_0.kernel\"]\n"
             "assert k.shape == (12, 16) and k.dtype == np.float32\n"
             "assert t[\"dense_2.bias.adam_m\"].shape == (3,)\n"
             "assert len(t) == 18, len(t)\n"
             "assert t[\"dense_0.kernel\"][2, 5] == np.float32(%.9g), t[\"dense_0.kernel\"][2, 5]\n"
             "assert t[\"dense_1.bias\"][3] == np.float32(%.9g)\n"
             "assert t[\"dense_0.kernel.adam_v\"][0, 1] == np.float32(%.9g)\n"
             "assert meta[\"format\"] == \"castor-checkpoint-1\" and meta[\"step\"] == \"3\"\n"
             "assert meta[\"layers\"] == \"16:tanh,8:relu,3:linear\"\n"
             "' '%s'",
             (double)s.params[2 * 16 + 5], (double)s.params[b1], (double)s.state[s.n + 1],
             fx.good);
    cr_assert_eq(system(cmd), 0, "python3 could not read the checkpoint as expected");
    snap_free(&s);
    teardown(&fx);
}

/* ---- metadata that lies about sizes and positions (review findings) ---------------------- */

static void huge_step(parts *p)
{
    char *at = strstr(p->header, "\"step\":\"");
    cr_assert(at);
    char *end = strchr(at + 8, '"');
    size_t old = (size_t)(end - (at + 8));
    char *h = malloc(strlen(p->header) + 32);
    memcpy(h, p->header, (size_t)(at + 8 - p->header));
    strcpy(h + (at + 8 - p->header), "9223372036854775807");
    strcat(h, at + 8 + old);
    free(p->header);
    p->header = h;
}
static void nesterov_seven(parts *p) { edit(p, "\"nesterov\":\"0\"", "\"nesterov\":\"7\""); }
static void huge_input(parts *p)
{
    edit(p, "\"input_features\":\"12\"", "\"input_features\":\"20000000\"");
}

Test(checkpoint, step_past_what_a_checkpoint_name_holds)
{
    /* INT64_MAX passed before, and training on from it overflowed. */
    corrupt_case(huge_step, CASTOR_FORMAT, "'step'");
}

Test(checkpoint, nesterov_must_be_0_or_1)
{
    /* '7' passed the bounded parse before: (max - digit) wrapped. */
    corrupt_case(nesterov_seven, CASTOR_FORMAT, "'nesterov'");
}

/* castor_model_open on fx.good changed by mutate fails with CASTOR_FORMAT,
 * naming the file, with fragment in the message; the strategy is left free
 * for a model at once (nothing was compiled onto it). */
static void open_case(void (*mutate)(parts *), const char *fragment)
{
    fixture fx;
    setup(&fx);
    write_bad(&fx, mutate);
    castor_strategy *s = make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.bad, s), CASTOR_FORMAT, "%s",
                 castor_model_errmsg(m));
    const char *msg = castor_model_errmsg(m);
    cr_assert(strstr(msg, fx.bad) && strstr(msg, fragment), "%s", msg);
    castor_model_free(m);
    castor_model *ok = make_model(s, LAYERS, make_opt(CASTOR_OPT_ADAM), 1);
    castor_model_free(ok);
    castor_strategy_free(s);
    teardown(&fx);
}

static void wider_first_layer(parts *p)
{
    edit(p, "\"layers\":\"16:tanh,", "\"layers\":\"4096:tanh,");
}

Test(checkpoint, open_bad_input_features_is_a_format_error)
{
    open_case(huge_input, "bad architecture");
}

Test(checkpoint, open_holds_the_metadata_to_the_tensors_before_allocating)
{
    /* A few bytes of metadata asking for a much larger model: open refuses
     * it from the tensors' sizes before compile allocates for it. */
    open_case(wider_first_layer, "the tensors hold");
}

/* Text from the file reaches messages escaped: no terminal control codes. */
static void escape_in_format(parts *p)
{
    edit(p, "\"format\":\"castor-checkpoint-1\"", "\"format\":\"\\u001b[2J\\u001b[31mpwned\\n\"");
}
static void escape_in_tensor_name(parts *p) { append_tensor(p, "x\\u001b[31m\\r"); }

static void expect_escaped(void (*mutate)(parts *), int code)
{
    fixture fx;
    setup(&fx);
    write_bad(&fx, mutate);
    int rc = castor_model_load(fx.m, fx.bad);
    const char *msg = castor_model_errmsg(fx.m);
    cr_assert_eq(rc, code, "%s", msg);
    for (const char *c = msg; *c; c++)
        cr_assert((unsigned char)*c >= 0x20 && *c != 0x7f, "control byte %#x in: %s",
                  (unsigned char)*c, msg);
    cr_assert(strstr(msg, "\\x1b"), "the escape is shown as text: %s", msg);
    teardown(&fx);
}

Test(checkpoint, file_text_in_messages_is_escaped)
{
    expect_escaped(escape_in_format, CASTOR_FORMAT);
    expect_escaped(escape_in_tensor_name, CASTOR_MISMATCH);
}
