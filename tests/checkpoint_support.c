/* The helpers declared in checkpoint_support.h. */
#include "checkpoint_support.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model.h"
#include "support.h"

castor_dataset *ckpt_synthetic(void)
{
    return support_synthetic(5, N, F, C);
}

castor_optimizer ckpt_make_opt(castor_optimizer_kind kind)
{
    castor_optimizer opt = castor_optimizer_defaults(kind);
    if (kind == CASTOR_OPT_SGD) {
        opt.learning_rate = 0.05f;
        opt.momentum = 0.9f;
        opt.nesterov = 1;
    }
    return opt;
}

castor_strategy *ckpt_make_strategy(castor_strategy_kind kind, const char *devices)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, kind, devices, NULL), CASTOR_OK, "%s",
                 castor_strategy_errmsg(s));
    return s;
}

castor_model *ckpt_make_model(castor_strategy *s, const char *layers, castor_optimizer opt,
                         uint64_t seed)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, layers), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, seed), CASTOR_OK,
                 "%s", castor_model_errmsg(m));
    return m;
}

void ckpt_train_steps(castor_model *m, const castor_dataset *ds, int64_t steps)
{
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 1000;
    fo.batch_size = BATCH;
    fo.shuffle = 1;
    fo.max_steps = steps;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
}

snap ckpt_take(castor_model *m)
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

void ckpt_snap_free(snap *s)
{
    free(s->params);
    free(s->state);
}

void ckpt_assert_same(const snap *a, const snap *b, const char *what)
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

char *ckpt_path_in(const char *dir, const char *name)
{
    size_t len = strlen(dir) + strlen(name) + 2;
    char *p = malloc(len);
    snprintf(p, len, "%s/%s", dir, name);
    return p;
}

unsigned char *ckpt_slurp(const char *path, size_t *len)
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

unsigned char *ckpt_image(const char *header, const void *data, size_t data_len, size_t *len)
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

void ckpt_setup(fixture *fx)
{
    fx->dir = support_tmpdir();
    fx->good = ckpt_path_in(fx->dir, "good.safetensors");
    fx->bad = ckpt_path_in(fx->dir, "bad.safetensors");
    fx->ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 42);
    ckpt_train_steps(m, fx->ds, 3);
    cr_assert_eq(castor_model_save(m, fx->good), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    fx->s = ckpt_make_strategy(CASTOR_STRATEGY_MIRRORED, "cpu:2");
    fx->m = ckpt_make_model(fx->s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 9);
    ckpt_train_steps(fx->m, fx->ds, 2);
    fx->before = ckpt_take(fx->m);
}

void ckpt_teardown(fixture *fx)
{
    ckpt_snap_free(&fx->before);
    castor_model_free(fx->m);
    castor_strategy_free(fx->s);
    castor_dataset_free(fx->ds);
    support_rmrf(fx->dir);
    free(fx->dir);
    free(fx->good);
    free(fx->bad);
}

parts ckpt_split_file(const char *path)
{
    size_t len;
    unsigned char *b = ckpt_slurp(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | b[i];
    cr_assert(hl <= len - 8);
    parts p;
    p.header = malloc(hl + 1);
    memcpy(p.header, b + 8, hl);
    p.header[hl] = '\0';
    for (size_t h = hl; h && p.header[h - 1] == ' '; h--)
        p.header[h - 1] = '\0';  /* the padding; ckpt_image() adds it again */
    p.data_len = len - 8 - (size_t)hl;
    p.data = malloc(p.data_len ? p.data_len : 1);
    memcpy(p.data, b + 8 + hl, p.data_len);
    free(b);
    return p;
}

void ckpt_parts_free(parts *p)
{
    free(p->header);
    free(p->data);
}

void ckpt_edit(parts *p, const char *from, const char *to)
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

static void write_parts(const parts *p, const char *path)
{
    size_t len;
    unsigned char *b = ckpt_image(p->header, p->data, p->data_len, &len);
    cr_assert_eq(support_write_file(path, b, len), 0);
    free(b);
}

void ckpt_expect_load_fails(fixture *fx, const char *path, int code, const char *fragment)
{
    int rc = castor_model_load(fx->m, path);
    const char *msg = castor_model_errmsg(fx->m);
    cr_assert_eq(rc, code, "load gave %d (%s), expected %d", rc, msg, code);
    cr_assert(strstr(msg, path), "the message does not name the file: %s", msg);
    cr_assert(strstr(msg, fragment), "'%s' not in: %s", fragment, msg);
    cr_assert(!strchr(msg, '\n'), "not one line: %s", msg);
    snap after = ckpt_take(fx->m);
    ckpt_assert_same(&fx->before, &after, "after a failed load");
    ckpt_snap_free(&after);
    /* and training still works on it */
    ckpt_train_steps(fx->m, fx->ds, 1);
    castor_model_free(fx->m);
    fx->m = ckpt_make_model(fx->s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 9);
    ckpt_train_steps(fx->m, fx->ds, 2);
}

void ckpt_write_bad(fixture *fx, void (*mutate)(parts *))
{
    parts p = ckpt_split_file(fx->good);
    mutate(&p);
    write_parts(&p, fx->bad);
    ckpt_parts_free(&p);
}

void ckpt_corrupt_case(void (*mutate)(parts *), int code, const char *fragment)
{
    fixture fx;
    ckpt_setup(&fx);
    ckpt_write_bad(&fx, mutate);
    ckpt_expect_load_fails(&fx, fx.bad, code, fragment);
    /* open() reports the same problem */
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.bad, s), code);
    cr_assert(m && strstr(castor_model_errmsg(m), fx.bad), "%s", castor_model_errmsg(m));
    /* The failed handle carries the message, nothing more: the strategy
     * takes another model while it lives (a file found bad after compile
     * left a model of fresh weights bound to it, which trained and saved). */
    castor_model *ok = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 1);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    cr_assert_eq(castor_model_fit(m, fx.ds, &fo, NULL), CASTOR_MISUSE);
    cr_assert_eq(castor_model_save(m, fx.bad), CASTOR_MISUSE);
    castor_model_free(ok);
    castor_model_free(m);
    castor_strategy_free(s);
    ckpt_teardown(&fx);
}
