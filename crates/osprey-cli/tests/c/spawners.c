/* Starts /bin/true through posix_spawn, system and popen while its own
 * threads are sampled at a high rate; every child must exit 0, none may be
 * killed by a signal. Prints "spawned N deaths D failures F". */
#define _GNU_SOURCE
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static volatile int stop;

static void *busy(void *arg) {
    (void)arg;
    volatile unsigned long x = 0;
    while (!stop) x = x * 3 + 1;
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    size_t len = 100ul << 20;
    char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (mem == MAP_FAILED) return 2;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, busy, NULL);
    int deaths = 0, failures = 0, spawned = 0;
    for (int i = 0; i < n; i++) {
        int st = -1;
        switch (i % 3) {
        case 0: {
            pid_t pid;
            char *args[] = {"true", NULL};
            if (posix_spawn(&pid, "/bin/true", NULL, NULL, args, environ) != 0 || waitpid(pid, &st, 0) != pid)
                st = -1;
            break;
        }
        case 1: st = system("/bin/true"); break;
        default: {
            FILE *f = popen("/bin/true", "r");
            st = f ? pclose(f) : -1;
            break;
        }
        }
        spawned++;
        if (st == -1) failures++;
        else if (WIFSIGNALED(st)) {
            deaths++;
            fprintf(stderr, "death: signal %d (way %d)\n", WTERMSIG(st), i % 3);
        } else if (WEXITSTATUS(st) != 0) {
            failures++;
            fprintf(stderr, "failure: status %#x (way %d)\n", st, i % 3);
        }
    }
    stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("spawned %d deaths %d failures %d\n", spawned, deaths, failures);
    return 0;
}
