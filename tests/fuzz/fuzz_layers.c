/* libFuzzer harness: the layer-spec parser behind --layers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *spec = malloc(size + 1);
    if (!spec)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    castor_model *m = NULL;
    if (castor_model_create(&m, 784) == CASTOR_OK) {
        (void)castor_model_add_layers(m, spec);
        char buf[256];
        (void)castor_model_layers_spec(m, buf, sizeof buf);
    }
    castor_model_free(m);
    free(spec);
    return 0;
}
