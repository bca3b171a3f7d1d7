/*
 * read_probe.c - the read-bandwidth probe that decode rows of `kipp-bench`
 * are measured against (the read bandwidth measured in the same run):
 * `kipp_profile --read-bw` in its own process, without a shell, killed when
 * it hangs.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_harness.h"
#include "bench/read_probe.h"

#define PROBE_TIMEOUT_MS 60000 /* a probe reads 256 MiB six times: ~1 s; a hung one is killed */

/* Run argv with stdout+stderr into out[n] (NUL-terminated), no shell, killed
 * after PROBE_TIMEOUT_MS. 0 when it exited 0, else -1 with why[] set. */
static int run_capture(char *const argv[], char *out, size_t n, char *why, size_t wn)
{
    int fd[2];
    if (pipe(fd) != 0) return snprintf(why, wn, "pipe: %s", strerror(errno)), -1;
    pid_t pid = fork();
    if (pid < 0) return close(fd[0]), close(fd[1]), snprintf(why, wn, "fork: %s", strerror(errno)), -1;
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a timeout kills whatever it started too */
        dup2(fd[1], 1), dup2(fd[1], 2), close(fd[0]), close(fd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    size_t got = 0;
    double t_end = kipp_timer_now() + PROBE_TIMEOUT_MS / 1e3;
    int timed_out = 0;
    for (;;) {
        int left = (int)((t_end - kipp_timer_now()) * 1e3);
        struct pollfd pfd = {fd[0], POLLIN, 0};
        if (left <= 0 || poll(&pfd, 1, left) == 0) { timed_out = 1; break; }
        char tmp[256];
        ssize_t r = read(fd[0], tmp, sizeof tmp);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t k = (size_t)r < n - 1 - got ? (size_t)r : n - 1 - got; /* keep the head, drain the rest */
        memcpy(out + got, tmp, k);
        got += k;
    }
    out[got] = '\0';
    close(fd[0]);
    if (timed_out) kill(-pid, SIGKILL), kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (timed_out) return snprintf(why, wn, "no answer within %d s, killed", PROBE_TIMEOUT_MS / 1000), -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return snprintf(why, wn, "cannot execute it"), -1;
    char *nl = strchr(out, '\n');
    if (nl) *nl = '\0';
    snprintf(why, wn, "%s %d: %s", WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), out[0] ? out : "no output");
    return -1;
}

double kipp_read_probe(const char *when)
{
    char self[4096], out[512], why[600] = "";
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 32);
    char *slash = n > 0 ? (self[n] = '\0', strrchr(self, '/')) : NULL;
    double gbps = 0;
    if (!slash) {
        snprintf(why, sizeof why, "cannot read /proc/self/exe");
    } else {
        snprintf(slash, sizeof self - (size_t)(slash - self), "/bin/kipp_profile");
        char *argv[] = {self, "--read-bw", "--buffer-mib", "256", NULL};
        if (run_capture(argv, out, sizeof out, why, sizeof why) == 0 &&
            (sscanf(out, "read_gbps_all %lf", &gbps) != 1 || gbps <= 0)) {
            snprintf(why, sizeof why, "unexpected output '%.200s'", out);
            gbps = 0;
        }
    }
    if (gbps <= 0) fprintf(stderr, "kipp-bench: read probe %s the row (%s --read-bw) failed: %s\n", when,
                           slash ? self : "bin/kipp_profile", why);
    return gbps;
}
