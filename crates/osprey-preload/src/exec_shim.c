/* The exec family, interposed: each call asks the agent to make the calling
 * thread safe to exec (no osprey signal pending or coming, the program's
 * signal mask unchanged), calls the next definition (libc's), and if that
 * fails, gives the thread its CPU clock back with errno intact.
 *
 * In C because execl, execlp and execle are variadic. The agent side is
 * osprey_exec_prepare / osprey_exec_failed in exec_shim.rs. These symbols are
 * exported by exec_shim.map (rustc's version script exports Rust items only). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

int osprey_exec_prepare(void);
void osprey_exec_failed(int prep);

#define NEXT(name, type) ((type)dlsym(RTLD_NEXT, name))

/* Runs CALL between prepare and failed; returns its result (-1: errno set by it). */
#define GUARDED(CALL)                          \
    do {                                       \
        int prep_ = osprey_exec_prepare();     \
        int rc_ = (CALL);                      \
        int err_ = errno;                      \
        osprey_exec_failed(prep_);             \
        errno = err_;                          \
        return rc_;                            \
    } while (0)

typedef int (*execve_t)(const char *, char *const[], char *const[]);
typedef int (*execveat_t)(int, const char *, char *const[], char *const[], int);
typedef int (*fexecve_t)(int, char *const[], char *const[]);
typedef int (*execv_t)(const char *, char *const[]);
typedef int (*execvpe_t)(const char *, char *const[], char *const[]);

static int missing(void) {
    errno = ENOSYS;
    return -1;
}

int execve(const char *path, char *const argv[], char *const envp[]) {
    execve_t f = NEXT("execve", execve_t);
    GUARDED(f ? f(path, argv, envp) : missing());
}

int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
    execveat_t f = NEXT("execveat", execveat_t);
    GUARDED(f ? f(dirfd, path, argv, envp, flags) : missing());
}

int fexecve(int fd, char *const argv[], char *const envp[]) {
    fexecve_t f = NEXT("fexecve", fexecve_t);
    GUARDED(f ? f(fd, argv, envp) : missing());
}

int execv(const char *path, char *const argv[]) {
    execv_t f = NEXT("execv", execv_t);
    GUARDED(f ? f(path, argv) : missing());
}

int execvp(const char *file, char *const argv[]) {
    execv_t f = NEXT("execvp", execv_t);
    GUARDED(f ? f(file, argv) : missing());
}

int execvpe(const char *file, char *const argv[], char *const envp[]) {
    execvpe_t f = NEXT("execvpe", execvpe_t);
    GUARDED(f ? f(file, argv, envp) : missing());
}

/* The variadic ones collect their arguments (on the stack, like glibc) and
 * call the vector form above. */
#define COLLECT_ARGS(first, ap, argv)                          \
    size_t n_ = 1;                                             \
    va_start(ap, first);                                       \
    while (va_arg(ap, const char *) != NULL) n_++;             \
    va_end(ap);                                                \
    const char *argv[n_ + 1];                                  \
    argv[0] = first;                                           \
    va_start(ap, first);                                       \
    for (size_t i_ = 1; i_ <= n_; i_++) argv[i_] = va_arg(ap, const char *);

int execl(const char *path, const char *arg, ...) {
    va_list ap;
    COLLECT_ARGS(arg, ap, argv)
    va_end(ap);
    return execv(path, (char *const *)argv);
}

int execlp(const char *file, const char *arg, ...) {
    va_list ap;
    COLLECT_ARGS(arg, ap, argv)
    va_end(ap);
    return execvp(file, (char *const *)argv);
}

int execle(const char *path, const char *arg, ...) {
    va_list ap;
    COLLECT_ARGS(arg, ap, argv)
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}
