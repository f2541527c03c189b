/*
 * Sandbox ("pause") container for the local cluster: it holds the pod's namespaces open,
 * reaps any zombie re-parented to it, and exits 0 on SIGTERM or SIGINT.
 * Built static (gcc -static) so the image needs nothing but this one file.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "3.10"

static void on_stop(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int handle(int sig, void (*fn)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        printf("multiworker pause %s\n", VERSION);
        return 0;
    }
    if (getpid() != 1) {
        fprintf(stderr, "pause: warning: not PID 1; zombies of other processes are not reaped\n");
    }
    if (handle(SIGINT, on_stop, 0) || handle(SIGTERM, on_stop, 0) ||
        handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART)) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
