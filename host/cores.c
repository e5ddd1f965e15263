/* The cores castor may use: see cores.h. */
#include "cores.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Where cgroup v2 is mounted, and where v1's cpu controller may be. */
#define CGROUP_V2_MOUNT "/sys/fs/cgroup"
static const char *const v1_mounts[] = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct",
                                        "/sys/fs/cgroup/cpuacct,cpu"};

/* The first line of a small file, without its newline; 0 if it was read. */
static int read_line(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char *got = fgets(buf, (int)size, f);
    fclose(f);
    if (!got)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* A whole number filling s; 0 if it was one. */
static int parse_ll(const char *s, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE)
        return -1;
    *out = v;
    return 0;
}

/* Cores for quota microseconds of CPU time every period, rounded up: 1.5
 * cores' worth keeps two threads busy part of the time. 0 for no quota. */
static int quota_cores(long long quota, long long period)
{
    if (quota <= 0 || period <= 0)
        return 0;
    long long cores = quota / period + (quota % period != 0);
    return cores > INT_MAX ? INT_MAX : (int)cores;
}

/* v2: "max 100000" (no quota) or "150000 100000". */
static int v2_level(const char *dir)
{
    char path[PATH_MAX + 16], line[64], quota[32];
    long long q, period;
    if ((size_t)snprintf(path, sizeof path, "%s/cpu.max", dir) >= sizeof path ||
        read_line(path, line, sizeof line) != 0 ||
        sscanf(line, "%31s %lld", quota, &period) != 2 || parse_ll(quota, &q) != 0)
        return 0;
    return quota_cores(q, period);
}

/* v1: cpu.cfs_quota_us is -1 where there is no quota. */
static int v1_level(const char *dir)
{
    char path[PATH_MAX + 32], line[32];
    long long quota, period;
    if ((size_t)snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir) >= sizeof path ||
        read_line(path, line, sizeof line) != 0 || parse_ll(line, &quota) != 0 ||
        (size_t)snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir) >= sizeof path ||
        read_line(path, line, sizeof line) != 0 || parse_ll(line, &period) != 0)
        return 0;
    return quota_cores(quota, period);
}

/* The smallest quota from mount/cgroup up to mount itself. A cgroup path
 * that is not under the mount (a container without its own cgroup
 * namespace sees the host's path, with its own cgroup mounted as the root)
 * finds nothing below and the mount's own file at the end. */
static int walk(const char *root, const char *mount, const char *cgroup,
                int (*level)(const char *dir))
{
    char dir[PATH_MAX];
    int n = snprintf(dir, sizeof dir, "%s%s%s", root, mount, cgroup);
    if (n < 0 || (size_t)n >= sizeof dir)
        return 0;
    size_t floor = strlen(root) + strlen(mount);
    int best = 0;
    for (;;) {
        int cores = level(dir);
        if (cores > 0 && (best == 0 || cores < best))
            best = cores;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < floor)
            break;
        *slash = '\0';
    }
    return best;
}

static int has_controller(const char *list, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        size_t item = strcspn(p, ",");
        if (item == len && strncmp(p, name, len) == 0)
            return 1;
        p += item + (p[item] == ',');
    }
    return 0;
}

int castor__cgroup_cores(const char *root)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/proc/self/cgroup", root) >= sizeof path)
        return 0;
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    int best = 0;
    char line[PATH_MAX + 256];
    /* Lines are "id:controllers:path": id 0 with no controllers for v2. */
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *cgroup = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!cgroup || cgroup[1] != '/')
            continue;
        *controllers++ = '\0';
        *cgroup++ = '\0';
        if (strcmp(cgroup, "/") == 0)
            cgroup = "";  /* the root: no slash to end the mount's name with */
        int cores = 0;
        if (strcmp(line, "0") == 0 && controllers[0] == '\0') {
            cores = walk(root, CGROUP_V2_MOUNT, cgroup, v2_level);
        } else if (has_controller(controllers, "cpu")) {
            for (size_t k = 0; k < sizeof v1_mounts / sizeof v1_mounts[0] && !cores; k++)
                cores = walk(root, v1_mounts[k], cgroup, v1_level);
        }
        if (cores > 0 && (best == 0 || cores < best))
            best = cores;
    }
    fclose(f);
    return best;
}

int castor__cpu_count(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = online > 0 ? (online > INT_MAX ? INT_MAX : (int)online) : 1;
    /* A process confined by taskset or a container's cpuset gets fewer cores
     * than are online; more threads than that only adds stragglers. */
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
        int usable = CPU_COUNT(&allowed);
        if (usable > 0 && usable < cores)
            cores = usable;
    }
    int quota = castor__cgroup_cores("");
    if (quota > 0 && quota < cores)
        cores = quota;
    return cores;
}
