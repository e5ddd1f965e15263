/* libFuzzer harness: the IDX parser on arbitrary (decompressed) bytes. */
#include <stdint.h>
#include <stdlib.h>

#include "src/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    castor__idx idx;
    char err[512];
    /* A small cap keeps a lying header from costing real memory. */
    if (castor__idx_parse(data, size, "fuzz", (size_t)1 << 20, &idx, err, sizeof err) == 0) {
        volatile float sink = 0;
        for (size_t i = 0; i < idx.count; i++)
            sink += idx.values[i];
        (void)sink;
        castor__idx_free(&idx);
    }
    return 0;
}
