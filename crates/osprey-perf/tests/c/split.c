/* A target for the sampler's tests, built -O2 -fomit-frame-pointer (no
 * frame pointers: only .eh_frame can unwind it).
 *
 *   split run SECONDS   main and a pthread burn CPU in burn_a/burn_b/burn_c
 *                       (work 50/30/20) for SECONDS of wall time; a third
 *                       thread (late_main) starts at a third of that time.
 *   split block SECONDS as `run` without the late thread, plus a thread
 *                       blocked in read() on a pipe until the end.
 *   split fixed ROUNDS  main alone runs ROUNDS rounds (fixed work).
 *
 * Prints "ready" (and "blocked TID") once its threads run, "done" at the
 * end, and exits with status 3. */
#define _GNU_SOURCE
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
