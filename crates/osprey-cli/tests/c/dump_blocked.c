/* Threads blocked for the dump: the main thread in read() of its stdin
 * (a pipe nobody writes), a second thread in pthread_cond_wait (futex), and
 * `THREADS` more sleeping in nanosleep. Prints "ready" once all are started. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

__attribute__((noinline)) static void *waits_on_cond(void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) pthread_cond_wait(&cv, &mu);
    return NULL;
}

__attribute__((noinline)) static void *sleeps(void *arg) {
    (void)arg;
    for (;;) sleep(1000);
    return NULL;
}

__attribute__((noinline)) static long reads_stdin(void) {
    char c;
    return read(0, &c, 1);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 << 10);
    pthread_t t;
    pthread_create(&t, &attr, waits_on_cond, NULL);
    for (int i = 0; i < n; i++)
        if (pthread_create(&t, &attr, sleeps, NULL) != 0) return 3;
    printf("ready\n");
    fflush(stdout);
    long r = reads_stdin();
    return r < 0 ? 1 : 0;
}
