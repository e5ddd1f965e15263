/*
 * A model's variables, learning rate, run statistics, stop check and layer
 * list: set, read back, and refused where castor.h says.
 */
#include <math.h>
#include <string.h>

#include "tests/fuzz/api/harness.h"

void op_params(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    unsigned how = u8();
    size_t count = M->n_params;
    if ((how & 0x30) == 0x30)
        count = count + 1 - 2 * (how & 1) * (count > 0);
    int wild = (how & 0xc0) == 0xc0, nan_at = (how & 0x0e) == 0x0e;
    float *src = malloc((count + 1) * sizeof *src);
    float *dst = malloc((count + 1) * sizeof *dst);
    if (!src || !dst)
        abort();
    static const float odd[] = {-0.0f, 1e-40f, -1e-45f, 1e-38f};
    for (size_t i = 0; i < count; i++) {
        unsigned v = u8();
        src[i] = (v & 0xf8) == 0xf8 ? odd[v & 3] : wild ? ((float)v - 128) * 1e28f
                                                         : ((float)v - 128) / 128.0f;
    }
    if (nan_at && count)
        src[u8() % count] = how & 1 ? NAN : -INFINITY;
    float *before = NULL;
    if (M->compiled && (how & 0x80)) {
        /* get_params first, which the running call's callbacks may do too. */
        int rc = castor_model_get_params(M->h, dst, count);
        expect(rc, count == M->n_params ? B(CASTOR_OK) : B(CASTOR_INVALID), "get_params",
               mmsg(M));
    }
    if (M->compiled && count == M->n_params)
        before = get_params(M);
    unsigned want = 0;
    if (!M->compiled || model_busy(m))
        want |= B(CASTOR_MISUSE);
    if (M->compiled && (count != M->n_params || (nan_at && count)))
        want |= B(CASTOR_INVALID);
    int rc = castor_model_set_params(M->h, src, count);
    expect(rc, want ? want : B(CASTOR_OK), "set_params", mmsg(M));
    if (rc == CASTOR_OK) {
        int g = castor_model_get_params(M->h, dst, count);
        expect(g, B(CASTOR_OK), "get_params", mmsg(M));
        CHECK(memcmp(src, dst, count * sizeof *src) == 0, "get_params after set_params");
        if (wild)
            M->sane = 0;
        M->nf_params = 0;
    } else if (before) {
        check_params_unchanged(M, before, count, "a failed set_params");
    }
    free(before);
    free(src);
    free(dst);
}

void op_learning_rate(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    float lr = pick_learning_rate();
    float lr0 = castor_model_learning_rate(M->h);
    unsigned want = !M->compiled ? B(CASTOR_MISUSE)
                    : !(lr > 0) || !isfinite(lr) ? B(CASTOR_INVALID)
                                                 : B(CASTOR_OK);
    int rc = castor_model_set_learning_rate(M->h, lr);
    expect(rc, want, "set_learning_rate", mmsg(M));
    float now = castor_model_learning_rate(M->h);
    CHECK(now == (rc == CASTOR_OK ? lr : lr0), "learning_rate %g after %g", (double)now,
          (double)lr);
    if (rc == CASTOR_OK && !lr_sane(lr))
        M->sane = 0;
}

void op_stats(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    unsigned b = u8();
    if ((b & 3) == 3 && !model_busy(m)) {
        /* Not from a callback: castor.h lets those read the model only. */
        castor_model_reset_run_stats(M->h);
        M->stats_steps = 0;
        M->last_peak = 0;
        /* The count starts again from what the replicas hold: the variables. */
        if (M->compiled)
            CHECK(castor_model_device_peak_bytes(M->h) >= M->n_params * sizeof(float),
                  "peak %zu after a reset", castor_model_device_peak_bytes(M->h));
    }
    if (b & 4) {
        int finite = 7;
        int rc = castor_model_all_finite(M->h, &finite);
        expect(rc, M->compiled ? B(CASTOR_OK) : B(CASTOR_MISUSE), "all_finite", mmsg(M));
        CHECK(rc || finite == 0 || finite == 1, "finite %d", finite);
        if (rc == CASTOR_OK && finite == 1)
            M->nf_params = M->nf_state = 0;  /* whatever a load placed, it was finite */
        if (rc == CASTOR_OK && M->sane)
            CHECK(finite == 1, "a sane model is not finite");
    }
    check_stats(M);
    CHECK(castor_model_run_stats(M->h, NULL) == CASTOR_MISUSE, "run_stats(NULL)");
}

void op_stop_check(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M || model_busy(m))
        return;  /* from its own callback castor.h does not say */
    int on = (int)(u8() & 1);
    int rc = castor_model_set_stop_check(M->h, on ? stop_fn : NULL, (void *)&slot_ids[m]);
    expect(rc, B(CASTOR_OK), "set_stop_check", mmsg(M));
    M->stop_check = on;
}

void op_layers_spec(void)
{
    int m;
    hmodel *M = some_model(&m);
    if (!M)
        return;
    char full[4096], buf[80];
    int rc = castor_model_layers_spec(M->h, full, sizeof full);
    CHECK(rc == CASTOR_OK, "layers_spec %d", rc);
    size_t size = (size_t)pick(72);
    memset(buf, 'Z', sizeof buf);
    rc = castor_model_layers_spec(M->h, buf, size);
    if (size == 0) {
        CHECK(rc == CASTOR_MISUSE && buf[0] == 'Z', "layers_spec size 0: %d", rc);
    } else if (strlen(full) < size) {
        CHECK(rc == CASTOR_OK && strcmp(buf, full) == 0, "layers_spec %d '%s'", rc, buf);
    } else {
        CHECK(rc == CASTOR_INVALID && strlen(buf) == size - 1 &&
                  strncmp(buf, full, strlen(buf)) == 0,
              "layers_spec of %zu: %d '%.*s'", size, rc, (int)size, buf);
    }
    CHECK(buf[size < sizeof buf ? size : sizeof buf - 1] == 'Z' || size >= sizeof buf,
          "layers_spec wrote past its size");
    CHECK(castor_model_layers_spec(M->h, NULL, 8) == CASTOR_MISUSE, "layers_spec(NULL)");
}
