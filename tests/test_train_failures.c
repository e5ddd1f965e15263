/*
 * Replicas whose device fails under a fit: an allocation refused after the
 * budget check leaves every replica usable, the other replicas' failures
 * are logged beside the first one's error, --tf32 without a GPU is logged,
 * and batches near INT_MAX rows grow the buffers or fail cleanly.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "src/strategy.h"
#include "support.h"

#define F 12
#define C 3

static castor_dataset *synthetic(uint64_t seed)
{
    return support_synthetic(seed, 101, F, C);
}

/* ---- a device allocation failing after the budget check ---- */

static int refuse_alloc(cdev *dev, size_t bytes, void **out)
{
    (void)bytes;
    *out = NULL;
    return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected allocation failure", dev->name);
}

/* F -> 8:relu -> 3, compiled central on cpu:2. */
static castor_model *small_model_on_cpu2(castor_strategy **s)
{
    return support_central_model(s, "cpu:2", F, "8:relu,3", 1);
}

Test(train_failures, failed_grow_leaves_replicas_usable)
{
    castor_strategy *s = NULL;
    castor_model *m = small_model_on_cpu2(&s);
    castor_dataset *ds = synthetic(6);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 8;
    fo.max_steps = 1;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));

    /* Replica 1's device refuses the larger buffers that a bigger batch needs. */
    cdev *dev1 = s->devs[1];
    const cdev_iface *real = dev1->iface;
    cdev_iface failing = *real;
    failing.alloc = refuse_alloc;
    dev1->iface = &failing;
    castor_metrics met;
    int rc = castor_model_evaluate(m, ds, 64, &met);
    cr_assert_eq(rc, CASTOR_DEVICE, "rc %d: %s", rc, castor_model_errmsg(m));
    cr_assert(strstr(castor_model_errmsg(m), "injected"), "%s", castor_model_errmsg(m));
    dev1->iface = real;

    /* The small batch that worked before must work again. */
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

static int refuse_h2d(cdev *dev, int stream, void *d_dst, const void *h_src, size_t bytes)
{
    (void)stream, (void)d_dst, (void)h_src, (void)bytes;
    return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected copy failure", dev->name);
}

typedef struct log_lines {
    char text[4][512];
    int n;
} log_lines;

static void keep_log(void *user, castor_log_level level, const char *message)
{
    log_lines *l = user;
    if (level == CASTOR_LOG_WARN && l->n < 4)
        snprintf(l->text[l->n++], sizeof l->text[0], "%s", message);
}

/* Every replica failing in one step: the first is the error, the others are
 * logged (they were dropped without a word). */
Test(train_failures, the_other_failed_replicas_are_logged)
{
    log_lines lines = {.n = 0};
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.log_fn = keep_log;
    so.log_user = &lines;
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:3", &so), CASTOR_OK);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "8:relu,3"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK);
    castor_dataset *ds = synthetic(6);
    lines.n = 0;
    const cdev_iface *real[3];
    cdev_iface failing[3];
    for (int i = 0; i < 3; i++) {
        real[i] = s->devs[i]->iface;
        failing[i] = *real[i];
        failing[i].copy_h2d = refuse_h2d;
        if (i != 1)  /* replica 1 works */
            s->devs[i]->iface = &failing[i];
    }
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 9;
    fo.max_steps = 1;
    int rc = castor_model_fit(m, ds, &fo, NULL);
    for (int i = 0; i < 3; i++)
        s->devs[i]->iface = real[i];
    cr_assert_eq(rc, CASTOR_DEVICE, "rc %d: %s", rc, castor_model_errmsg(m));
    cr_expect(strstr(castor_model_errmsg(m), "replica 0 (cpu:0): cpu:0: injected"), "%s",
              castor_model_errmsg(m));
    cr_assert_eq(lines.n, 1, "%d warnings", lines.n);
    cr_expect(strstr(lines.text[0], "replica 2 (cpu:2) failed too: cpu:2: injected"), "%s",
              lines.text[0]);
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* TF32 asked for where no replica is a GPU is not silently dropped: the
 * run is plain fp32 and the log says so (nothing said it before). */
Test(train_failures, tf32_without_a_gpu_is_logged)
{
    for (int tf32 = 0; tf32 < 2; tf32++) {
        log_lines lines = {.n = 0};
        castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
        so.log_fn = keep_log;
        so.log_user = &lines;
        so.tf32 = tf32;
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", &so), CASTOR_OK,
                     "%s", castor_strategy_errmsg(s));
        int said = 0;
        for (int i = 0; i < lines.n; i++)
            said |= strstr(lines.text[i], "tf32 has no effect here") != NULL;
        cr_expect_eq(said, tf32, "tf32 %d: %d warnings, the first: %s", tf32, lines.n,
                     lines.n ? lines.text[0] : "-");
        castor_strategy_free(s);
    }
}

Test(train_failures, rows_near_int_max_grow_the_buffers_or_fail)
{
    /* (rows + n - 1) / n overflowed for rows near INT_MAX: the replicas
     * were said to hold enough rows without growing (and a batch that size
     * was then copied into one-row buffers). Now the growth is asked for,
     * and refused by the 1 GiB budget of the emulated devices. */
    castor_strategy *s = NULL;
    castor_model *m = small_model_on_cpu2(&s);
    float x[2 * F] = {0}, out[2 * 3];
    cr_assert_eq(castor_model_predict(m, x, 2, 2, out), CASTOR_OK, "%s", castor_model_errmsg(m));
    int rc = castor__runtime_ensure_rows(m, INT_MAX);
    cr_assert_eq(rc, CASTOR_DEVICE_MEMORY, "rc %d (capacity %d rows): %s", rc,
                 m->rt->rows_capacity, castor_model_errmsg(m));
    /* The model still works at the size it had. */
    cr_assert_eq(castor_model_predict(m, x, 2, 2, out), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
}
