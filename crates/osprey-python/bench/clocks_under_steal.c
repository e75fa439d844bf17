/* Three clocks of a busy thread over the same seconds: its CPU clock
 * (CLOCK_THREAD_CPUTIME_ID), a perf task-clock counter on it, and its run
 * time in /proc/self/task/TID/schedstat; and the machine's steal share over
 * the run (/proc/stat). A task-clock counts time stolen from the vCPU while
 * the thread is current; the other two do not.
 *
 *   gcc -O1 -pthread clocks_under_steal.c -o clocks && ./clocks 4 10
 *   (threads, seconds)
 */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int secs = 10;

static long long ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long run_time(int tid) {
    char path[64];
    long long v = 0;
    snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%lld", &v) != 1) v = 0;
        fclose(f);
    }
    return v;
}

static long long task_clock(int fd) {
    long long v = 0;
    if (read(fd, &v, sizeof v) != sizeof v) v = 0;
    return v;
}

static void *busy(void *arg) {
    (void)arg;
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_SOFTWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    int tid = gettid();
    long long c0 = ns(CLOCK_THREAD_CPUTIME_ID), k0 = task_clock(fd), r0 = run_time(tid);
    long long end = ns(CLOCK_MONOTONIC) + secs * 1000000000LL;
    volatile long z = 0;
    while (ns(CLOCK_MONOTONIC) < end)
        for (int i = 0; i < 100000; i++) z++;
    long long c1 = ns(CLOCK_THREAD_CPUTIME_ID), k1 = task_clock(fd), r1 = run_time(tid);
    double cpu = (c1 - c0) / 1e6, tc = (k1 - k0) / 1e6, run = (r1 - r0) / 1e6;
    printf("thread %d: cpu clock %.1f ms, task-clock %.1f ms (%+.2f%%), run time %.1f ms (%+.2f%%)\n", tid, cpu, tc,
           100 * (tc - cpu) / cpu, run, 100 * (run - cpu) / cpu);
    return 0;
}

static void ticks(long long v[8]) {
    char cpu[16];
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "%15s %lld %lld %lld %lld %lld %lld %lld %lld", cpu, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                     &v[6], &v[7]) != 9)
        memset(v, 0, 8 * sizeof *v);
    if (f) fclose(f);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2) secs = atoi(argv[2]);
    if (n < 1 || n > 64) n = 4;
    long long a[8], b[8], all = 0;
    pthread_t t[64];
    ticks(a);
    for (int i = 0; i < n; i++) pthread_create(&t[i], 0, busy, 0);
    for (int i = 0; i < n; i++) pthread_join(t[i], 0);
    ticks(b);
    for (int i = 0; i < 8; i++) all += b[i] - a[i];
    printf("steal: %.1f%% of the machine's CPU ticks\n", all ? 100.0 * (b[7] - a[7]) / all : 0.0);
    return 0;
}
