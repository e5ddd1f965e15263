/*
 * The bench's output: the limits and two tables on stdout (what each run
 * did; how it compares with its lower bound), bench.csv (a row per run),
 * and bench.json (the configuration, the limits with every GEMM shape,
 * every run); bench.png is plot.c's.
 */
#include "bench/bench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "host/cores.h"
#include "src/atomic_file.h"
#include "src/cli/json.h"

#define MIB (1024.0 * 1024.0)

static const char *kind_name(castor_strategy_kind k)
{
    return castor_strategy_kind_name(k);
}

/* v with fmt, or "-" when it is not a finite number. */
static void fmt_num(char *buf, size_t size, const char *fmt, double v)
{
    if (isfinite(v))
        snprintf(buf, size, fmt, v);
    else
        snprintf(buf, size, "-");
}

/* ---- stdout ------------------------------------------------------------- */

void bench_print_limits(FILE *out, const bench_config *c, const bench_limits *L)
{
    char a[32], b[32];
    fprintf(out, "castor bench %s: %s on %s (%d replica%s, %s backend), %s, input %d, %d classes, "
                 "%d timed steps after %d warm-up\n\n",
            castor_version(), c->n_strategies == 2 ? "central vs mirrored"
                                                   : kind_name(c->strategies[0]),
            c->devices, c->replicas, c->replicas == 1 ? "" : "s", L->backend,
            castor_optimizer_kind_name(c->optimizer), c->input, c->classes, c->steps, c->warmup);
    fmt_num(a, sizeof a, "%.0f%%", 100.0 * c->others_before);
    fmt_num(b, sizeof b, "%.0f%%", 100.0 * c->others_during);
    /* Over the CPUs of the affinity mask, which a cgroup CPU quota does not
     * shrink: the cores castor uses may then be fewer than the CPUs looked at. */
    int cores = castor__cpu_count();
    char over[96] = "of them";
    if (c->others_cpus <= 0)  /* /proc/stat unreadable: the shares are unknown too */
        snprintf(over, sizeof over, "of its CPUs (unknown)");
    else if (c->others_cpus != cores)
        snprintf(over, sizeof over, "of the %d CPU%s it may run on", c->others_cpus,
                 c->others_cpus == 1 ? "" : "s");
    fprintf(out, "%d core%s%s; other processes used %s %s just before the bench, %s while it "
                 "ran%s\n\n",
            cores, cores == 1 ? "" : "s", cores < c->others_cpus ? " (a CPU quota's)" : "", a,
            over, b,
            c->others_during > 0.1 || c->others_before > 0.1 ? " (noisy numbers)" : "");
    fprintf(out, "limits, measured in this run (%.1f s):\n", L->seconds);
    fmt_num(a, sizeof a, "%.2f", L->h2d_one / 1e9);
    fmt_num(b, sizeof b, "%.2f", L->h2d_all / 1e9);
    fprintf(out, "  host->device     %8s GB/s one replica, %8s GB/s all %d at once  (fastest of "
                 "copies of %zu KiB .. %zu MiB%s)\n",
            a, b, L->replicas, L->copy_min_bytes >> 10, L->copy_bytes >> 20,
            L->copy_pinned ? ", pinned" : L->gpus ? ", NOT pinned" : ", emulated: memcpy");
    if (L->copy_span) {
        char llc[48] = "unknown";
        if (L->llc_bytes)
            snprintf(llc, sizeof llc, "%zu MiB", L->llc_bytes >> 20);
        fprintf(out, "                   emulated devices: each copy to the next region of %zu MiB "
                     "buffers (last-level cache %s),\n"
                     "                   not cache-hot, as a step's copies between distinct "
                     "buffers are\n",
                L->copy_span >> 20, llc);
    }
    fmt_num(a, sizeof a, "%.2f", L->d2h_one / 1e9);
    fmt_num(b, sizeof b, "%.2f", L->d2h_all / 1e9);
    fprintf(out, "  device->host     %8s GB/s one replica, %8s GB/s all %d at once\n", a, b,
            L->replicas);
    fmt_num(a, sizeof a, "%.2f", L->both_all / 1e9);
    fprintf(out, "  both directions  %8s GB/s all replicas at once, directions summed\n", a);
    fmt_num(a, sizeof a, "%.2f", L->triad_bw / 1e9);
    fprintf(out,
            "  host memory      %8s GB/s triad a=b+s*c on %d threads, 3 x %zu MiB, counted as\n"
            "                                12 bytes/element (2 reads + 1 write, no write-allocate)\n",
            a, L->host_threads, (L->triad_elems * sizeof(float)) >> 20);
    fmt_num(a, sizeof a, "%.3f", L->host_opt_rate / 1e9);
    fprintf(out, "  host optimizer   %8s G params/s (%s kernel alone, %d bytes/param)\n", a,
            castor_optimizer_kind_name(c->optimizer), bench_optimizer_bytes(c->optimizer));
    for (int i = 0; i < L->n_host_costs; i++) {
        const bench_host_cost *hc = &L->host_costs[i];
        char d[32];
        fmt_num(a, sizeof a, "%.3f", hc->reduce_s * 1e3);
        fmt_num(b, sizeof b, "%.3f", hc->opt_s * 1e3);
        fmt_num(d, sizeof d, "%.3f", hc->central_s * 1e3);
        fprintf(out, "  host step        %zu params: sum of %d gradient%s %s ms, %s update "
                "alone %s ms (reference), both in one pass (central) %s ms", hc->params,
                L->replicas, L->replicas == 1 ? "" : "s", a,
                castor_optimizer_kind_name(c->optimizer), b, d);
        if (L->cpu_devices > 0) {
            fmt_num(a, sizeof a, "%.3f", hc->replica_opt_s * 1e3);
            fprintf(out, "; %d CPU replica%s update%s at once %s ms", L->cpu_devices,
                    L->cpu_devices == 1 ? "'s" : "s'", L->cpu_devices == 1 ? "" : "s", a);
        }
        fputc('\n', out);
    }
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < L->n_gemms; i++)
        if (isfinite(L->gemms[i].gflops)) {
            lo = fmin(lo, L->gemms[i].gflops);
            hi = fmax(hi, L->gemms[i].gflops);
        }
    fmt_num(a, sizeof a, "%.1f", lo);
    fmt_num(b, sizeof b, "%.1f", hi > 0 ? hi : NAN);
    fprintf(out, "  GEMM             %8s .. %s GFLOP/s over the %d shapes of the grid (every "
                 "replica at once; each in bench.json)\n",
            a, b, L->n_gemms);
    if (L->note[0])
        fprintf(out, "  note: %s\n", L->note);
}

void bench_print_table(FILE *out, const bench_config *c, const bench_result *r, int n)
{
    (void)c;
    char s[16][32];
    fprintf(out, "\nruns (median of the timed steps; bytes and seconds per step; MB = 10^6 bytes):\n");
    fprintf(out, "%3s %-8s %6s %5s %6s %10s %9s %17s %10s %9s %9s %8s %10s %9s %9s %9s\n", "#",
            "strategy", "width", "depth", "batch", "params", "step ms", "min..max ms",
            "samples/s", "h2d MB", "d2h MB", "bus GB/s", "upd Mp/s", "dev MiB", "pin MiB",
            "RSS MiB");
    for (int i = 0; i < n; i++) {
        const bench_result *x = &r[i];
        if (!x->ok) {
            fprintf(out, "%3d %-8s %6d %5d %6d %10zu  failed: %s\n", i + 1,
                    kind_name(x->strategy), x->width, x->depth, x->batch, x->params, x->error);
            continue;
        }
        char range[48];
        snprintf(range, sizeof range, "%.2f..%.2f", x->step_min * 1e3, x->step_max * 1e3);
        fmt_num(s[0], 32, "%.3f", x->step_median * 1e3);
        fmt_num(s[1], 32, "%.0f", x->samples_per_s);
        fmt_num(s[2], 32, "%.2f", x->h2d_per_step / 1e6);
        fmt_num(s[3], 32, "%.2f", x->d2h_per_step / 1e6);
        fmt_num(s[4], 32, "%.2f", x->bus_bw / 1e9);
        fmt_num(s[5], 32, "%.1f", x->host_update_rate / 1e6);
        fmt_num(s[6], 32, "%.1f", (double)x->device_peak / MIB);
        fmt_num(s[7], 32, "%.1f", (double)x->host_pinned / MIB);
        fmt_num(s[8], 32, "%.0f", x->rss_run / MIB);
        fprintf(out, "%3d %-8s %6d %5d %6d %10zu %9s %17s %10s %9s %9s %8s %10s %9s %9s %8s%s\n",
                i + 1, kind_name(x->strategy), x->width, x->depth, x->batch, x->params, s[0],
                range, s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8],
                x->rss_run_scoped ? "" : "*");
    }
    fprintf(out,
            "  bus GB/s: (h2d + d2h) / seconds of the phases that copy (the replicas'; mirrored "
            "through the host: and\n"
            "           its update, which uploads the sum). Phase seconds are run-stats means "
            "over the timed steps.\n"
            "  upd Mp/s: parameters / seconds of the reduction and update phases (mirrored: the "
            "update (and NCCL's\n"
            "           all-reduce) runs on the devices; '-' with one replica, where it runs "
            "inside the replicas' phase).\n"
            "  dev MiB: peak device memory of one replica. pin MiB: host memory the model "
            "holds (run stats; pinned\n"
            "           by CUDA for GPUs, ordinary memory for emulated devices).\n"
            "  RSS MiB: the process's peak resident memory during the run (VmHWM reset before "
            "it%s;\n"
            "           on emulated CPU devices it includes their memory). bench.json also has "
            "the process's peak so far.\n",
            n > 0 && !r[0].rss_run_scoped ? "; * : the reset failed, peak of the process so far"
                                          : "");

    fprintf(out, "\nagainst the limits (ms per step; bound = the largest of transfer, compute, "
                 "host: no step can beat it,\neven one that overlaps all three; sum = the three "
                 "one after another, as castor's phases run):\n");
    int below = 0;
    char odd[256] = "";  /* the runs whose counted bytes are not the expected ones */
    fprintf(out, "%3s %-8s %6s %5s %6s %9s %9s %9s %10s %9s %9s %-9s %8s %9s %8s\n", "#",
            "strategy", "width", "depth", "batch", "step", "transfer", "compute", "GEMM GF/s",
            "host", "bound", "bound by", "ratio", "sum", "step/sum");
    for (int i = 0; i < n; i++) {
        const bench_result *x = &r[i];
        if (!x->ok)
            continue;
        fmt_num(s[0], 32, "%.3f", x->step_median * 1e3);
        fmt_num(s[1], 32, "%.3f", x->t_transfer * 1e3);
        fmt_num(s[2], 32, "%.3f", x->t_compute * 1e3);
        fmt_num(s[3], 32, "%.1f", x->flops / x->t_compute / 1e9);
        fmt_num(s[4], 32, "%.3f", x->t_host * 1e3);
        fmt_num(s[5], 32, "%.3f", x->lower_bound * 1e3);
        fmt_num(s[6], 32, "%.2f", x->ratio);
        fmt_num(s[7], 32, "%.3f", x->serial_bound * 1e3);
        fmt_num(s[8], 32, "%.2f", x->serial_ratio);
        fprintf(out, "%3d %-8s %6d %5d %6d %9s %9s %9s %10s %9s %9s %-9s %8s %9s %8s%s\n", i + 1,
                kind_name(x->strategy), x->width, x->depth, x->batch, s[0], s[1], s[2], s[3],
                s[4], s[5], x->bound_by, s[6], s[7], s[8], x->ratio < 1.0 ? " !" : "");
        below += x->ratio < 1.0;
        size_t len = strlen(odd);
        if (!x->bytes_as_expected && len + 16 < sizeof odd)
            snprintf(odd + len, sizeof odd - len, "%s%d", len ? ", " : "", i + 1);
    }
    fprintf(out,
            "  transfer: the bytes the step should move (not the run's counts) at the all-replica "
            "copy rates (h2d, d2h,\n"
            "        both at once: the largest).\n"
            "  compute: the step's GEMMs (forward, dW, dX) at the rates measured at their shapes, "
            "all replicas at once.\n"
            "  host: castor's host kernels at this model's size, timed alone (the 'host step' "
            "limits): the sum of\n"
            "        the gradients where it runs on the host, and each optimizer update that "
            "runs in host memory\n"
            "        (central: the one pass that does both).\n"
            "  A term that could not be measured leaves no bound ('-'). ratio: measured step / "
            "bound (1 = at the limit).\n"
            "  bound: a true lower bound for any implementation, but one only an implementation "
            "that overlaps transfer,\n"
            "        compute and host work completely could reach. castor runs them one after "
            "another (the replicas'\n"
            "        copies and GEMMs, then the host's sum and update), so its ratios sit well "
            "above 1 even at their limits.\n"
            "  sum: transfer + compute + host, the bound for phases that run in turn; step/sum "
            "near 1: castor's phases\n"
            "        are at their limits. sum / bound: the most that overlapping them could win. "
            "A step may come under\n"
            "        the sum on GPUs, where castor's copies already overlap the GEMMs layer by "
            "layer, and on emulated\n"
            "        devices with a model small enough for the last-level cache, whose copies "
            "beat the memory rate.\n");
    if (odd[0])
        fprintf(out, "  run %s: the run stats counted other bytes than the replica loop should "
                     "move (stderr; bench.json\n"
                     "     bytes_as_expected): a regression to look into; the transfer term is "
                     "the expected bytes'.\n", odd);
    if (below)
        fprintf(out, "  !: below 1, the run beat its bound: a limit came out slower than this run's "
                     "own work went, because\n"
                     "     the machine was busier while the limits were measured (see the other "
                     "processes' share above;\n"
                     "     rerun on a quiet machine), or the run met a case the limits' trials "
                     "missed (please report it).\n");
}

/* ---- CSV ---------------------------------------------------------------- */

static void csv_num(FILE *f, const char *fmt, double v)
{
    fputc(',', f);
    if (isfinite(v))
        fprintf(f, fmt, v);
}

static void csv_str(FILE *f, const char *s)
{
    fputs(",\"", f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s == '\n' ? ' ' : *s, f);
    }
    fputc('"', f);
}

/* Text built in memory, then put in place whole (src/atomic_file.h): a
 * failed write leaves the last run's file, never half of this one's. */
static int write_whole(const char *path, const char *text, size_t len, char *err, size_t errlen)
{
    return castor__atomic_write_file(path, text, len, err, errlen) == CASTOR_OK ? 0 : -1;
}

int bench_write_csv(const char *path, const bench_config *c, const bench_result *r, int n,
                    char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    fprintf(f, "strategy,devices,replicas,optimizer,width,depth,batch,params,ok,error,steps,"
               "step_median_s,step_min_s,step_max_s,samples_per_s,h2d_bytes_per_step,"
               "d2h_bytes_per_step,bus_bytes_per_s,seconds_replicas,seconds_reduce,"
               "seconds_update,seconds_total,host_update_params_per_s,device_peak_bytes,"
               "host_pinned_bytes,host_rss_peak_run_bytes,host_rss_peak_scope,"
               "host_maxrss_process_bytes,step_flops,gemm_flops_per_s,host_memory_bytes_per_step,"
               "t_transfer_s,t_compute_s,t_host_s,lower_bound_s,bound_by,ratio,loss,"
               "expected_h2d_bytes_per_step,expected_d2h_bytes_per_step,bytes_as_expected,"
               "serial_bound_s,serial_ratio\n");
    for (int i = 0; i < n; i++) {
        const bench_result *x = &r[i];
        fprintf(f, "%s", kind_name(x->strategy));
        csv_str(f, c->devices);
        fprintf(f, ",%d,%s,%d,%d,%d,%zu,%d", x->replicas,
                castor_optimizer_kind_name(c->optimizer), x->width, x->depth, x->batch,
                x->params, x->ok);
        csv_str(f, x->error);
        fprintf(f, ",%d", x->steps);
        if (!x->ok) {
            fputs(",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,\n", f);
            continue;
        }
        csv_num(f, "%.9g", x->step_median);
        csv_num(f, "%.9g", x->step_min);
        csv_num(f, "%.9g", x->step_max);
        csv_num(f, "%.6g", x->samples_per_s);
        csv_num(f, "%.0f", x->h2d_per_step);
        csv_num(f, "%.0f", x->d2h_per_step);
        csv_num(f, "%.6g", x->bus_bw);
        csv_num(f, "%.9g", x->sec_replicas);
        csv_num(f, "%.9g", x->sec_reduce);
        csv_num(f, "%.9g", x->sec_update);
        csv_num(f, "%.9g", x->sec_total);
        csv_num(f, "%.6g", x->host_update_rate);
        csv_num(f, "%.0f", (double)x->device_peak);
        csv_num(f, "%.0f", (double)x->host_pinned);
        csv_num(f, "%.0f", x->rss_run);
        fprintf(f, ",%s", x->rss_run_scoped ? "run" : "process");
        csv_num(f, "%.0f", x->rss_process);
        csv_num(f, "%.6g", x->flops);
        csv_num(f, "%.6g", x->flops / x->t_compute);
        csv_num(f, "%.0f", x->host_bytes);
        csv_num(f, "%.9g", x->t_transfer);
        csv_num(f, "%.9g", x->t_compute);
        csv_num(f, "%.9g", x->t_host);
        csv_num(f, "%.9g", x->lower_bound);
        fprintf(f, ",%s", x->bound_by);
        csv_num(f, "%.4g", x->ratio);
        csv_num(f, "%.6g", x->loss);
        csv_num(f, "%.0f", x->expected_h2d);
        csv_num(f, "%.0f", x->expected_d2h);
        fprintf(f, ",%d", x->bytes_as_expected);
        csv_num(f, "%.9g", x->serial_bound);
        csv_num(f, "%.4g", x->serial_ratio);
        fputc('\n', f);
    }
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) {
        free(text);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    int rc = write_whole(path, text, len, err, errlen);
    free(text);
    return rc;
}

/* ---- JSON --------------------------------------------------------------- */

/* Each builder below returns its object whole, or NULL (out of memory: it
 * frees what it built), so that a report is never written without a field
 * that could not be allocated; bench_write_json then fails. */
static cJSON *whole_or_null(cJSON *o, int bad)
{
    if (!bad)
        return o;
    cJSON_Delete(o);
    return NULL;
}

static cJSON *int_array(const int *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    int bad = !a;
    for (int i = 0; a && i < n; i++)
        bad |= cli_json_append(a, cJSON_CreateNumber(v[i]));
    return whole_or_null(a, bad);
}

static cJSON *json_config(const bench_config *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    int bad = 0;
    bad |= cli_json_str(o, "devices", c->devices);
    bad |= cli_json_int(o, "replicas", c->replicas);
    cJSON *st = cJSON_AddArrayToObject(o, "strategies");
    bad |= !st;
    for (int i = 0; st && i < c->n_strategies; i++)
        bad |= cli_json_append(st, cJSON_CreateString(kind_name(c->strategies[i])));
    bad |= cli_json_add(o, "widths", int_array(c->widths, c->n_widths));
    bad |= cli_json_add(o, "depths", int_array(c->depths, c->n_depths));
    bad |= cli_json_add(o, "batches", int_array(c->batches, c->n_batches));
    bad |= cli_json_int(o, "steps", c->steps);
    bad |= cli_json_int(o, "warmup", c->warmup);
    bad |= cli_json_int(o, "input", c->input);
    bad |= cli_json_int(o, "classes", c->classes);
    bad |= cli_json_str(o, "optimizer", castor_optimizer_kind_name(c->optimizer));
    bad |= cli_json_str(o, "loss", "softmax_xent");
    bad |= cli_json_str(o, "hidden_activation", "relu");
    bad |= cli_json_u64(o, "seed", c->seed);
    bad |= cli_json_int(o, "device_memory_budget", (int64_t)c->device_memory);
    bad |= cli_json_int(o, "host_threads", c->host_threads);
    bad |= cli_json_bool(o, "tf32", c->tf32);
    bad |= cli_json_bool(o, "quick", c->quick);
    return whole_or_null(o, bad);
}

static cJSON *json_limits(const bench_limits *L)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    int bad = 0;
    bad |= cli_json_str(o, "backend", L->backend);
    bad |= cli_json_int(o, "replicas", L->replicas);
    bad |= cli_json_int(o, "copy_bytes", (int64_t)L->copy_bytes);
    bad |= cli_json_int(o, "copy_min_bytes", (int64_t)L->copy_min_bytes);
    bad |= cli_json_int(o, "copy_cpu_span_bytes", (int64_t)L->copy_span);
    bad |= cli_json_int(o, "last_level_cache_bytes", (int64_t)L->llc_bytes);
    bad |= cli_json_bool(o, "copy_host_pinned", L->copy_pinned);
    bad |= cli_json_num(o, "h2d_bytes_per_s", L->h2d_all);
    bad |= cli_json_num(o, "d2h_bytes_per_s", L->d2h_all);
    bad |= cli_json_num(o, "both_directions_bytes_per_s", L->both_all);
    bad |= cli_json_num(o, "h2d_one_replica_bytes_per_s", L->h2d_one);
    bad |= cli_json_num(o, "d2h_one_replica_bytes_per_s", L->d2h_one);
    bad |= cli_json_str(o, "copy_method",
                        "fastest of timed copies through the device interface (copy_h2d / "
                        "copy_d2h on their own streams, then synchronize) between host buffers "
                        "(pinned by CUDA where a GPU is among the devices) and device memory, "
                        "after one untimed, at every size from copy_min_bytes to copy_bytes by "
                        "factors of 4 (each trial copying copy_bytes per device); "
                        "h2d/d2h/both_directions: every replica at once, bytes summed over the "
                        "replicas. cuda: every copy between the same buffers of copy_bytes "
                        "(pinned PCIe copies do not depend on the CPU caches). cpu (emulated "
                        "devices, memcpy): every copy to the next region of buffers of "
                        "copy_cpu_span_bytes (twice last_level_cache_bytes, where host memory "
                        "allows), so no copy finds its bytes in a cache, as a training step's "
                        "copies of megabytes between distinct buffers do not");
    bad |= cli_json_num(o, "host_memory_bytes_per_s", L->triad_bw);
    bad |= cli_json_int(o, "host_threads", L->host_threads);
    bad |= cli_json_int(o, "triad_elements", (int64_t)L->triad_elems);
    bad |= cli_json_str(o, "host_memory_method",
                        "triad a[i] = b[i] + s*c[i] on float arrays split over the host pool, "
                        "fastest of repeats after one untimed; counted as 12 bytes per element "
                        "(reads of b and c, write of a; the write-allocate read of a is not "
                        "counted, as in STREAM)");
    bad |= cli_json_num(o, "host_optimizer_params_per_s", L->host_opt_rate);
    cJSON *hs = cJSON_AddArrayToObject(o, "host_step");
    bad |= !hs;
    for (int i = 0; hs && i < L->n_host_costs; i++) {
        cJSON *e = cJSON_CreateObject();
        if (cli_json_append(hs, e)) {
            bad = 1;
            break;
        }
        bad |= cli_json_int(e, "params", (int64_t)L->host_costs[i].params);
        bad |= cli_json_num(e, "reduce_seconds", L->host_costs[i].reduce_s);
        bad |= cli_json_num(e, "update_seconds", L->host_costs[i].opt_s);
        bad |= cli_json_num(e, "central_update_seconds", L->host_costs[i].central_s);
        bad |= cli_json_num(e, "cpu_replica_updates_seconds", L->host_costs[i].replica_opt_s);
    }
    bad |= cli_json_str(o, "host_step_method",
                        "castor's host kernels at each model size of the grid, alone on the host "
                        "threads: the sum of every replica's gradient (castor__reduce_sum) and "
                        "one optimizer update (castor__optim_apply), central's pass that does "
                        "both (castor__host_update), and each emulated CPU replica's update at "
                        "once on its replica thread (mirrored), fastest of repeats after one "
                        "untimed; the host term of the lower bound");
    cJSON *g = cJSON_AddArrayToObject(o, "gemm");
    bad |= !g;
    for (int i = 0; g && i < L->n_gemms; i++) {
        const bench_gemm *x = &L->gemms[i];
        cJSON *e = cJSON_CreateObject();
        if (cli_json_append(g, e)) {
            bad = 1;
            break;
        }
        bad |= cli_json_bool(e, "trans_a", x->ta);
        bad |= cli_json_bool(e, "trans_b", x->tb);
        bad |= cli_json_int(e, "m", x->m);
        bad |= cli_json_int(e, "n", x->n);
        bad |= cli_json_int(e, "k", x->k);
        bad |= cli_json_num(e, "seconds", x->seconds);
        bad |= cli_json_num(e, "flops_per_s", x->gflops * 1e9);
    }
    bad |= cli_json_str(o, "gemm_method",
                        "each shape (C m x n = op(A) m x k . op(B)) run on every replica's "
                        "device at once, repeated, fastest trial per call; flops_per_s = 2mnk x "
                        "replicas / seconds");
    bad |= cli_json_num(o, "seconds", L->seconds);
    bad |= cli_json_str(o, "note", L->note);
    return whole_or_null(o, bad);
}

static cJSON *json_run(const bench_config *c, const bench_result *x)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    int bad = 0;
    bad |= cli_json_str(o, "strategy", kind_name(x->strategy));
    bad |= cli_json_str(o, "devices", c->devices);
    bad |= cli_json_int(o, "replicas", x->replicas);
    bad |= cli_json_int(o, "width", x->width);
    bad |= cli_json_int(o, "depth", x->depth);
    bad |= cli_json_int(o, "batch", x->batch);
    bad |= cli_json_int(o, "params", (int64_t)x->params);
    bad |= cli_json_bool(o, "ok", x->ok);
    if (!x->ok) {
        bad |= cli_json_str(o, "error", x->error);
        return whole_or_null(o, bad);
    }
    bad |= cli_json_int(o, "steps", x->steps);
    bad |= cli_json_num(o, "step_seconds", x->step_median);
    bad |= cli_json_num(o, "step_seconds_min", x->step_min);
    bad |= cli_json_num(o, "step_seconds_max", x->step_max);
    bad |= cli_json_num(o, "samples_per_s", x->samples_per_s);
    bad |= cli_json_num(o, "h2d_bytes_per_step", x->h2d_per_step);
    bad |= cli_json_num(o, "d2h_bytes_per_step", x->d2h_per_step);
    bad |= cli_json_num(o, "expected_h2d_bytes_per_step", x->expected_h2d);
    bad |= cli_json_num(o, "expected_d2h_bytes_per_step", x->expected_d2h);
    bad |= cli_json_bool(o, "bytes_as_expected", x->bytes_as_expected);
    bad |= cli_json_num(o, "bus_bytes_per_s", x->bus_bw);
    bad |= cli_json_num(o, "seconds_replicas", x->sec_replicas);
    bad |= cli_json_num(o, "seconds_reduce", x->sec_reduce);
    bad |= cli_json_num(o, "seconds_update", x->sec_update);
    bad |= cli_json_num(o, "seconds_total", x->sec_total);
    bad |= cli_json_num(o, "host_update_params_per_s", x->host_update_rate);
    bad |= cli_json_int(o, "device_peak_bytes", (int64_t)x->device_peak);
    bad |= cli_json_int(o, "host_pinned_bytes", (int64_t)x->host_pinned);
    bad |= cli_json_num(o, "host_rss_peak_bytes", x->rss_run);
    bad |= cli_json_str(o, "host_rss_peak_scope", x->rss_run_scoped ? "run" : "process");
    bad |= cli_json_num(o, "host_maxrss_process_bytes", x->rss_process);
    bad |= cli_json_num(o, "loss", x->loss);
    cJSON *b = cJSON_AddObjectToObject(o, "lower_bound");
    bad |= !b;
    if (b) {
        bad |= cli_json_num(b, "seconds", x->lower_bound);
        bad |= cli_json_str(b, "bound_by", x->bound_by);
        bad |= cli_json_num(b, "ratio", x->ratio);
        bad |= cli_json_num(b, "serial_seconds", x->serial_bound);
        bad |= cli_json_num(b, "serial_ratio", x->serial_ratio);
        bad |= cli_json_num(b, "transfer_seconds", x->t_transfer);
        bad |= cli_json_num(b, "compute_seconds", x->t_compute);
        bad |= cli_json_num(b, "host_seconds", x->t_host);
        bad |= cli_json_num(b, "step_flops", x->flops);
        bad |= cli_json_num(b, "gemm_flops_per_s", x->flops / x->t_compute);
        bad |= cli_json_num(b, "host_memory_bytes_per_step", x->host_bytes);
    }
    return whole_or_null(o, bad);
}

int bench_write_json(const char *path, const bench_config *c, const bench_limits *L,
                     const bench_result *r, int n, double wall_seconds, char *err,
                     size_t errlen)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    int bad = 0;
    char when[64] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    bad |= cli_json_str(root, "castor_version", castor_version());
    bad |= cli_json_str(root, "build_features", castor_build_features());
    bad |= cli_json_str(root, "date", when);
    bad |= cli_json_int(root, "cpu_cores", castor__cpu_count());
    bad |= cli_json_num(root, "other_processes_cpu_before", c->others_before);
    bad |= cli_json_num(root, "other_processes_cpu_during", c->others_during);
    bad |= cli_json_int(root, "other_processes_cpus", c->others_cpus);
    bad |= cli_json_str(root, "other_processes_method",
                        "the busy time of the other_processes_cpus CPUs in this process's "
                        "affinity mask (their per-CPU lines of /proc/stat: user, nice, system, "
                        "irq, softirq, steal) less this process's own CPU time, over wall time x "
                        "those CPUs, within 0..1: before = a 0.25 s look before anything is "
                        "measured, during = the limits and every run; CPUs outside the mask are "
                        "not counted, and a cgroup CPU quota does not change which CPUs are "
                        "(cpu_cores may then be fewer)");
    bad |= cli_json_add(root, "config", json_config(c));
    bad |= cli_json_add(root, "limits", json_limits(L));
    bad |= cli_json_str(root, "lower_bound_method",
                        "seconds = max(transfer, compute, host): a lower bound for any "
                        "implementation, but one only an implementation that overlaps transfer, "
                        "compute and host work completely could reach; castor runs them one "
                        "after another (the replicas' copies and GEMMs, then the host's sum and "
                        "update; on GPUs its copies overlap the GEMMs layer by layer), so its "
                        "ratio sits well above 1 even at their limits. serial_seconds = transfer "
                        "+ compute + host: the bound for phases that run one after another, as "
                        "castor's do; serial_ratio = step_seconds / serial_seconds (near 1: "
                        "castor's phases are at their limits; a step may come under it on GPUs, "
                        "whose copies overlap the GEMMs, and on emulated devices with a model "
                        "small enough for the last-level cache, whose copies beat the memory "
                        "rate of limits.copy_method); serial_seconds / seconds: the most that "
                        "overlapping the phases could win. transfer = max(h2d/h2d_rate, "
                        "d2h/d2h_rate, (h2d+d2h)/both_directions_rate) with the bytes the "
                        "replica loop should move (expected_h2d/d2h_bytes_per_step), not the "
                        "run's own counts, so that a strategy copying more than it should gets "
                        "no larger bound (bytes_as_expected: whether the counts "
                        "h2d/d2h_bytes_per_step were within 1% of them); compute = sum of the "
                        "step's GEMM times (forward x W, backward x^T dy and, above the first "
                        "layer, dy W^T) at the busiest replica's rows, measured with every "
                        "replica at once; host = castor's own host kernels timed alone at the "
                        "run's parameter count (limits.host_step): the sum of the replicas' "
                        "gradients where it runs on the host (central; mirrored with several "
                        "replicas neither sharing one device nor on a GPU each, or without "
                        "NCCL), plus the optimizer update wherever it runs in host memory "
                        "(central: once on the host threads; mirrored: every emulated CPU "
                        "device's at once, one thread each); host_memory_bytes_per_step gives "
                        "the bytes those kernels move. Not counted: elementwise kernels, "
                        "mirrored's all-reduce on the devices (NCCL, or on a device its replicas "
                        "share: cuda:IxK, cpu:1xK) and its optimizer update on GPUs (no device "
                        "memory rate is measured), so the bound only gets looser.");
    cJSON *runs = cJSON_AddArrayToObject(root, "runs");
    bad |= !runs;
    for (int i = 0; runs && i < n; i++)
        bad |= cli_json_append(runs, json_run(c, &r[i]));
    bad |= cli_json_num(root, "wall_seconds", wall_seconds);
    char *text = bad ? NULL : cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    size_t len = strlen(text);
    char *line = malloc(len + 2);
    int rc = -1;
    if (!line)
        snprintf(err, errlen, "%s: out of memory", path);
    else {
        memcpy(line, text, len);
        line[len] = '\n';
        rc = write_whole(path, line, len + 1, err, errlen);
        free(line);
    }
    cJSON_free(text);
    return rc;
}
