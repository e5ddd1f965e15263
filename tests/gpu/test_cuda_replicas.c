/*
 * More than one replica: two logical replicas sharing one GPU, and NCCL's
 * all-reduce for the mirrored strategy, on one rank and across GPUs.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "tests/gpu/gpu_support.h"
#ifdef CASTOR_HAVE_CUDA
#include "device/cuda/nccl.h"
#endif

/* Two logical replicas on one GPU: separate streams, handles and budgets. */
Test(cuda, logical_replicas_share_a_gpu)
{
    REQUIRE_GPU();
    char err[384] = "";
    cdev *r[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        cr_assert_eq(castor__cdev_cuda_create(0, k, (size_t)64 << 20, 0, &r[k], err, sizeof err),
                     CASTOR_OK, "%s", err);
    const size_t n = 1 << 20;
    float *h = alloc_floats(n), *back = alloc_floats(n);
    void *buf[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        CHECK_RC(r[k], castor__cdev_alloc(r[k], n * sizeof(float), &buf[k]));
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(k + 1);
        CHECK_RC(r[k], r[k]->iface->copy_h2d(r[k], CDEV_STREAM_H2D, buf[k], h,
                                             n * sizeof(float)));
        CHECK_RC(r[k], r[k]->iface->synchronize(r[k]));
    }
    for (int k = 0; k < 2; k++)
        CHECK_RC(r[k], r[k]->iface->add(r[k], buf[k], buf[k], n));
    for (int k = 0; k < 2; k++) {
        CHECK_RC(r[k], r[k]->iface->copy_d2h(r[k], CDEV_STREAM_COMPUTE, back, buf[k],
                                             n * sizeof(float)));
        CHECK_RC(r[k], r[k]->iface->synchronize(r[k]));
        cr_expect_eq(back[0], 2.0f * (float)(k + 1));
        cr_expect_eq(back[n - 1], 2.0f * (float)(k + 1));
        castor__cdev_free(r[k], buf[k], n * sizeof(float));
    }
    /* The second replica's budget is its own: 64 MiB, so 65 MiB fails. */
    void *big = NULL;
    cr_expect_eq(castor__cdev_alloc(r[1], (size_t)65 << 20, &big), CASTOR_DEVICE_MEMORY);
    free(h);
    free(back);
    castor__cdev_destroy(r[0]);
    castor__cdev_destroy(r[1]);
}

#ifdef CASTOR_HAVE_CUDA
/* ---- NCCL (mirrored strategy) ---- */

Test(cuda, nccl_refuses_two_ranks_on_one_gpu)
{
    REQUIRE_GPU();
    void *comms[2] = {(void *)0x1, (void *)0x1};
    char err[384] = "";
    const int dup[2] = {0, 0};
    cr_expect_eq(castor__nccl_group_create(2, dup, comms, err, sizeof err), CASTOR_INVALID);
    cr_expect(strstr(err, "one GPU") != NULL, "message: %s", err);
    cr_expect_null(comms[0]);
    cr_expect_null(comms[1]);
}

/* A hang in NCCL (its bootstrap, a collective waiting for a peer) ends the
 * test that hit it after this many seconds, not the whole GPU run: setting
 * up and summing takes seconds. */
#define NCCL_TEST_SECONDS 60

/* One rank: the sum over one replica is the buffer itself. */
Test(cuda, nccl_single_rank_allreduce, .timeout = NCCL_TEST_SECONDS)
{
    REQUIRE_GPU();
    void *comm = NULL;
    char err[384] = "";
    const int one[1] = {0};
    int rc = castor__nccl_group_create(1, one, &comm, err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "ncclCommInitAll for cuda:0: %d: %s", rc, err);
    cdev *g = NULL;
    cr_assert_eq(castor__cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_OK, "%s", err);
    const size_t n = 100003;
    uint64_t s = 17;
    float *h = rand_floats(&s, n, -1, 1), *back = alloc_floats(n);
    void *d = NULL;
    CHECK_RC(g, castor__cdev_alloc(g, n * sizeof(float), &d));
    CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_COMPUTE, d, h, n * sizeof(float)));
    CHECK_RC(g, castor__nccl_allreduce_sum(comm, g, d, n));
    CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_COMPUTE, back, d, n * sizeof(float)));
    CHECK_RC(g, g->iface->synchronize(g));
    cr_expect(memcmp(h, back, n * sizeof(float)) == 0, "one-rank all-reduce changed the data");
    cr_expect_eq(castor__nccl_allreduce_sum(NULL, g, d, n), CASTOR_MISUSE);
    castor__cdev_free(g, d, n * sizeof(float));
    castor__cdev_destroy(g);
    castor__nccl_group_free(1, &comm);
    cr_expect_null(comm);
    free(h);
    free(back);
}

typedef struct nccl_rank {
    void *comm;
    cdev *dev;
    void *d;
    size_t n;
    int rc;
} nccl_rank;

static void *nccl_rank_main(void *arg)
{
    nccl_rank *r = arg;
    r->rc = castor__nccl_allreduce_sum(r->comm, r->dev, r->d, r->n);
    if (!r->rc)
        r->rc = r->dev->iface->synchronize(r->dev);
    return NULL;
}

/* Every GPU one rank, each driven from its own thread as the replica pool
 * does: rank g holds g + 1 everywhere, so the sum is G (G + 1) / 2. */
Test(cuda, nccl_allreduce_across_gpus, .timeout = NCCL_TEST_SECONDS)
{
    REQUIRE_GPU();
    enum { MAX_G = 16 };
    int count = castor__cdev_cuda_count(NULL);
    if (count < 2)
        cr_skip_test("needs two GPUs, this machine has %d", count);
    int G = count < MAX_G ? count : MAX_G;
    int ords[MAX_G];
    void *comms[MAX_G];
    nccl_rank ranks[MAX_G];
    pthread_t th[MAX_G];
    char err[384] = "";
    for (int g = 0; g < G; g++)
        ords[g] = g;
    int rc = castor__nccl_group_create(G, ords, comms, err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "%s", err);
    const size_t n = (size_t)1 << 20;
    float *h = alloc_floats(n);
    for (int g = 0; g < G; g++) {
        ranks[g] = (nccl_rank){comms[g], NULL, NULL, n, 0};
        cr_assert_eq(castor__cdev_cuda_create(g, 0, 0, 0, &ranks[g].dev, err, sizeof err),
                     CASTOR_OK, "%s", err);
        cdev *d = ranks[g].dev;
        CHECK_RC(d, castor__cdev_alloc(d, n * sizeof(float), &ranks[g].d));
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(g + 1);
        CHECK_RC(d, d->iface->copy_h2d(d, CDEV_STREAM_COMPUTE, ranks[g].d, h, n * sizeof(float)));
        CHECK_RC(d, d->iface->synchronize(d));
    }
    for (int g = 0; g < G; g++)
        cr_assert_eq(pthread_create(&th[g], NULL, nccl_rank_main, &ranks[g]), 0);
    for (int g = 0; g < G; g++)
        pthread_join(th[g], NULL);
    const float want = (float)(G * (G + 1) / 2);
    for (int g = 0; g < G; g++) {
        cdev *d = ranks[g].dev;
        cr_expect_eq(ranks[g].rc, CASTOR_OK, "%s: %s", d->name, d->errmsg);
        CHECK_RC(d, d->iface->copy_d2h(d, CDEV_STREAM_COMPUTE, h, ranks[g].d, n * sizeof(float)));
        CHECK_RC(d, d->iface->synchronize(d));
        cr_expect_eq(h[0], want, "%s: %g, want %g", d->name, (double)h[0], (double)want);
        cr_expect_eq(h[n - 1], want, "%s: %g, want %g", d->name, (double)h[n - 1], (double)want);
        castor__cdev_free(d, ranks[g].d, n * sizeof(float));
    }
    castor__nccl_group_free(G, comms);
    for (int g = 0; g < G; g++)
        castor__cdev_destroy(ranks[g].dev);
    free(h);
}
#endif /* CASTOR_HAVE_CUDA */
