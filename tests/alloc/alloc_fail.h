/*
 * Failing castor's own allocations, one at a time. The alloc test binary is
 * linked with -Wl,--wrap for every allocation function castor calls (the
 * Makefile's ALLOC_WRAP): calls from castor's objects (and the tests') go
 * to the __wrap_ functions here, those of OpenBLAS, zlib, cJSON, libc and
 * Criterion (shared libraries) do not.
 *
 * Armed, the wrappers count the allocations (on every thread: the replica
 * threads allocate too), make the chosen one fail, and remember the blocks
 * the armed call took, so that a block still held once every handle is
 * freed is reported as a leak, with the line that took it, in any build
 * (LeakSanitizer, in the ASan build, sees it too, without the line).
 */
#ifndef CASTOR_TESTS_ALLOC_FAIL_H
#define CASTOR_TESTS_ALLOC_FAIL_H

#include <stddef.h>

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
void __wrap_free(void *p);
int __wrap_posix_memalign(void **out, size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);
char *__wrap_strdup(const char *s);

/* Count allocations from now on, failing the fail_at-th (1-based; 0: none),
 * and every one after it too if and_after, and tracking the blocks taken.
 * Forgets the blocks of the last round. */
void alloc_arm(long fail_at, int and_after);
/* Stop counting and failing (blocks taken stay tracked until freed); the
 * number of allocations counted since alloc_arm. */
long alloc_disarm(void);
/* Whether the armed failure happened in the last round. */
int alloc_fired(void);
/* Where the failed allocation was called from, as "FILE+0xOFFSET", for
 * messages (addr2line -fe FILE 0xOFFSET names the line). */
const char *alloc_fired_site(void);
/* Blocks taken while armed and not freed since; the first one's caller in
 * site (as alloc_fired_site) when there is one. */
size_t alloc_live(char *site, size_t len);

#endif
