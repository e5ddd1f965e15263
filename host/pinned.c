#include "pinned.h"

#include <stdlib.h>
#include <string.h>

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
         * memory still works. */
        (void)cudaGetLastError();
    }
#else
    (void)use_cuda;
#endif
    /* Not pinned by CUDA (no GPU, or CUDA could not): ordinary memory
     * (pinned.h says why it is not mlock'd). */
    void *ptr = NULL;
    if (posix_memalign(&ptr, HOST_ALIGN, size) != 0)
        return CASTOR_NOMEM;
    memset(ptr, 0, size);
    *buf = (castor__host_buf){ptr, bytes, HOW_ALIGNED, 0};
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
        free(buf->ptr);
        break;
    default:
        break;  /* not ours: leaking beats freeing with the wrong allocator */
    }
    memset(buf, 0, sizeof *buf);
}
