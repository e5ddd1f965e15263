/*
 * The device list that castor_strategy_create and castor bench take:
 * "cpu", "cpu:N", "cpu:NxK", "cuda", "cuda:I", "cuda:IxK", comma separated. Parsed
 * whole before anything is opened, so a bad entry late in the list costs no
 * GPU context, and by one parser so that the bench opens the very devices
 * that training does.
 */
#ifndef CASTOR_DEVICE_LIST_H
#define CASTOR_DEVICE_LIST_H

#include <stddef.h>

/* Replicas in one strategy at most: what a list may give in all, and so
 * also the most entries it may have. */
#define CASTOR__MAX_REPLICAS 64

typedef struct castor__device_entry {
    int cuda;      /* 0: emulated CPU devices */
    int ordinal;   /* the GPU; -1: every GPU ("cuda") */
    int replicas;  /* cpu:N gives N devices; cuda:IxK, K replicas on GPU I */
    int shared;    /* cpu:NxK: K replicas share each of the N devices (else 1) */
} castor__device_entry;

/*
 * spec into entries[CASTOR__MAX_REPLICAS]; *n_out is how many. A GPU
 * named twice ("cuda:0,cuda:0", "cuda,cuda:1") is refused: two entries on
 * one GPU would each count its whole memory as their own, and cuda:IxK
 * says the same thing. Returns CASTOR_OK, or CASTOR_INVALID with err saying
 * why.
 */
int castor__device_list_parse(const char *spec, castor__device_entry *entries, int *n_out,
                              char *err, size_t errlen);

#endif /* CASTOR_DEVICE_LIST_H */
