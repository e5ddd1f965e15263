/*
 * Page-locked host memory for the master variables and the staging buffers.
 *
 * With use_cuda, the memory comes from cudaHostAlloc (so device copies run at
 * full PCIe speed); otherwise it is memory of whole pages of its own (a
 * page shared with another buffer would be unlocked when either is freed),
 * locked with mlock.
 * When locking fails (RLIMIT_MEMLOCK, or CUDA could not pin it: then it is
 * not mlock'd either, which CUDA would not count) the buffer is still
 * returned, unlocked, with locked = 0 so the caller can warn.
 */
#ifndef CASTOR_HOST_PINNED_H
#define CASTOR_HOST_PINNED_H

#include <stddef.h>

#include "castor.h" /* status codes */

typedef struct castor__host_buf {
    void *ptr;
    size_t bytes;
    int how;     /* internal: how it was allocated, for the free */
    int locked;  /* 1 when page-locked */
} castor__host_buf;

/* Zero-filled. Returns CASTOR_OK, or CASTOR_NOMEM with buf->ptr NULL. */
int castor__host_alloc(castor__host_buf *buf, size_t bytes, int use_cuda);
void castor__host_free(castor__host_buf *buf);  /* zero struct is a no-op */

#endif
