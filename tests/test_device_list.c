/*
 * Device lists (src/device_list.c) through castor_strategy_create and the
 * parser itself: the replica limit, a GPU named twice, empty entries and
 * case, and cpu:NxK's replicas sharing a device and its budget.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "castor.h"
#include "src/device_list.h"

/* The parser fills entries[CASTOR__MAX_REPLICAS] and no more: a 65th
 * entry is refused before it is written (the replicas it would open are
 * refused later too, so only the parse itself can show the overrun). */
Test(device_list, device_list_parse_stops_at_the_replica_limit)
{
    char spec[4 * (CASTOR__MAX_REPLICAS + 1) + 1] = "";
    for (int i = 0; i < CASTOR__MAX_REPLICAS; i++)
        strcat(spec, i ? ",cpu" : "cpu");
    castor__device_entry entries[CASTOR__MAX_REPLICAS + 1];
    char err[256] = "";
    int n = -1;
    cr_assert_eq(castor__device_list_parse(spec, entries, &n, err, sizeof err), CASTOR_OK, "%s",
                 err);
    cr_assert_eq(n, CASTOR__MAX_REPLICAS);
    strcat(spec, ",cpu");
    cr_assert_eq(castor__device_list_parse(spec, entries, &n, err, sizeof err), CASTOR_INVALID);
    cr_assert_eq(n, 0);
    cr_assert(strstr(err, "too many replicas: at most 64"), "%s", err);
}

Test(device_list, a_gpu_named_twice_is_refused_before_anything_opens)
{
    /* Refused while parsing, so the same on a machine without a GPU. */
    /* The last one is cuda:1 too, written with 70 leading zeros (once read
     * as cuda:0, cut short in a 64-byte buffer). */
    const char *twice[] = {"cuda:0,cuda:0", "cuda:1x2,cuda:1", "cuda,cuda:0", "cuda:3,cpu,cuda",
                           "cuda:1,cuda:"
                           "0000000000000000000000000000000000000000000000000000000000000000000000"
                           "1x2"};
    for (size_t i = 0; i < sizeof twice / sizeof *twice; i++) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_MIRRORED, twice[i], NULL),
                     CASTOR_INVALID, "%s: %s", twice[i], castor_strategy_errmsg(s));
        cr_assert(strstr(castor_strategy_errmsg(s), "cuda:IxK"), "%s",
                  castor_strategy_errmsg(s));
        castor_strategy_free(s);
    }
}

/* The device list like the layer list: an empty entry is a mistake (",cpu"
 * and "cpu," were taken for "cpu"), and names, like the strategies', are
 * ASCII case-insensitive ("CPU:2" was unknown). */
Test(device_list, device_lists_refuse_empty_entries_and_ignore_case)
{
    const char *bad[] = {"cpu,", ",cpu", "cpu,,cpu", ",", "cpu:2,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, bad[i], NULL),
                     CASTOR_INVALID, "'%s' accepted", bad[i]);
        cr_assert(strstr(castor_strategy_errmsg(s), "empty"), "'%s': %s", bad[i],
                  castor_strategy_errmsg(s));
        castor_strategy_free(s);
    }
    const char *good[] = {"CPU", "Cpu:2", "cpu:1,CPU:2", "cpu:1x2", "CPU:2X3,cpu", "cpu:4x16"};
    const int replicas[] = {1, 2, 3, 2, 7, 64};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, good[i], NULL),
                     CASTOR_OK, "'%s': %s", good[i], castor_strategy_errmsg(s));
        cr_assert_eq(castor_strategy_replicas(s), replicas[i], "'%s'", good[i]);
        castor_strategy_free(s);
    }
}

/* cpu:NxK, the emulated twin of cuda:IxK: K replicas share each of N
 * devices and its budget; counts out of range are refused as cuda's are. */
Test(device_list, device_lists_share_emulated_devices)
{
    const char *bad[] = {"cpu:0x2", "cpu:1x0", "cpu:1x", "cpu:x2", "cpu:1x65", "cpu:8x9",
                         "cpu:1x2x2", "cpu:1y2"};
    const char *says[] = {"count after cpu:", "replica count after x", "replica count after x",
                          "count after cpu:", "replica count after x", "72 replicas, at most 64",
                          "replica count after x", "count after cpu:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, bad[i], NULL),
                     CASTOR_INVALID, "'%s' accepted", bad[i]);
        cr_assert(strstr(castor_strategy_errmsg(s), says[i]), "'%s': %s", bad[i],
                  castor_strategy_errmsg(s));
        castor_strategy_free(s);
    }
    /* Two replicas on one device of 64 MiB hold 32 MiB each: a model of
     * 34.7 MiB of variables fits cpu:2 and not cpu:1x2. */
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = (size_t)64 << 20;
    const char *lists[] = {"cpu:2", "cpu:1x2"};
    const int want[] = {CASTOR_OK, CASTOR_DEVICE_MEMORY};
    for (int i = 0; i < 2; i++) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, lists[i], &so),
                     CASTOR_OK);
        castor_model *m = NULL;
        castor_model_create(&m, 1000);
        cr_assert_eq(castor_model_add_layers(m, "9000,10"), CASTOR_OK); /* 36.4 MB */
        cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), want[i],
                     "%s: %s", lists[i], castor_model_errmsg(m));
        if (want[i])
            cr_assert(strstr(castor_model_errmsg(m), "budget is 33554432 bytes"), "%s",
                      castor_model_errmsg(m));
        castor_model_free(m);
        castor_strategy_free(s);
    }
}
