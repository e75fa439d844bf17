/* Wall-time fixture: a thread that computes half the time and sleeps the
 * other half ("half"), and a thread blocked in read() on a pipe nobody
 * writes for BLOCK_SECONDS ("blocker").
 * Usage: wall_states SECONDS. Prints "ok", the seconds the half thread
 * measured in each of its functions and how many times it slept. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double seconds;
static int pipefd[2];
static volatile unsigned long sink;

static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* 5 ms of this thread's CPU time. */
__attribute__((noinline)) void ws_compute(void) {
    double end = now(CLOCK_THREAD_CPUTIME_ID) + 0.005;
    while (now(CLOCK_THREAD_CPUTIME_ID) < end) sink++;
}

/* 5 ms asleep. */
__attribute__((noinline)) void ws_sleep(void) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, 0);
}

/* The half thread's own measure of its wall time in each function. */
static double compute_wall, sleep_wall;
static int iterations;
static void *half(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "half");
    double t = now(CLOCK_MONOTONIC), end = t + seconds;
    while (t < end) {
        ws_compute();
        double u = now(CLOCK_MONOTONIC);
        compute_wall += u - t;
        ws_sleep();
        t = now(CLOCK_MONOTONIC);
        sleep_wall += t - u;
        iterations++;
    }
    return 0;
}

/* Blocks in read() until main writes. */
__attribute__((noinline)) int ws_block_in_read(void) {
    char c;
    return (int)read(pipefd[0], &c, 1);
}

static void *blocker(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "blocker");
    if (ws_block_in_read() != 1) abort();
    return 0;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 3.0;
    if (pipe(pipefd) != 0) return 1;
    pthread_t h, b;
    pthread_create(&h, 0, half, 0);
    pthread_create(&b, 0, blocker, 0);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, 0);
    if (write(pipefd[1], "x", 1) != 1) return 1;
    pthread_join(b, 0);
    pthread_join(h, 0);
    printf("ok compute_wall=%.3f sleep_wall=%.3f iterations=%d\n", compute_wall, sleep_wall, iterations);
    return 0;
}
