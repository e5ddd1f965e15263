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
