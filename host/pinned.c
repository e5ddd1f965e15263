#include "pinned.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef CASTOR_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "castor.h"

#define HOST_ALIGN 64u

enum { HOW_NONE = 0, HOW_CUDA = 1, HOW_ALIGNED = 2 };

/* A zero-byte request still gets a real buffer, so every successful
 * allocation has a pointer that can be freed and passed around. */
static size_t real_bytes(size_t bytes)
{
    return bytes ? bytes : HOST_ALIGN;
}

/* mlock and munlock act on whole pages and do not count: a buffer that
 * shared a page with another would, when freed, unlock the other's page
 * too. So a buffer to lock has whole pages of its own. */
static size_t lock_granule(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

/* n rounded up to a multiple of the power of two `to`; 0 if that overflows. */
static size_t round_up(size_t n, size_t to)
{
    return n > SIZE_MAX - (to - 1) ? 0 : (n + to - 1) & ~(to - 1);
}

int castor__host_alloc(castor__host_buf *buf, size_t bytes, int use_cuda)
{
    memset(buf, 0, sizeof *buf);
    size_t size = real_bytes(bytes);
#ifdef CASTOR_HAVE_CUDA
    if (use_cuda) {
        void *ptr = NULL;
        /* Portable: pinned for every device's context, not only the current
         * one, since each replica thread binds its own GPU. */
        if (cudaHostAlloc(&ptr, size, cudaHostAllocPortable) == cudaSuccess) {
            memset(ptr, 0, size);
            *buf = (castor__host_buf){ptr, bytes, HOW_CUDA, 1};
            return CASTOR_OK;
        }
        /* Not sticky, but the runtime keeps it as this thread's last error
         * until it is read: clear it, or the next CUDA call's check (a kernel
         * launch's cudaGetLastError) would report it as its own. Ordinary
         * locked memory still works. */
        (void)cudaGetLastError();
    }
#else
    (void)use_cuda;
#endif
    /* For a GPU only CUDA's own pinning counts: it copies from mlock'd
     * memory as from any pageable memory (staged, synchronous), so such a
     * buffer is not locked, nor called locked (the bench would report
     * pinned copies). */
    int lock = !use_cuda;
    size_t align = lock ? lock_granule() : HOST_ALIGN;
    if (lock)
        size = round_up(size, align);
    void *ptr = NULL;
    if (size == 0 || posix_memalign(&ptr, align, size) != 0)
        return CASTOR_NOMEM;
    memset(ptr, 0, size);
    int locked = lock && mlock(ptr, size) == 0;
    *buf = (castor__host_buf){ptr, bytes, HOW_ALIGNED, locked};
    return CASTOR_OK;
}

void castor__host_free(castor__host_buf *buf)
{
    if (!buf || !buf->ptr)
        return;
    switch (buf->how) {
#ifdef CASTOR_HAVE_CUDA
    case HOW_CUDA:
        if (cudaFreeHost(buf->ptr) != cudaSuccess)
            (void)cudaGetLastError();  /* nothing to report to; keep later checks clean */
        break;
#endif
    case HOW_ALIGNED:
        if (buf->locked)
            munlock(buf->ptr, round_up(real_bytes(buf->bytes), lock_granule()));
        free(buf->ptr);
        break;
    default:
        break;  /* not ours: leaking beats freeing with the wrong allocator */
    }
    memset(buf, 0, sizeof *buf);
}
