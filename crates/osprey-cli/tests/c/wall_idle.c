/* N idle threads (blocked in a futex wait) for SECONDS, then exit.
 * Usage: wall_idle N SECONDS */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int done;

static void *idle(void *arg) {
    (void)arg;
    pthread_mutex_lock(&m);
    while (!done) pthread_cond_wait(&c, &m);
    pthread_mutex_unlock(&m);
    return 0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10;
    double seconds = argc > 2 ? atof(argv[2]) : 2.0;
    pthread_t *t = calloc(n, sizeof *t);
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 << 10);
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], &a, idle, 0) != 0) return 1;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, 0);
    pthread_mutex_lock(&m);
    done = 1;
    pthread_cond_broadcast(&c);
    pthread_mutex_unlock(&m);
    for (int i = 0; i < n; i++) pthread_join(t[i], 0);
    printf("ok\n");
    return 0;
}
