/* The wrapped allocation functions of alloc_fail.h: counting, failing, and
 * a table of the blocks the armed call took. */
#include "alloc_fail.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void __real_free(void *p);
int __real_posix_memalign(void **out, size_t align, size_t size);
void *__real_aligned_alloc(size_t align, size_t size);
char *__real_strdup(const char *s);

static atomic_int armed;
static atomic_long counted;
static atomic_long fail_at;
static atomic_int fail_after;
static atomic_int fired;
static void *_Atomic fired_caller;

/* The blocks taken while armed: open addressing on the pointer, linear
 * probing, deletion by shifting back (no tombstones to pile up over the
 * thousands of rounds of a sweep). Far larger than any one call needs. */
#define SLOTS_LOG2 14
#define SLOTS ((size_t)1 << SLOTS_LOG2)
typedef struct slot {
    void *ptr;
    void *caller;
} slot;
static slot table[SLOTS];
static size_t n_live;
static atomic_size_t n_tracked;  /* n_live, for free's look without the lock */
static int overflowed;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static size_t home(const void *p)
{
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> (64 - SLOTS_LOG2));
}

static void track(void *p, void *caller)
{
    pthread_mutex_lock(&lock);
    if (n_live >= SLOTS / 2) {
        overflowed = 1;
    } else {
        size_t i = home(p);
        while (table[i].ptr)
            i = (i + 1) & (SLOTS - 1);
        table[i] = (slot){p, caller};
        atomic_store(&n_tracked, ++n_live);
    }
    pthread_mutex_unlock(&lock);
}

/* Forgets p if tracked: 1 and its caller in *caller, else 0. */
static int untrack(void *p, void **caller)
{
    if (!p || !atomic_load(&n_tracked))
        return 0;
    pthread_mutex_lock(&lock);
    size_t i = home(p);
    while (table[i].ptr && table[i].ptr != p)
        i = (i + 1) & (SLOTS - 1);
    int found = table[i].ptr == p;
    if (found) {
        if (caller)
            *caller = table[i].caller;
        /* Move back every later entry of the run that may sit in the gap. */
        for (size_t j = i;;) {
            table[i].ptr = NULL;
            size_t k;
            do {
                j = (j + 1) & (SLOTS - 1);
                if (!table[j].ptr)
                    goto done;
                k = home(table[j].ptr);
            } while (i <= j ? (i < k && k <= j) : (i < k || k <= j));
            table[i] = table[j];
            i = j;
        }
    done:
        atomic_store(&n_tracked, --n_live);
    }
    pthread_mutex_unlock(&lock);
    return found;
}

/* Counted when armed: whether this allocation is to fail. Only one thread
 * can draw the number fail_at: its caller is the one reported. */
static int should_fail(void *caller)
{
    if (!atomic_load(&armed))
        return 0;
    long k = atomic_fetch_add(&counted, 1) + 1, at = atomic_load(&fail_at);
    if (!at || k < at || (k > at && !atomic_load(&fail_after)))
        return 0;
    if (k == at) {
        atomic_store(&fired_caller, caller);
        atomic_store(&fired, 1);
    }
    errno = ENOMEM;
    return 1;
}

static void *taken(void *p, void *caller)
{
    if (p && atomic_load(&armed))
        track(p, caller);
    return p;
}

void *__wrap_malloc(size_t size)
{
    void *caller = __builtin_return_address(0);
    return should_fail(caller) ? NULL : taken(__real_malloc(size), caller);
}

void *__wrap_calloc(size_t n, size_t size)
{
    void *caller = __builtin_return_address(0);
    return should_fail(caller) ? NULL : taken(__real_calloc(n, size), caller);
}

char *__wrap_strdup(const char *s)
{
    void *caller = __builtin_return_address(0);
    return should_fail(caller) ? NULL : taken(__real_strdup(s), caller);
}

void *__wrap_aligned_alloc(size_t align, size_t size)
{
    void *caller = __builtin_return_address(0);
    return should_fail(caller) ? NULL : taken(__real_aligned_alloc(align, size), caller);
}

int __wrap_posix_memalign(void **out, size_t align, size_t size)
{
    void *caller = __builtin_return_address(0);
    if (should_fail(caller))
        return ENOMEM;
    int rc = __real_posix_memalign(out, align, size);
    if (rc == 0)
        taken(*out, caller);
    return rc;
}

/* A tracked block that moves stays tracked (grown after the armed call,
 * it is still that call's to free). */
void *__wrap_realloc(void *p, size_t size)
{
    void *caller = __builtin_return_address(0);
    if (should_fail(caller))
        return NULL;
    void *q = __real_realloc(p, size);
    if (!q && size)
        return NULL;  /* p is untouched */
    void *first = caller;
    int had = untrack(p, &first);
    if (q && (had || atomic_load(&armed)))
        track(q, atomic_load(&armed) ? caller : first);
    return q;
}

void __wrap_free(void *p)
{
    untrack(p, NULL);
    __real_free(p);
}

void alloc_arm(long at, int and_after)
{
    pthread_mutex_lock(&lock);
    memset(table, 0, sizeof table);
    n_live = 0;
    atomic_store(&n_tracked, 0);
    overflowed = 0;
    pthread_mutex_unlock(&lock);
    atomic_store(&counted, 0);
    atomic_store(&fail_at, at);
    atomic_store(&fail_after, and_after);
    atomic_store(&fired, 0);
    atomic_store(&fired_caller, NULL);
    atomic_store(&armed, 1);
}

long alloc_disarm(void)
{
    atomic_store(&armed, 0);
    return atomic_load(&counted);
}

int alloc_fired(void)
{
    return atomic_load(&fired);
}

/* "FILE+0xOFFSET" of a code address: the offset in the file that holds it,
 * which addr2line reads (the tests are position-independent). */
static void site_text(void *addr, char *buf, size_t len)
{
    Dl_info info;
    char exe[512];
    if (!addr || !dladdr(addr, &info)) {
        snprintf(buf, len, "%p", addr);
        return;
    }
    const char *file = info.dli_fname;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if ((!file || !*file || !strchr(file, '/')) && n > 0) {
        exe[n] = '\0';
        file = exe;
    }
    snprintf(buf, len, "%s+0x%lx", file ? file : "?",
             (unsigned long)((uintptr_t)addr - (uintptr_t)info.dli_fbase));
}

const char *alloc_fired_site(void)
{
    static char buf[600];
    site_text(atomic_load(&fired_caller), buf, sizeof buf);
    return buf;
}

size_t alloc_live(char *site, size_t len)
{
    pthread_mutex_lock(&lock);
    size_t n = n_live;
    void *first = NULL;
    for (size_t i = 0; i < SLOTS && !first; i++)
        if (table[i].ptr)
            first = table[i].caller;
    if (overflowed)
        n = SIZE_MAX;
    pthread_mutex_unlock(&lock);
    if (site && len) {
        if (n == SIZE_MAX)
            snprintf(site, len, "too many blocks to track");
        else if (first)
            site_text(first, site, len);
        else
            site[0] = '\0';
    }
    return n;
}
