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

struct cdev;
/*
 * Open the replicas the entries name, in list order, into
 * devs[CASTOR__MAX_REPLICAS]: one per emulated device and logical replica,
 * the devices numbered from 0 in list order, each device's cpu_budget split
 * between its K replicas (cpu:NxK); one per GPU and logical replica, with
 * cuda_budget (0: the GPU's free memory, split between its logical
 * replicas). castor_strategy_create and the bench both open through this,
 * so the bench measures the very devices that training uses. *n_out is
 * how many were opened, on failure too (the caller destroys them);
 * returns CASTOR_OK or the failing status with err saying why.
 */
int castor__devices_open(const castor__device_entry *entries, int n_entries, size_t cpu_budget,
                         size_t cuda_budget, int tf32, struct cdev **devs, int *n_out, char *err,
                         size_t errlen);

/* Where n opened replicas are, which decides mirrored's all-reduce
 * (src/mirrored.c) and the bench's bound for it. */
typedef struct castor__placement {
    int same_device;    /* all on one device: a GPU, or one emulated device (cpu:1xK) */
    int distinct_gpus;  /* all on GPUs, each on one of its own */
} castor__placement;
castor__placement castor__devices_placement(struct cdev *const *devs, int n);

#endif /* CASTOR_DEVICE_LIST_H */
