/* libFuzzer harness: the device-list parser behind --devices (and the
 * bench). Besides not crashing, what it accepts must be in range. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "src/device_list.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *spec = malloc(size + 1);
    if (!spec)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    castor__device_entry entries[CASTOR__MAX_REPLICAS];
    int n = -1;
    char err[256];
    if (castor__device_list_parse(spec, entries, &n, err, sizeof err) == CASTOR_OK) {
        if (n < 0 || n > CASTOR__MAX_REPLICAS)
            abort();
        for (int i = 0; i < n; i++)
            if (entries[i].replicas < 1 || entries[i].replicas > CASTOR__MAX_REPLICAS ||
                entries[i].ordinal < -1 || entries[i].ordinal > 1023 ||
                (!entries[i].cuda && entries[i].ordinal != 0) ||
                /* cpu:NxK: K replicas share each device, N * K at most the limit */
                entries[i].shared < 1 || (entries[i].cuda && entries[i].shared != 1) ||
                entries[i].replicas * entries[i].shared > CASTOR__MAX_REPLICAS)
                abort();
    } else if (n != 0 || !err[0] || strlen(err) >= sizeof err) {
        abort();
    }
    free(spec);
    return 0;
}
