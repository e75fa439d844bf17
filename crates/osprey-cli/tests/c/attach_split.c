/* CPU work split 50/30/20 between fifty() and thirty() on the main thread
 * and twenty() on a worker, run in turns (the worker waits on a condition
 * variable while main works, and main while it works), so that the CPU
 * shares are those of the work whatever the cores. `attach_split CYCLES`
 * prints a checksum and exits 0: same output with or without a profiler. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define UNIT 400000UL

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int turn; /* 0: main works, 1: the worker works, 2: done */
static unsigned long worker_sum;

__attribute__((noinline)) static unsigned long fifty(unsigned long x) {
    for (unsigned long i = 0; i < 5 * UNIT; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

__attribute__((noinline)) static unsigned long thirty(unsigned long x) {
    for (unsigned long i = 0; i < 3 * UNIT; i++) x = x * 2862933555777941757UL + 3037000493UL;
    return x;
}

__attribute__((noinline)) static unsigned long twenty(unsigned long x) {
    for (unsigned long i = 0; i < 2 * UNIT; i++) x = x * 3935559000370003845UL + 2691343689449507681UL;
    return x;
}

static void *worker(void *arg) {
    (void)arg;
    unsigned long x = 3;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (turn == 0) pthread_cond_wait(&cv, &mu);
        if (turn == 2) break;
        pthread_mutex_unlock(&mu);
        x = twenty(x);
        pthread_mutex_lock(&mu);
        turn = 0;
        pthread_cond_broadcast(&cv);
    }
    worker_sum = x;
    pthread_mutex_unlock(&mu);
    return NULL;
}

int main(int argc, char **argv) {
    long cycles = argc > 1 ? atol(argv[1]) : 100;
    unsigned long x = 1;
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    for (long c = 0; c < cycles; c++) {
        x = fifty(x);
        x = thirty(x);
        pthread_mutex_lock(&mu);
        turn = 1;
        pthread_cond_broadcast(&cv);
        while (turn == 1) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_lock(&mu);
    turn = 2;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(t, NULL);
    printf("ok %lx %lx\n", x, worker_sum);
    return 0;
}
