/*
 * Host memory for the master variables and the staging buffers.
 *
 * With use_cuda, the memory is pinned by cudaHostAlloc (so device copies run
 * at full PCIe speed; when CUDA cannot pin it, ordinary memory with
 * locked = 0, so the caller can warn). Without, it is ordinary 64-byte
 * aligned memory: the emulated CPU device copies with memcpy, which no lock
 * speeds up, and mlock would spend the process's RLIMIT_MEMLOCK, which the
 * embedding program may need for its own buffers.
 */
#ifndef CASTOR_HOST_PINNED_H
#define CASTOR_HOST_PINNED_H

#include <stddef.h>

#include "castor.h" /* status codes */

typedef struct castor__host_buf {
    void *ptr;
    size_t bytes;
    int how;     /* internal: how it was allocated, for the free */
    int locked;  /* 1 when pinned by CUDA */
} castor__host_buf;

/* Zero-filled. Returns CASTOR_OK, or CASTOR_NOMEM with buf->ptr NULL. */
int castor__host_alloc(castor__host_buf *buf, size_t bytes, int use_cuda);
void castor__host_free(castor__host_buf *buf);  /* zero struct is a no-op */

#endif
