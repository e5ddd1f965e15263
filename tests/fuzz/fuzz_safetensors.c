/*
 * libFuzzer harness: the safetensors parser (src/safetensors_read.c) on bytes in
 * memory. Whatever it accepts must be safe to index: every tensor's bytes are
 * read (ASan checks the bounds) and the format's invariants are asserted;
 * whatever it refuses gets a one-line message with no control bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "src/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    castor__st_file f;
    char err[256];
    err[0] = '\0';
    int rc = castor__st_parse(data, size, "fuzz", &f, err, sizeof err);
    if (rc) {
        /* Failures say so, naming the input, in one line: whatever names the
         * input holds, no newline or other control byte reaches the message. */
        if (f.n_tensors || f.n_meta || f.tensors || f.meta || strncmp(err, "fuzz: ", 6) != 0)
            abort();
        for (const unsigned char *p = (const unsigned char *)err; *p; p++)
            if (*p < 0x20 || *p == 0x7f)
                abort();
        castor__st_free(&f);
        return 0;
    }
    if (f.data < data || f.data + f.data_len != data + size)
        abort();
    size_t covered = 0;
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const castor__st_tensor *t = &f.tensors[i];
        if (t->begin > t->end || t->end > f.data_len || t->end - t->begin != 4 * t->count ||
            t->rank < 0 || t->rank > CASTOR__ST_MAX_RANK || !t->name[0])
            abort();
        size_t count = 1;
        for (int d = 0; d < t->rank; d++)
            count *= t->shape[d];
        if (count != t->count)
            abort();
        for (size_t b = t->begin; b < t->end; b++)
            sink ^= f.data[b];
        covered += t->end - t->begin;
        if (castor__st_find(&f, t->name) != t)
            abort();
    }
    if (covered != f.data_len)
        abort();
    for (size_t i = 0; i < f.n_meta; i++)
        if (castor__st_meta_get(&f, f.meta[i].key) != f.meta[i].value)
            abort();
    (void)sink;
    castor__st_free(&f);
    return 0;
}
