/*
 * host/cores.c: the cores castor may use, and the cgroup CPU quota that
 * lowers them, read from fake /proc and /sys trees.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/cores.h"
#include "support.h"

static char *root;

static void make_root(void)
{
    root = support_tmpdir();
    cr_assert_not_null(root, "no temporary directory");
}

static void remove_root(void)
{
    support_rmrf(root);
    free(root);
}

/* Writes text to root/rel, making the directories above it. */
static void put(const char *rel, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(const char *rel, const char *fmt, ...)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

TestSuite(cores, .init = make_root, .fini = remove_root);

Test(cores, no_cgroup_files_no_quota)
{
    cr_assert_eq(castor__cgroup_cores(root), 0);
    put("proc/self/cgroup", "0::/user.slice\n");
    cr_assert_eq(castor__cgroup_cores(root), 0);
}

Test(cores, v2_quota_rounded_up)
{
    put("proc/self/cgroup", "0::/\n");
    put("sys/fs/cgroup/cpu.max", "150000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 2);
    put("sys/fs/cgroup/cpu.max", "300000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 3);
    put("sys/fs/cgroup/cpu.max", "10000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 1);
    put("sys/fs/cgroup/cpu.max", "max 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 0);
}

/* The quota of a parent limits its children: the smallest counts. */
Test(cores, v2_smallest_along_the_path)
{
    put("proc/self/cgroup", "0::/kubepods/pod1/box\n");
    put("sys/fs/cgroup/cpu.max", "max 100000\n");
    put("sys/fs/cgroup/kubepods/cpu.max", "800000 100000\n");
    put("sys/fs/cgroup/kubepods/pod1/cpu.max", "200000 100000\n");
    put("sys/fs/cgroup/kubepods/pod1/box/cpu.max", "max 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 2);
    put("sys/fs/cgroup/kubepods/pod1/box/cpu.max", "100000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 1);
}

/* A container without its own cgroup namespace reads the host's path for
 * its cgroup, which is mounted as the root: the root's quota is found. */
Test(cores, v2_path_not_under_the_mount)
{
    put("proc/self/cgroup", "0::/system.slice/docker-abc.scope\n");
    put("sys/fs/cgroup/cpu.max", "400000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 4);
}

Test(cores, v1_quota)
{
    put("proc/self/cgroup", "5:memory:/box\n4:cpu,cpuacct:/box\n0::/\n");
    put("sys/fs/cgroup/cpu,cpuacct/box/cpu.cfs_quota_us", "250000\n");
    put("sys/fs/cgroup/cpu,cpuacct/box/cpu.cfs_period_us", "100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 3);
    put("sys/fs/cgroup/cpu,cpuacct/box/cpu.cfs_quota_us", "-1\n");
    cr_assert_eq(castor__cgroup_cores(root), 0);
    /* The cpuacct controller alone sets no quota. */
    put("proc/self/cgroup", "2:cpuacct:/box\n");
    put("sys/fs/cgroup/cpu,cpuacct/box/cpu.cfs_quota_us", "100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 0);
}

/* Paths may hold spaces and colons (only the first two colons of a line
 * separate its fields). */
Test(cores, odd_characters_in_the_path)
{
    put("proc/self/cgroup", "0::/a b:c/d\n");
    put("sys/fs/cgroup/a b:c/d/cpu.max", "200000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 2);
}

/* v1, a path the mount does not hold: the mount's own quota. */
Test(cores, v1_path_not_under_the_mount)
{
    put("proc/self/cgroup", "3:cpu,cpuacct:/docker/abc\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "150000\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 2);
}

/* A hybrid system with a quota in both hierarchies: the smaller counts. */
Test(cores, v1_and_v2_together)
{
    put("proc/self/cgroup", "3:cpu:/box\n0::/box\n");
    put("sys/fs/cgroup/cpu/box/cpu.cfs_quota_us", "300000\n");
    put("sys/fs/cgroup/cpu/box/cpu.cfs_period_us", "100000\n");
    put("sys/fs/cgroup/box/cpu.max", "100000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 1);
    put("sys/fs/cgroup/box/cpu.max", "500000 100000\n");
    cr_assert_eq(castor__cgroup_cores(root), 3);
}

Test(cores, unreadable_values_are_no_quota)
{
    put("proc/self/cgroup", "0::/\n");
    const char *bad[] = {"", "\n", "abc 100000\n", "150000\n", "150000 0\n", "-5 100000\n",
                         "99999999999999999999999 100000\n"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        put("sys/fs/cgroup/cpu.max", "%s", bad[k]);
        cr_assert_eq(castor__cgroup_cores(root), 0, "cpu.max '%s'", bad[k]);
    }
    put("proc/self/cgroup", "garbage\n::\n1:cpu:relative\n");
    cr_assert_eq(castor__cgroup_cores(root), 0);
}

Test(cores, count_is_at_most_the_cores_online)
{
    int cores = castor__cpu_count();
    cr_assert_geq(cores, 1);
    cr_assert_leq(cores, sysconf(_SC_NPROCESSORS_ONLN));
    int quota = castor__cgroup_cores("");
    if (quota > 0)
        cr_assert_leq(cores, quota);
}
