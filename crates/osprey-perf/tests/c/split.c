/* A target for the sampler's tests, built -O2 -fomit-frame-pointer (no
 * frame pointers: only .eh_frame can unwind it).
 *
 *   split run SECONDS   main and a pthread burn CPU in burn_a/burn_b/burn_c
 *                       (work 50/30/20) for SECONDS of wall time; a third
 *                       thread (late_main) starts at a third of that time.
 *   split block SECONDS as `run` without the late thread, plus a thread
 *                       blocked in read() on a pipe until the end.
 *   split fixed ROUNDS  main alone runs ROUNDS rounds (fixed work).
 *   split dlopen SECONDS main alone: round_of_work for a third of SECONDS,
 *                       then dlopen("libz.so.1") and compress2 in
 *                       zlib_loop until the end (code loaded after attach).
 *
 * Prints "ready" (and "blocked TID") once its threads run, "done" at the
 * end, and exits with status 3. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define K 400

static volatile unsigned long sink;

/* Distinct multipliers: identical bodies could be folded into one function. */
#define BURN(name, mul)                                                        \
    __attribute__((noinline, noclone)) void name(unsigned long n) {            \
        unsigned long x = n;                                                   \
        for (unsigned long i = 0; i < n; i++) {                                \
            x = x * mul + 1442695040888963407UL;                               \
            __asm__ volatile("" : "+r"(x));                                    \
        }                                                                      \
        sink = x;                                                              \
    }
BURN(burn_a, 6364136223846793005UL)
BURN(burn_b, 2862933555777941757UL)
BURN(burn_c, 3935559000370003845UL)

__attribute__((noinline, noclone)) void round_of_work(void) {
    burn_a(50 * K);
    burn_b(30 * K);
    burn_c(20 * K);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double until;

__attribute__((noinline, noclone)) void work_until(void) {
    while (now() < until)
        round_of_work();
}

__attribute__((noinline, noclone)) void *worker_main(void *arg) {
    (void)arg;
    work_until();
    return NULL;
}

__attribute__((noinline, noclone)) void *late_main(void *arg) {
    (void)arg;
    work_until();
    return NULL;
}

static int pipefd[2];
static volatile pid_t blocked_tid;

__attribute__((noinline, noclone)) void *blocked_main(void *arg) {
    (void)arg;
    char c;
    blocked_tid = gettid();
    ssize_t r = read(pipefd[0], &c, 1);
    (void)r;
    return NULL;
}

typedef int (*compress2_fn)(unsigned char *, unsigned long *, const unsigned char *, unsigned long, int);

__attribute__((noinline, noclone)) int zlib_loop(double end) {
    void *z = dlopen("libz.so.1", RTLD_NOW);
    compress2_fn compress2 = z ? (compress2_fn)dlsym(z, "compress2") : NULL;
    if (!compress2)
        return 2;
    static unsigned char src[1 << 16], dst[(1 << 16) + 1024];
    unsigned long x = 1;
    for (size_t i = 0; i < sizeof src; i++) {
        x = x * 6364136223846793005UL + 1;
        src[i] = (unsigned char)((x >> 60) + 'a');
    }
    while (now() < end) {
        unsigned long len = sizeof dst;
        if (compress2(dst, &len, src, sizeof src, 6) != 0)
            return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    const char *mode = argv[1];
    double arg = atof(argv[2]);
    if (strcmp(mode, "fixed") == 0) {
        puts("ready");
        fflush(stdout);
        for (long i = 0; i < (long)arg; i++)
            round_of_work();
        puts("done");
        return 3;
    }
    if (strcmp(mode, "dlopen") == 0) {
        double end = now() + arg;
        puts("ready");
        fflush(stdout);
        until = end - arg * 2 / 3;
        work_until();
        if (zlib_loop(end) != 0)
            return 2;
        puts("done");
        return 3;
    }
    int block = strcmp(mode, "block") == 0;
    double start = now();
    until = start + arg;
    pthread_t worker, other;
    pthread_create(&worker, NULL, worker_main, NULL);
    if (block) {
        if (pipe(pipefd) != 0)
            return 2;
        pthread_create(&other, NULL, blocked_main, NULL);
        while (!blocked_tid)
            usleep(1000);
        printf("blocked %d\n", (int)blocked_tid);
    }
    puts("ready");
    fflush(stdout);
    if (!block) {
        while (now() < start + arg / 3)
            round_of_work();
        pthread_create(&other, NULL, late_main, NULL);
    }
    work_until();
    if (block && write(pipefd[1], "x", 1) != 1)
        return 2;
    pthread_join(worker, NULL);
    pthread_join(other, NULL);
    puts("done");
    return 3;
}
