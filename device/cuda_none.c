/* The CUDA entry points of a build made without nvcc: they say so. */
#include "device.h"

#include <stdio.h>

int castor__cdev_cuda_compiled(void)
{
    return 0;
}

int castor__cdev_cuda_create(int ordinal, int logical, size_t budget, int tf32, cdev **out,
                             char *err, size_t errlen)
{
    (void)ordinal, (void)logical, (void)budget, (void)tf32;
    if (out)
        *out = NULL;
    if (err && errlen)
        snprintf(err, errlen,
                 "this castor was built without CUDA (nvcc was not found at build time)");
    return CASTOR_UNSUPPORTED;
}

int castor__cdev_cuda_count(const char **why)
{
    if (why)
        *why = "built without CUDA";
    return 0;
}

int castor__cdev_cuda_info(int ordinal, castor_device_info *info)
{
    (void)ordinal, (void)info;
    return CASTOR_UNSUPPORTED;
}
