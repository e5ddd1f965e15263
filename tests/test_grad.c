/*
 * Gradients of every layer, activation and loss, as computed by the replica
 * loop on the emulated device, against central finite differences of an
 * independent double-precision forward pass.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "src/rng.h"
#include "src/strategy.h"
#include "support.h"

#define ROWS 6

typedef struct net {
    castor_strategy *s;
    castor_model *m;
    float x[ROWS * 5];
    int32_t labels[ROWS];
    float targets[ROWS * 3];
} net;

static void build(net *n, castor_activation hidden, castor_activation last, castor_loss loss)
{
    cr_assert_eq(castor_strategy_create(&n->s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    cr_assert_eq(castor_model_create(&n->m, 5), CASTOR_OK);
    cr_assert_eq(castor_model_add_dense(n->m, 7, hidden), CASTOR_OK);
    cr_assert_eq(castor_model_add_dense(n->m, 4, hidden), CASTOR_OK);
    cr_assert_eq(castor_model_add_dense(n->m, 3, last), CASTOR_OK);
    castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    cr_assert_eq(castor_model_compile(n->m, n->s, loss, &sgd, 7), CASTOR_OK, "%s",
                 castor_model_errmsg(n->m));
    castor__rng rng;
    castor__rng_seed(&rng, 99, 5, 0);
    for (int i = 0; i < ROWS * 5; i++)
        n->x[i] = 2.0f * castor__rng_uniform(&rng) - 1.0f;
    for (int i = 0; i < ROWS; i++)
        n->labels[i] = (int32_t)castor__rng_below(&rng, 3);
    for (int i = 0; i < ROWS * 3; i++)
        n->targets[i] = castor__rng_uniform(&rng);
    /* Biases away from zero so their gradients are exercised too. */
    float *p = n->m->params.ptr;
    for (int l = 0; l < n->m->n_layers; l++)
        for (int j = 0; j < n->m->layers[l].out; j++)
            p[n->m->layers[l].b_off + (size_t)j] = 0.2f * castor__rng_uniform(&rng) - 0.1f;
}


/* Mean loss over the rows, all in double. */
static double ref_loss(const net *n, const double *params)
{
    const castor_model *m = n->m;
    double total = 0;
    for (int r = 0; r < ROWS; r++) {
        double in[16], out[16];
        for (int i = 0; i < 5; i++)
            in[i] = n->x[r * 5 + i];
        for (int l = 0; l < m->n_layers; l++) {
            const castor__layer *lay = &m->layers[l];
            for (int o = 0; o < lay->out; o++) {
                double z = params[lay->b_off + (size_t)o];
                for (int i = 0; i < lay->in; i++)
                    z += in[i] * params[lay->w_off + (size_t)i * (size_t)lay->out + (size_t)o];
                out[o] = support_activation(lay->act, z);
            }
            memcpy(in, out, sizeof in);
        }
        if (m->loss == CASTOR_LOSS_SOFTMAX_XENT) {
            double mx = in[0], s = 0;
            for (int o = 1; o < 3; o++)
                mx = fmax(mx, in[o]);
            for (int o = 0; o < 3; o++)
                s += exp(in[o] - mx);
            total += log(s) + mx - in[n->labels[r]];
        } else {
            double s = 0;
            for (int o = 0; o < 3; o++)
                s += (in[o] - n->targets[r * 3 + o]) * (in[o] - n->targets[r * 3 + o]);
            total += s / 3;
        }
    }
    return total / ROWS;
}

/* The gradient and mean loss as the library computes them. */
static double lib_grads(net *n, float *grads)
{
    castor_model *m = n->m;
    cr_assert_eq(castor__runtime_ensure_training(m, ROWS), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor__replica *r = &m->rt->reps[0];
    r->offset = 0;
    r->rows = ROWS;
    int loss_mse = m->loss == CASTOR_LOSS_MSE;
    cr_assert_eq(castor__replica_upload_params(r, m, m->params.ptr), CASTOR_OK);
    cr_assert_eq(castor__replica_upload_batch(r, m, n->x, loss_mse ? NULL : n->labels,
                                              loss_mse ? n->targets : NULL),
                 CASTOR_OK);
    cr_assert_eq(castor__replica_compute(r, m, 1, 1.0f / ROWS), CASTOR_OK, "%s", r->dev->errmsg);
    cr_assert_eq(castor__replica_download_grads(r, m), CASTOR_OK);
    cr_assert_eq(castor__replica_finish(r, m, NULL), CASTOR_OK);
    memcpy(grads, r->h_grads.ptr, m->n_params * sizeof(float));
    double loss, correct;
    castor__replica_stats(r, &loss, &correct);
    return loss / ROWS;
}

static void check(castor_activation hidden, castor_activation last, castor_loss loss)
{
    net n;
    build(&n, hidden, last, loss);
    size_t np = n.m->n_params;
    float *g = calloc(np, sizeof *g);
    double *p = calloc(np, sizeof *p);
    for (size_t i = 0; i < np; i++)
        p[i] = ((float *)n.m->params.ptr)[i];
    double lib_loss = lib_grads(&n, g);
    double want_loss = ref_loss(&n, p);
    cr_assert(fabs(lib_loss - want_loss) <= 1e-5 * fmax(1.0, fabs(want_loss)),
              "loss %.9g, reference %.9g", lib_loss, want_loss);
    const double h = 1e-5;
    for (size_t i = 0; i < np; i++) {
        double keep = p[i];
        p[i] = keep + h;
        double up = ref_loss(&n, p);
        p[i] = keep - h;
        double down = ref_loss(&n, p);
        p[i] = keep;
        double fd = (up - down) / (2 * h);
        double tol = 2e-4 * fmax(fabs(fd), 1e-2);
        cr_assert(fabs(g[i] - fd) <= tol,
                  "%s/%s: parameter %zu: gradient %.8g, finite difference %.8g",
                  castor_activation_name(hidden), castor_activation_name(last), i, g[i], fd);
    }
    free(g);
    free(p);
    castor_model_free(n.m);
    castor_strategy_free(n.s);
}

Test(grad, xent_linear) { check(CASTOR_ACT_LINEAR, CASTOR_ACT_LINEAR, CASTOR_LOSS_SOFTMAX_XENT); }
Test(grad, xent_relu) { check(CASTOR_ACT_RELU, CASTOR_ACT_LINEAR, CASTOR_LOSS_SOFTMAX_XENT); }
Test(grad, xent_tanh) { check(CASTOR_ACT_TANH, CASTOR_ACT_LINEAR, CASTOR_LOSS_SOFTMAX_XENT); }
Test(grad, xent_sigmoid) { check(CASTOR_ACT_SIGMOID, CASTOR_ACT_LINEAR, CASTOR_LOSS_SOFTMAX_XENT); }
Test(grad, mse_linear) { check(CASTOR_ACT_TANH, CASTOR_ACT_LINEAR, CASTOR_LOSS_MSE); }
Test(grad, mse_sigmoid_out) { check(CASTOR_ACT_RELU, CASTOR_ACT_SIGMOID, CASTOR_LOSS_MSE); }
Test(grad, mse_tanh_out) { check(CASTOR_ACT_SIGMOID, CASTOR_ACT_TANH, CASTOR_LOSS_MSE); }
Test(grad, mse_relu_out) { check(CASTOR_ACT_TANH, CASTOR_ACT_RELU, CASTOR_LOSS_MSE); }
