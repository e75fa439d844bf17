/* Allocation profiling fixtures, one per mode (argv[1]):
 *   split  MIB     the main thread allocates and frees MIB MiB in total,
 *                  50/30/20 by bytes from alloc_a/alloc_b/alloc_c, each with
 *                  its own block sizes (512 B, 10 KiB, 20 KiB).
 *   inuse          (paced) keeps 64 MiB from keep_a (4 KiB blocks) and 32 MiB from
 *                  keep_b (64 KiB blocks), frees all of churn_c's 1 GiB,
 *                  and exits with the kept blocks still allocated.
 *   fork   N       a thread allocates without pause while the main thread
 *                  forks N children that allocate and exit.
 *   signal SECS    a 2 kHz timer's handler mallocs and frees while the main
 *                  thread mallocs and frees.
 *   bench  N       N malloc/free pairs of mixed sizes; prints the process
 *                  CPU time they took: "cpu_ns=<n>".
 * Built with -fno-builtin so no malloc/free pair is optimised away. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static void touch_free(char *p) {
    p[0] = 1;
    sink += (unsigned long)p[0];
    free(p);
}

__attribute__((noinline)) void alloc_a(void) { /* 50 KiB per round */
    for (int i = 0; i < 100; i++) touch_free(malloc(512));
}
__attribute__((noinline)) void alloc_b(void) { /* 30 KiB per round */
    for (int i = 0; i < 3; i++) touch_free(malloc(10 * 1024));
}
__attribute__((noinline)) void alloc_c(void) { /* 20 KiB per round */
    touch_free(calloc(1, 20 * 1024));
}

static void split(long mib) {
    long rounds = mib * 1024 / 100;
    for (long r = 0; r < rounds; r++) {
        alloc_a();
        alloc_b();
        alloc_c();
    }
}

/* Paces the in-use mode at about 400 MiB/s: a 20 ms sleep every 8 MiB
 * keeps the samples of a 64 KiB mean (128 per 8 MiB) well within what a
 * thread's sample ring holds (512) between two drains of the collector,
 * even when the collector runs late on a loaded machine. */
static void pace(size_t bytes) {
    static size_t since;
    since += bytes;
    if (since >= 8u << 20) {
        since = 0;
        usleep(20000);
    }
}

static void **kept;
static long nkept;

__attribute__((noinline)) void keep_a(void) {
    for (int i = 0; i < 64 * 256; i++) {
        kept[nkept] = malloc(4096);
        memset(kept[nkept++], 1, 64);
        pace(4096);
    }
}
__attribute__((noinline)) void keep_b(void) {
    for (int i = 0; i < 32 * 16; i++) {
        kept[nkept] = malloc(64 * 1024);
        memset(kept[nkept++], 1, 64);
        pace(64 * 1024);
    }
}
__attribute__((noinline)) void churn_c(void) {
    static void *ring[256];
    for (long i = 0; i < 1024L * 1024 * 1024 / 2048; i++) {
        void **slot = &ring[i % 256];
        free(*slot);
        *slot = malloc(2048);
        memset(*slot, 1, 16);
        pace(2048);
    }
    for (int i = 0; i < 256; i++) free(ring[i]);
}

static void inuse(void) {
    /* The agent's collector compiles the unwind tables at start and drains
     * no ring meanwhile: 1000 samples at once would overflow the ring. */
    usleep(500000);
    kept = malloc(sizeof(void *) * (64 * 256 + 32 * 16));
    keep_a();
    churn_c();
    keep_b();
    printf("kept %ld blocks\n", nkept);
}

static volatile int stop;

static void *allocator(void *arg) {
    (void)arg;
    while (!stop) alloc_a();
    return NULL;
}

static int forks(int n) {
    pthread_t t;
    pthread_create(&t, NULL, allocator, NULL);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alloc_b();
            _exit(0);
        }
        int st;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "child %d failed\n", i);
            return 1;
        }
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("forked %d\n", n);
    return 0;
}

static volatile long in_handler_mallocs;

static void on_alarm(int sig) {
    (void)sig;
    char *p = malloc(64);
    if (p) {
        p[0] = 1;
        free(p);
        in_handler_mallocs++;
    }
}

static int signals(int secs) {
    /* Warm this size's per-thread cache so neither side ever takes the
     * allocator's arena lock (glibc's malloc is not async-signal-safe; the
     * handler's malloc/free pair restores the cache as it found it). */
    void *warm[5];
    for (int i = 0; i < 5; i++) warm[i] = malloc(64);
    for (int i = 0; i < 5; i++) free(warm[i]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 500}, {0, 500}};
    setitimer(ITIMER_REAL, &it, NULL);
    time_t end = time(NULL) + secs;
    long n = 0;
    while (time(NULL) < end) {
        char *p = malloc(64);
        p[0] = 1;
        free(p);
        n++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("main %ld handler %ld\n", n, in_handler_mallocs);
    return in_handler_mallocs > 0 ? 0 : 1;
}

static int bench(long n) {
    static const size_t sizes[8] = {16, 32, 48, 64, 128, 256, 512, 1024};
    void *held[64] = {0};
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++) {
        void **slot = &held[i % 64];
        free(*slot);
        *slot = malloc(sizes[(i * 7) % 8]);
        ((char *)*slot)[0] = 1;
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    for (int i = 0; i < 64; i++) free(held[i]);
    printf("cpu_ns=%lld\n", (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec));
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    long arg = argc > 2 ? atol(argv[2]) : 0;
    if (!strcmp(mode, "split")) split(arg);
    else if (!strcmp(mode, "inuse")) inuse();
    else if (!strcmp(mode, "fork")) return forks((int)arg);
    else if (!strcmp(mode, "signal")) return signals((int)arg);
    else if (!strcmp(mode, "bench")) return bench(arg);
    else {
        fprintf(stderr, "usage: alloc split MIB | inuse | fork N | signal SECS | bench N\n");
        return 2;
    }
    return 0;
}
