/*
 * The threaded paths under ThreadSanitizer: data sets loaded at once,
 * replica threads and the host pool inside every call, several application
 * threads on separate handles at once, device faults on one replica while
 * the others run, the progress and log callbacks, checkpoints written and
 * read at once, handles freed in either order and compiled again while
 * other threads train. Prints "N passed, M failed"; a race is TSan's report
 * (halt_on_error=1 in make check-sanitize), a hang is a deadlock, which the
 * alarm below ends.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tsan.h"

static void deadlock(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: still running after 120 s: a deadlock?\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

int main(int argc, char **argv)
{
    /* The whole program takes a few seconds under TSan. */
    signal(SIGALRM, deadlock);
    alarm(120);
    static const struct {
        const char *name;
        void (*run)(void);
    } groups[] = {{"data", tsan_data_loading},
                  {"train", tsan_train},
                  {"faults", tsan_faults},
                  {"callbacks", tsan_callbacks},
                  {"checkpoints", tsan_checkpoints},
                  {"lifetimes", tsan_lifetimes}};
    for (size_t i = 0; i < sizeof groups / sizeof *groups; i++) {
        /* castor-tsan-tests NAME... runs only those groups. */
        int wanted = argc < 2;
        for (int a = 1; a < argc; a++)
            wanted |= strcmp(argv[a], groups[i].name) == 0;
        if (!wanted)
            continue;
        int failed = tsan_failures;
        groups[i].run();
        printf("%-12s %s\n", groups[i].name, tsan_failures == failed ? "ok" : "FAILED");
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", (int)tsan_passes, (int)tsan_failures);
    return tsan_failures != 0;
}
