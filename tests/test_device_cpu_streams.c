/*
 * The emulated device's stream rules (device/cpu/cpu_streams.h): work runs
 * when the host synchronizes, and an access that no event orders against a
 * conflicting one on another stream is refused when it is queued. These are
 * what make a missing stream_wait in the replica loop fail here rather than
 * only on a GPU.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "tests/cpu_device_support.h"

TestSuite(cpu_streams, .init = cpu_dev_setup, .fini = cpu_dev_teardown);

#define F sizeof(float)

static cdev_event *event(void)
{
    cdev_event *ev = NULL;
    cr_assert_eq(cpu_dev->iface->event_create(cpu_dev, &ev), CASTOR_OK, "%s", cpu_dev->errmsg);
    return ev;
}

static void record(cdev_event *ev, int stream)
{
    cr_assert_eq(cpu_dev->iface->event_record(cpu_dev, ev, stream), CASTOR_OK, "%s",
                 cpu_dev->errmsg);
}

static void wait_for(int stream, cdev_event *ev)
{
    cr_assert_eq(cpu_dev->iface->stream_wait(cpu_dev, stream, ev), CASTOR_OK, "%s",
                 cpu_dev->errmsg);
}

static void sync_ok(void)
{
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK, "%s", cpu_dev->errmsg);
}

static int add(float *dst, const float *src, size_t n)
{
    return cpu_dev->iface->add(cpu_dev, dst, src, n);
}

Test(cpu_streams, an_unordered_read_of_a_copy_is_refused_naming_both)
{
    float h[4] = {1, 2, 3, 4};
    float *d = cpu_dalloc(4 * F), *sum = cpu_up((float[4]){0}, 4);
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, d, h, sizeof h), CASTOR_OK);
    cr_assert_eq(add(sum, d, 4), CASTOR_MISUSE);
    const char *msg = cpu_dev->errmsg;
    cr_assert(strstr(msg, "add on the compute stream reads 16 bytes"), "%s", msg);
    cr_assert(strstr(msg, "copy_h2d on the h2d stream writes"), "%s", msg);
    cr_assert(strstr(msg, "stream_wait"), "%s", msg);

    /* With the event a replica records after its upload, the same add is fine. */
    cdev_event *up = event();
    record(up, CDEV_STREAM_H2D);
    wait_for(CDEV_STREAM_COMPUTE, up);
    cr_assert_eq(add(sum, d, 4), CASTOR_OK, "%s", cpu_dev->errmsg);
    float *got = cpu_down(sum, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(got[i], h[i], "the refused add was not queued: element %d is %g", i,
                     (double)got[i]);
    cpu_dev->iface->event_destroy(cpu_dev, up);
    free(got);
    cpu_release(d, 4), cpu_release(sum, 4);
}

Test(cpu_streams, a_write_after_a_read_on_another_stream_needs_an_event_too)
{
    float *d = cpu_up((float[4]){1, 2, 3, 4}, 4), h[4];
    /* The copy reads d on its stream; zeroing d on the compute stream could
     * run first on a GPU and send zeros. */
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, h, d, sizeof h), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->memset0(cpu_dev, CDEV_STREAM_COMPUTE, d, 4 * F), CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "memset0 on the compute stream writes"), "%s",
              cpu_dev->errmsg);
    cr_assert(strstr(cpu_dev->errmsg, "copy_d2h on the d2h stream reads"), "%s", cpu_dev->errmsg);
    sync_ok();
    cr_assert_eq(h[3], 4.0f);
    cpu_release(d, 4);
}

Test(cpu_streams, reads_on_two_streams_and_disjoint_writes_need_no_event)
{
    float *d = cpu_up((float[8]){1, 2, 3, 4, 5, 6, 7, 8}, 8), h[4];
    float *e = cpu_dalloc(4 * F);
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, h, d, sizeof h), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->copy_d2d(cpu_dev, CDEV_STREAM_COMPUTE, e, d, 4 * F), CASTOR_OK,
                 "%s", cpu_dev->errmsg);
    /* The second half of d is no byte the copy reads. */
    cr_assert_eq(cpu_dev->iface->memset0(cpu_dev, CDEV_STREAM_COMPUTE, d + 4, 4 * F), CASTOR_OK,
                 "%s", cpu_dev->errmsg);
    sync_ok();
    float *got = cpu_down(e, 4), *rest = cpu_down(d + 4, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(h[i], (float)(i + 1));
        cr_assert_eq(got[i], (float)(i + 1));
        cr_assert_eq(rest[i], 0.0f);
    }
    free(got), free(rest);
    cpu_release(d, 8), cpu_release(e, 4);
}

Test(cpu_streams, an_event_covers_only_the_work_queued_before_it)
{
    float *a = cpu_dalloc(4 * F), *b = cpu_dalloc(4 * F), *sum = cpu_up((float[4]){0}, 4);
    float ha[4] = {1, 1, 1, 1}, hb[4] = {2, 2, 2, 2};
    cdev_event *ev = event();
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, a, ha, sizeof ha), CASTOR_OK);
    record(ev, CDEV_STREAM_H2D);
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, b, hb, sizeof hb), CASTOR_OK);
    wait_for(CDEV_STREAM_COMPUTE, ev);
    cr_assert_eq(add(sum, a, 4), CASTOR_OK, "%s", cpu_dev->errmsg);
    cr_assert_eq(add(sum, b, 4), CASTOR_MISUSE, "b was copied after the event");
    /* Recording the event again moves it; a wait queued before keeps the
     * place it was given. */
    record(ev, CDEV_STREAM_H2D);
    wait_for(CDEV_STREAM_COMPUTE, ev);
    cr_assert_eq(add(sum, b, 4), CASTOR_OK, "%s", cpu_dev->errmsg);
    float *got = cpu_down(sum, 4);
    cr_assert_eq(got[0], 3.0f);
    free(got);
    cpu_dev->iface->event_destroy(cpu_dev, ev);
    cpu_release(a, 4), cpu_release(b, 4), cpu_release(sum, 4);
}

Test(cpu_streams, ordering_carries_through_a_third_stream)
{
    /* h2d -> compute -> d2h: the download is ordered after the upload
     * because the compute stream it waits for waited for the upload. */
    float h[4] = {5, 6, 7, 8}, back[4] = {0};
    float *d = cpu_dalloc(4 * F), *scratch = cpu_dalloc(4 * F);
    cdev_event *up = event(), *done = event();
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, d, h, sizeof h), CASTOR_OK);
    record(up, CDEV_STREAM_H2D);
    wait_for(CDEV_STREAM_COMPUTE, up);
    cr_assert_eq(cpu_dev->iface->memset0(cpu_dev, CDEV_STREAM_COMPUTE, scratch, 4 * F),
                 CASTOR_OK);
    record(done, CDEV_STREAM_COMPUTE);
    wait_for(CDEV_STREAM_D2H, done);
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, back, d, sizeof back), CASTOR_OK, "%s",
                 cpu_dev->errmsg);
    sync_ok();
    cr_assert_eq(memcmp(back, h, sizeof h), 0);
    cpu_dev->iface->event_destroy(cpu_dev, up);
    cpu_dev->iface->event_destroy(cpu_dev, done);
    cpu_release(d, 4), cpu_release(scratch, 4);
}

Test(cpu_streams, results_reach_the_host_when_it_synchronizes)
{
    float *d = cpu_up((float[2]){3, 4}, 2), h[2] = {7, 7};
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, h, d, sizeof h), CASTOR_OK);
    /* A host that read h now would read what was there: so would a GPU's. */
    cr_assert_eq(h[0], 7.0f);
    sync_ok();
    cr_assert_eq(h[0], 3.0f);
    cr_assert_eq(h[1], 4.0f);
    cpu_release(d, 2);
}

Test(cpu_streams, a_copy_reads_its_source_when_it_runs)
{
    float h = 1.0f, *d = cpu_dalloc(F);
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, d, &h, F), CASTOR_OK);
    h = 2.0f;  /* changed before the copy ran: the device gets the new value */
    sync_ok();
    float *got = cpu_down(d, 1);
    cr_assert_eq(*got, 2.0f);
    free(got);
    cpu_release(d, 1);
}

Test(cpu_streams, waits_order_the_work_when_it_runs)
{
    /* Queued in one go and run at the one synchronize: upload, two adds
     * that wait for it, a download that waits for them. */
    float h[3] = {1, 2, 3}, back[3] = {0};
    float *x = cpu_dalloc(3 * F), *acc = cpu_up((float[3]){10, 20, 30}, 3);
    cdev_event *up = event(), *done = event();
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, x, h, sizeof h), CASTOR_OK);
    record(up, CDEV_STREAM_H2D);
    wait_for(CDEV_STREAM_COMPUTE, up);
    cr_assert_eq(add(acc, x, 3), CASTOR_OK, "%s", cpu_dev->errmsg);
    cr_assert_eq(add(acc, x, 3), CASTOR_OK, "%s", cpu_dev->errmsg);
    record(done, CDEV_STREAM_COMPUTE);
    wait_for(CDEV_STREAM_D2H, done);
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, back, acc, sizeof back), CASTOR_OK);
    sync_ok();
    for (int i = 0; i < 3; i++)
        cr_assert_eq(back[i], 10.0f * (float)(i + 1) + 2.0f * h[i], "element %d: %g", i,
                     (double)back[i]);
    cpu_dev->iface->event_destroy(cpu_dev, up);
    cpu_dev->iface->event_destroy(cpu_dev, done);
    cpu_release(x, 3), cpu_release(acc, 3);
}

Test(cpu_streams, freeing_memory_first_runs_the_work_queued_on_it)
{
    float *d = cpu_up((float[2]){8, 9}, 2), h[2] = {0, 0};
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, h, d, sizeof h), CASTOR_OK);
    cpu_release(d, 2);  /* as cudaFree, waits for the device */
    cr_assert_eq(h[0], 8.0f);
    cr_assert_eq(h[1], 9.0f);
}

Test(cpu_streams, a_failure_in_queued_work_drops_what_follows_and_is_reported_once)
{
    int32_t bad = 99;
    float *logits = cpu_up((float[3]){0, 0, 0}, 3), *stats = cpu_dalloc(2 * F);
    float *d = cpu_up((float[1]){1}, 1), h = 0.0f;
    void *label = cpu_dalloc(sizeof bad);
    cpu_put(label, &bad, sizeof bad);
    cr_assert_eq(cpu_dev->iface->softmax_xent(cpu_dev, logits, label, 1, 3, 1.0f, NULL, stats),
                 CASTOR_OK, "queued: the label is read when it runs");
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_COMPUTE, &h, d, F), CASTOR_OK);
    /* A free runs the work and keeps the failure for the next synchronize. */
    cpu_release(stats, 2);
    cr_assert_eq(h, 0.0f, "the copy after the failed kernel was dropped");
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_INVALID);
    cr_assert(strstr(cpu_dev->errmsg, "label 99"), "%s", cpu_dev->errmsg);
    sync_ok();
    cpu_release(logits, 3), cpu_release(d, 1);
    castor__cdev_free(cpu_dev, label, sizeof bad);
}

Test(cpu_streams, an_event_of_another_replica_is_refused)
{
    cdev *other = NULL;
    char err[128];
    cr_assert_eq(castor__cdev_cpu_create(1, 0, BUDGET, &other, err, sizeof err), CASTOR_OK);
    cdev_event *ev = NULL;
    cr_assert_eq(other->iface->event_create(other, &ev), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->event_record(cpu_dev, ev, CDEV_STREAM_H2D), CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "an event of cpu:1"), "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->stream_wait(cpu_dev, CDEV_STREAM_H2D, ev), CASTOR_MISUSE);
    other->iface->event_destroy(other, ev);
    castor__cdev_destroy(other);
}

Test(cpu_streams, a_copy_repeated_in_a_loop_stays_cheap_to_check)
{
    /* The bench times thousands of copies between one synchronize: each is
     * checked against the records of a few, not of all before it. */
    enum { N = 20000 };
    float h[16] = {0}, *d = cpu_dalloc(sizeof h);
    for (int i = 0; i < N; i++)
        cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, d, h, sizeof h), CASTOR_OK);
    sync_ok();
    cpu_release(d, 16);
}

Test(cpu_streams, records_every_stream_is_ordered_after_are_pruned_and_the_rest_kept)
{
    /* Thousands of distinct accesses in one window: those that every stream
     * has waited for are dropped when the records grow, the others still
     * refuse an unordered access. */
    enum { N = 1500 };
    float *h = malloc(2 * N * sizeof *h);
    cr_assert_not_null(h);
    for (int i = 0; i < 2 * N; i++)
        h[i] = (float)i;
    float *a = cpu_dalloc(N * F), *b = cpu_dalloc(N * F), *sum = cpu_up((float[1]){0}, 1);
    for (int i = 0; i < N; i++)
        cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, a + i, h + i, F), CASTOR_OK);
    cdev_event *up = event(), *seen = event();
    record(up, CDEV_STREAM_H2D);
    wait_for(CDEV_STREAM_COMPUTE, up);
    record(seen, CDEV_STREAM_COMPUTE);
    wait_for(CDEV_STREAM_D2H, seen);
    for (int i = 0; i < N; i++)
        cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, b + i, h + N + i, F), CASTOR_OK,
                     "%s", cpu_dev->errmsg);
    cr_assert_eq(add(sum, b, 1), CASTOR_MISUSE, "b's first copy is not waited for");
    cr_assert_eq(add(sum, b + N - 1, 1), CASTOR_MISUSE, "b's last copy is not waited for");
    cr_assert_eq(add(sum, a + N - 1, 1), CASTOR_OK, "%s", cpu_dev->errmsg);
    float *got = cpu_down(sum, 1), *gb = cpu_down(b, N);
    cr_assert_eq(*got, (float)(N - 1));
    for (int i = 0; i < N; i++)
        cr_assert_eq(gb[i], (float)(N + i), "b[%d] = %g", i, (double)gb[i]);
    free(got), free(gb), free(h);
    cpu_dev->iface->event_destroy(cpu_dev, up);
    cpu_dev->iface->event_destroy(cpu_dev, seen);
    cpu_release(a, N), cpu_release(b, N), cpu_release(sum, 1);
}

Test(cpu_streams, waiting_for_an_older_event_keeps_the_newer_order)
{
    /* CUDA allows waiting for events in any order; the older one must not
     * take back what the newer one ordered (nor the waiting stream's own
     * count of its work). */
    float *a = cpu_dalloc(2 * F), *b = cpu_dalloc(2 * F), *sum = cpu_up((float[2]){0}, 2);
    /* The copies run at the synchronize: their sources must live till then
     * (a compound literal inside cr_assert_eq ends with the macro's block). */
    const float ha[2] = {1, 2}, hb[2] = {3, 4};
    cdev_event *first = event(), *second = event();
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, a, ha, 2 * F), CASTOR_OK);
    record(first, CDEV_STREAM_H2D);
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, b, hb, 2 * F), CASTOR_OK);
    record(second, CDEV_STREAM_H2D);
    wait_for(CDEV_STREAM_COMPUTE, second);
    wait_for(CDEV_STREAM_COMPUTE, first);
    cr_assert_eq(add(sum, b, 2), CASTOR_OK, "%s", cpu_dev->errmsg);
    cr_assert_eq(add(sum, a, 2), CASTOR_OK, "%s", cpu_dev->errmsg);
    float *got = cpu_down(sum, 2);
    cr_assert(got[0] == 4.0f && got[1] == 6.0f, "%g %g", (double)got[0], (double)got[1]);
    free(got);
    cpu_dev->iface->event_destroy(cpu_dev, first);
    cpu_dev->iface->event_destroy(cpu_dev, second);
    cpu_release(a, 2), cpu_release(b, 2), cpu_release(sum, 2);
}

Test(cpu_streams, a_transposed_operand_is_checked_over_all_its_rows)
{
    /* A^T B with A stored 4 x 2 (k x m): the gemm reads all 8 floats of A,
     * its last row too, which an unordered copy is still writing. */
    float *a = cpu_up((float[8]){1, 2, 3, 4, 5, 6, 7, 8}, 8);
    float *b = cpu_up((float[4]){1, 1, 1, 1}, 4), *c = cpu_dalloc(2 * F);
    const float tail[2] = {70, 80};  /* read at the synchronize: must live till then */
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, a + 6, tail, 2 * F), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 1, 0, 2, 1, 4, 1.0f, a, 2, b, 1, 0.0f, c, 1),
                 CASTOR_MISUSE, "the gemm's read of A's last row is not ordered after the copy");
    cr_assert(strstr(cpu_dev->errmsg, "gemm on the compute stream reads"), "%s", cpu_dev->errmsg);
    cdev_event *up = event();
    record(up, CDEV_STREAM_H2D);
    wait_for(CDEV_STREAM_COMPUTE, up);
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 1, 0, 2, 1, 4, 1.0f, a, 2, b, 1, 0.0f, c, 1),
                 CASTOR_OK, "%s", cpu_dev->errmsg);
    float *got = cpu_down(c, 2);
    cr_assert(got[0] == 79.0f && got[1] == 92.0f, "%g %g", (double)got[0], (double)got[1]);
    free(got);
    cpu_dev->iface->event_destroy(cpu_dev, up);
    cpu_release(a, 8), cpu_release(b, 4), cpu_release(c, 2);
}

Test(cpu_streams, bias_grad_writes_its_sums)
{
    /* A copy still reading last step's db must be waited for before the
     * next bias_grad overwrites it. */
    float *dy = cpu_up((float[6]){1, 2, 3, 4, 5, 6}, 6), *db = cpu_up((float[2]){0}, 2), h[2];
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, h, db, sizeof h), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->bias_grad(cpu_dev, dy, db, 3, 2), CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "bias_grad on the compute stream writes"), "%s",
              cpu_dev->errmsg);
    sync_ok();
    cr_assert_eq(cpu_dev->iface->bias_grad(cpu_dev, dy, db, 3, 2), CASTOR_OK, "%s",
                 cpu_dev->errmsg);
    float *got = cpu_down(db, 2);
    cr_assert(got[0] == 9.0f && got[1] == 12.0f, "%g %g", (double)got[0], (double)got[1]);
    free(got);
    cpu_release(dy, 6), cpu_release(db, 2);
}

Test(cpu_streams, a_read_after_a_write_on_one_stream_keeps_the_write_on_record)
{
    /* Zeroed, then read, on the compute stream: the read must not take the
     * write's place among the records, or a copy reading the bytes on
     * another stream would pass unordered (read against read). */
    float *d = cpu_up((float[4]){1, 2, 3, 4}, 4), *sum = cpu_up((float[4]){0}, 4), h[4];
    cr_assert_eq(cpu_dev->iface->memset0(cpu_dev, CDEV_STREAM_COMPUTE, d, 4 * F), CASTOR_OK);
    cr_assert_eq(add(sum, d, 4), CASTOR_OK, "%s", cpu_dev->errmsg);
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, h, d, sizeof h), CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "memset0 on the compute stream writes"), "%s",
              cpu_dev->errmsg);
    sync_ok();
    cpu_release(d, 4), cpu_release(sum, 4);
}
