/*
 * Training in two parts with a checkpoint between gives the bytes of training
 * straight through (castor.h).
 */
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/api/harness.h"

/* A model of its own on a strategy of its own: trained straight through,
 * and trained again in two parts with a save, and an open or a load, in
 * between. castor.h: a load takes the variables, the optimizer state and
 * the training position, "so that training goes on as it would have";
 * an epoch left part-way is finished first, over its order of samples. On
 * the same strategy the two runs make the same float operations: the same
 * bytes. */
typedef struct resume_setup {
    castor_strategy *s;
    char spec[64];
    int features, loss;
    castor_optimizer opt;
    uint64_t seed;
    castor_dataset *ds;
    castor_fit_options fo;
} resume_setup;

static castor_model *resume_model(const resume_setup *r)
{
    castor_model *m = NULL;
    int rc = castor_model_create(&m, r->features);
    expect(rc, B(CASTOR_OK), "resume: create", castor_model_errmsg(m));
    rc = castor_model_add_layers(m, r->spec);
    expect(rc, B(CASTOR_OK), "resume: add_layers", castor_model_errmsg(m));
    rc = castor_model_compile(m, r->s, (castor_loss)r->loss, &r->opt, r->seed);
    expect(rc, B(CASTOR_OK), "resume: compile", castor_model_errmsg(m));
    return m;
}

void op_resume(void)
{
    static const char *const devices[] = {"cpu:1", "cpu:2", "cpu:1x2"};
    static const char *const acts[] = {"linear", "relu", "tanh", "sigmoid"};
    unsigned b0 = u8(), b1 = u8(), b2 = u8(), b3 = u8(), b4 = u8();
    resume_setup r;
    memset(&r, 0, sizeof r);
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.host_threads = 1 + (int)((b0 >> 3) & 1);
    int replicas = b0 % 3 ? 2 : 1;
    int rc = castor_strategy_create(&r.s, (castor_strategy_kind)((b0 >> 2) & 1),
                                    devices[b0 % 3], &so);
    expect(rc, B(CASTOR_OK), "resume: strategy", castor_strategy_errmsg(r.s));
    r.features = 1 + (int)(b1 % 4);
    r.loss = (int)(b2 & 1);
    int outs = r.loss == CASTOR_LOSS_SOFTMAX_XENT ? 2 + (int)((b2 >> 1) % 3)
                                                   : 1 + (int)((b2 >> 1) % 3);
    snprintf(r.spec, sizeof r.spec, "%d:%s,%d", 1 + (int)((b1 >> 2) % 6), acts[(b1 >> 5) & 3],
             outs);
    r.opt = castor_optimizer_defaults((castor_optimizer_kind)((b2 >> 3) % 3));
    if (r.opt.kind == CASTOR_OPT_SGD) {
        static const float moms[] = {0.0f, 0.5f, 0.9f, 0.0f};
        r.opt.momentum = moms[(b2 >> 5) & 3];
        r.opt.nesterov = r.opt.momentum != 0 && (b2 & 0x80);
    }
    r.seed = b4;
    size_t n = 2 + b3 % 8;
    float x[MAX_N * MAX_F], t[MAX_N * 4];
    int32_t y[MAX_N];
    for (size_t i = 0; i < n * (size_t)r.features; i++)
        x[i] = unit();
    for (size_t i = 0; i < n; i++)
        y[i] = (int32_t)(u8() % (unsigned)outs);
    for (size_t i = 0; i < n * (size_t)outs; i++)
        t[i] = unit();
    rc = castor_dataset_from_memory(&r.ds, x, n, r.features,
                                    r.loss == CASTOR_LOSS_SOFTMAX_XENT ? y : NULL,
                                    r.loss == CASTOR_LOSS_SOFTMAX_XENT ? NULL : t, outs);
    expect(rc, B(CASTOR_OK), "resume: from_memory", castor_dataset_errmsg(r.ds));
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = replicas + (int)((b3 >> 3) % (n - (size_t)replicas + 1));
    fo.epochs = 1 + (int)((b3 >> 6) % 3);
    fo.shuffle = (int)(b4 & 1);
    int64_t spe = (int64_t)((n + (size_t)fo.batch_size - 1) / (size_t)fo.batch_size);
    int64_t total = spe * fo.epochs;
    int64_t split = 1 + (int64_t)(u8() % (unsigned)total);
    int how = (int)(u8() & 1);

    /* Straight through. */
    castor_model *a = resume_model(&r);
    rc = castor_model_fit(a, r.ds, &fo, NULL);
    expect(rc, B(CASTOR_OK), "resume: fit", castor_model_errmsg(a));
    size_t np = castor_model_num_params(a);
    float *want = malloc(np * sizeof *want), *got = malloc(np * sizeof *got);
    if (!want || !got)
        abort();
    expect(castor_model_get_params(a, want, np), B(CASTOR_OK), "resume: get", "");
    CHECK(castor_model_step(a) == total && castor_model_epoch(a) == fo.epochs, "resume: steps");
    castor_model_free(a);

    /* In two parts. */
    castor_model *b = resume_model(&r);
    castor_fit_options part = fo;
    part.max_steps = split;
    rc = castor_model_fit(b, r.ds, &part, NULL);
    expect(rc, B(CASTOR_OK), "resume: first part", castor_model_errmsg(b));
    CHECK(castor_model_step(b) == split, "resume: first part took %lld steps, not %lld",
          (long long)castor_model_step(b), (long long)split);
    char path[128];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    rc = castor_model_save(b, path);
    expect(rc, B(CASTOR_OK), "resume: save", castor_model_errmsg(b));
    castor_model_free(b);
    castor_model *c = NULL;
    if (how) {
        rc = castor_model_open(&c, path, r.s);
        expect(rc, B(CASTOR_OK), "resume: open", castor_model_errmsg(c));
    } else {
        resume_setup other = r;
        other.seed = r.seed + 1;  /* the file's seed replaces it */
        if (r.opt.kind == CASTOR_OPT_SGD && r.opt.momentum != 0)
            other.opt.momentum = 0.25f;  /* and so do its hyper-parameters */
        else
            other.opt.learning_rate *= 3;
        c = resume_model(&other);
        rc = castor_model_load(c, path);
        expect(rc, B(CASTOR_OK), "resume: load", castor_model_errmsg(c));
    }
    unlink(path);
    CHECK(castor_model_step(c) == split, "resume: loaded at step %lld, saved at %lld",
          (long long)castor_model_step(c), (long long)split);
    part = fo;
    part.epochs = fo.epochs - (int)castor_model_epoch(c);
    if (part.epochs > 0) {
        rc = castor_model_fit(c, r.ds, &part, NULL);
        expect(rc, B(CASTOR_OK), "resume: second part", castor_model_errmsg(c));
    }
    CHECK(castor_model_step(c) == total && castor_model_epoch(c) == fo.epochs &&
              castor_model_step_in_epoch(c) == 0,
          "resume: ends at step %lld epoch %lld, not %lld %d", (long long)castor_model_step(c),
          (long long)castor_model_epoch(c), (long long)total, fo.epochs);
    expect(castor_model_get_params(c, got, np), B(CASTOR_OK), "resume: get", "");
    for (size_t i = 0; i < np; i++)
        CHECK(memcmp(&want[i], &got[i], sizeof *got) == 0,
              "resume (%s, %s on %s, %s, batch %d of %zu, %d epochs, shuffle %d, split at "
              "step %lld of %lld by %s): variable %zu is %.9g, straight through %.9g",
              r.spec, castor_optimizer_kind_name(r.opt.kind),
              devices[b0 % 3], castor_strategy_kind_name(castor_strategy_get_kind(r.s)),
              fo.batch_size, n, fo.epochs, fo.shuffle, (long long)split, (long long)total,
              how ? "open" : "load", i, (double)got[i], (double)want[i]);
    free(want);
    free(got);
    castor_model_free(c);
    castor_dataset_free(r.ds);
    castor_strategy_free(r.s);
}
