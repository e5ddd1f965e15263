/* What every backend shares: error text, the memory budget, destruction,
 * and the public device queries. */
#include "device.h"

#include <stdio.h>

int castor__cdev_fail(cdev *dev, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dev->errmsg, sizeof dev->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

int castor__cdev_bad_args(cdev *dev, const char *op)
{
    return castor__cdev_fail(dev, CASTOR_MISUSE,
                             "%s: %s called with a NULL buffer or negative size", dev->name, op);
}

/* A GPU backend would hand an unknown stream to the driver and fail there;
 * refusing it first keeps code tested only on CPU devices honest. */
int castor__cdev_bad_stream(cdev *dev, const char *op, int stream)
{
    return castor__cdev_fail(dev, CASTOR_MISUSE,
                             "%s: %s on stream %d, which does not exist (0..%d)", dev->name, op,
                             stream, CDEV_NUM_STREAMS - 1);
}

int castor__cdev_check_gemm(cdev *dev, int trans_a, int trans_b, int m, int n, int k,
                            const float *a, int lda, const float *b, int ldb, const float *c,
                            int ldc)
{
    if (!a || !b || !c || m < 0 || n < 0 || k < 0)
        return castor__cdev_bad_args(dev, "gemm");
    /* OpenBLAS answers a short leading dimension by printing to stdout
     * (xerbla) and cuBLAS with an error of its own: refuse it first. A
     * row-major row stride is the column-major leading dimension of the
     * transpose, so the bounds are the same for both. */
    int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return castor__cdev_fail(
            dev, CASTOR_MISUSE,
            "%s: gemm %c%c m %d n %d k %d with lda %d ldb %d ldc %d: a leading "
            "dimension is shorter than its row",
            dev->name, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, lda, ldb, ldc);
    return CASTOR_OK;
}

int castor__cdev_alloc(cdev *dev, size_t bytes, void **d_out)
{
    if (!dev)
        return CASTOR_MISUSE;
    if (!d_out)
        return castor__cdev_fail(dev, CASTOR_MISUSE,
                                 "%s: castor__cdev_alloc without a place for the pointer",
                                 dev->name);
    *d_out = NULL;
    /* Checked before asking the backend, so the emulated device refuses
     * exactly where a GPU of that size would; written as a subtraction so
     * that a huge request cannot wrap the sum round. */
    if (bytes > dev->budget || dev->used > dev->budget - bytes)
        return castor__cdev_fail(
            dev, CASTOR_DEVICE_MEMORY,
            "%s: out of device memory: need %zu more bytes, %zu held, budget %zu "
            "bytes",
            dev->name, bytes, dev->used, dev->budget);
    int rc = dev->iface->alloc(dev, bytes, d_out);
    if (rc) {
        *d_out = NULL;
        return rc;
    }
    dev->used += bytes;
    if (dev->used > dev->peak)
        dev->peak = dev->used;
    return CASTOR_OK;
}

void castor__cdev_free(cdev *dev, void *d_ptr, size_t bytes)
{
    if (!dev || !d_ptr)
        return;
    dev->iface->release(dev, d_ptr);
    /* A wrong size from a caller must not wrap `used` round to a huge
     * number that would refuse every later allocation. */
    dev->used -= bytes <= dev->used ? bytes : dev->used;
}

void castor__cdev_destroy(cdev *dev)
{
    if (dev)
        dev->iface->destroy(dev);
}

CASTOR_API int castor_cuda_device_count(const char **why)
{
    return castor__cdev_cuda_count(why);
}

CASTOR_API int castor_cuda_device_info(int ordinal, castor_device_info *info)
{
    if (!info)
        return CASTOR_MISUSE;
    return castor__cdev_cuda_info(ordinal, info);
}
