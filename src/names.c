/* Version, status texts, and the names of enum values (static tables). */
#include <string.h>

#include "castor.h"
#include "device/device.h"
#include "util.h"

int castor_version_number(void)
{
    return CASTOR_VERSION_NUMBER;
}

const char *castor_version(void)
{
    return CASTOR_VERSION_STRING;
}

const char *castor_errstr(int status)
{
    switch (status) {
    case CASTOR_OK: return "not an error";
    case CASTOR_ERROR: return "error";
    case CASTOR_NOMEM: return "out of host memory";
    case CASTOR_MISUSE: return "library used wrongly (bad handle or call order)";
    case CASTOR_INVALID: return "invalid argument";
    case CASTOR_IO: return "file could not be read or written";
    case CASTOR_FORMAT: return "file is malformed, truncated or corrupt";
    case CASTOR_DEVICE: return "device error (see the message for the failing call)";
    case CASTOR_DEVICE_MEMORY: return "out of device memory (lower the batch size or the model)";
    case CASTOR_UNSUPPORTED: return "not supported by this build or machine";
    case CASTOR_INTERRUPTED: return "interrupted";
    case CASTOR_MISMATCH: return "data or file does not match the model";
    case CASTOR_NOT_DURABLE: return "file written, but its directory could not be synced (it "
                                    "may not survive a crash)";
    default: return "unknown status code";
    }
}

const char *castor_build_features(void)
{
#ifdef CASTOR_HAVE_CUDA
    return "openblas zlib cjson cuda cublas nccl";
#else
    return "openblas zlib cjson (no cuda)";
#endif
}

/* Names are matched without regard to case, as the optimizer's are
 * (host/optim.c): "Mirrored" and "ReLU" are what people type. */
static const char *const strategy_names[] = {"central", "mirrored"};
static const char *const activation_names[] = {"linear", "relu", "tanh", "sigmoid"};

const char *castor_strategy_kind_name(castor_strategy_kind kind)
{
    return (unsigned)kind < 2 ? strategy_names[kind] : "unknown";
}

int castor_strategy_kind_parse(const char *name, castor_strategy_kind *out)
{
    for (int i = 0; name && out && i < 2; i++)
        if (castor__ascii_ieq(name, strategy_names[i])) {
            *out = (castor_strategy_kind)i;
            return CASTOR_OK;
        }
    return CASTOR_INVALID;
}

const char *castor_activation_name(castor_activation act)
{
    return (unsigned)act < 4 ? activation_names[act] : "unknown";
}

int castor_activation_parse(const char *name, castor_activation *out)
{
    for (int i = 0; name && out && i < 4; i++)
        if (castor__ascii_ieq(name, activation_names[i])) {
            *out = (castor_activation)i;
            return CASTOR_OK;
        }
    return CASTOR_INVALID;
}
