/*
 * How many cores castor's threads may use: the default number of host
 * threads, of OpenBLAS threads in the command line, and the core count that
 * castor info and the bench report.
 */
#ifndef CASTOR_HOST_CORES_H
#define CASTOR_HOST_CORES_H

/* At least 1: the cores online, fewer under taskset or a container's cpuset,
 * and fewer again under a cgroup CPU quota (docker --cpus, Kubernetes CPU
 * limits), where threads beyond the quota only get the whole group
 * throttled. */
int castor__cpu_count(void);

/* The cores a cgroup CPU quota allows this process (cgroup v2's cpu.max, or
 * v1's cpu.cfs_quota_us over cpu.cfs_period_us), rounded up: the smallest
 * along the path from its cgroup to the hierarchy's root. 0 where no quota
 * applies or none can be read. Every path read starts with root: "" on a
 * real system, a directory holding proc/self/cgroup and sys/fs/cgroup/...
 * in a test. */
int castor__cgroup_cores(const char *root);

#endif
