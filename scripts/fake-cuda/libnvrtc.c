/* A pass-through libnvrtc.so.13 that times and records every kernel compilation: each call
 * goes to the real NVRTC (REAL_NVRTC, its absolute path), and each nvrtcCompileProgram
 * appends one line to NVRTC_LOG: milliseconds, ok or FAILED, and the kernel's entry point.
 * A failed compilation's source and NVRTC's log go to NVRTC_FAILED_DIR/<n>.cu and .log.
 * CubeCL hides a candidate that fails to compile inside an autotune (another candidate
 * wins); this shows it. Built by scripts/cuda-compile-check.sh. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

static void *real(const char *name) {
    static void *lib;
    if (!lib) {
        const char *path = getenv("REAL_NVRTC");
        lib = dlopen(path ? path : "libnvrtc.so.13.real", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) {
            fprintf(stderr, "nvrtc shim: cannot open REAL_NVRTC (%s): %s\n", path ? path : "unset", dlerror());
            abort();
        }
    }
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "nvrtc shim: the real NVRTC has no %s\n", name);
        abort();
    }
    return f;
}

#define FORWARD(ret, name, params, args)                    \
    ret name params {                                       \
        static ret(*f) params;                              \
        if (!f) f = (ret(*) params)real(#name);             \
        return f args;                                      \
    }

FORWARD(nvrtcResult, nvrtcVersion, (int *a, int *b), (a, b))
FORWARD(nvrtcResult, nvrtcGetNumSupportedArchs, (int *n), (n))
FORWARD(nvrtcResult, nvrtcGetSupportedArchs, (int *a), (a))
FORWARD(const char *, nvrtcGetErrorString, (nvrtcResult r), (r))
FORWARD(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram *p), (p))
FORWARD(nvrtcResult, nvrtcGetPTXSize, (nvrtcProgram p, size_t *n), (p, n))
FORWARD(nvrtcResult, nvrtcGetPTX, (nvrtcProgram p, char *s), (p, s))
FORWARD(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram p, size_t *n), (p, n))
FORWARD(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram p, char *s), (p, s))
FORWARD(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram p, size_t *n), (p, n))
FORWARD(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram p, char *s), (p, s))
FORWARD(nvrtcResult, nvrtcAddNameExpression, (nvrtcProgram p, const char *e), (p, e))
FORWARD(nvrtcResult, nvrtcGetLoweredName, (nvrtcProgram p, const char *e, const char **l), (p, e, l))

/* The sources of the programs being compiled, by program. */
#define SLOTS 4096
static struct { nvrtcProgram p; char *src; } sources[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int failures;

nvrtcResult nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name, int n,
                               const char *const *headers, const char *const *includes) {
    static nvrtcResult (*f)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                            const char *const *);
    if (!f) f = real("nvrtcCreateProgram");
    nvrtcResult r = f(p, src, name, n, headers, includes);
    if (r == 0) {
        pthread_mutex_lock(&lock);
        for (int i = 0; i < SLOTS; i++) {
            if (!sources[i].p) { sources[i].p = *p; sources[i].src = strdup(src); break; }
        }
        pthread_mutex_unlock(&lock);
    }
    return r;
}

/* The entry point's name: the word after `__global__ void` and its launch bounds. */
static void entry_name(const char *src, char *out, size_t len) {
    snprintf(out, len, "?");
    const char *g = src ? strstr(src, "__global__ void") : NULL;
    if (!g) return;
    const char *s = g + strlen("__global__ void");
    while (*s == ' ') s++;
    if (strncmp(s, "__launch_bounds__(", 18) == 0) {
        s = strchr(s, ')');
        if (!s) return;
        s++;
    }
    while (*s == ' ') s++;
    size_t n = strcspn(s, " (\n");
    if (n > len - 1) n = len - 1;
    memcpy(out, s, n);
    out[n] = 0;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int n, const char *const *options) {
    static nvrtcResult (*f)(nvrtcProgram, int, const char *const *);
    if (!f) f = real("nvrtcCompileProgram");
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    nvrtcResult r = f(p, n, options);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
    const char *src = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++) {
        if (sources[i].p == p) { src = sources[i].src; sources[i].p = NULL; break; }
    }
    int failure = r != 0 ? ++failures : 0;
    pthread_mutex_unlock(&lock);
    char name[512];
    entry_name(src, name, sizeof name);
    const char *path = getenv("NVRTC_LOG");
    if (path) {
        FILE *log = fopen(path, "a");
        if (log) { fprintf(log, "%.1f\t%s\t%s\n", ms, r == 0 ? "ok" : "FAILED", name); fclose(log); }
    }
    const char *dir = getenv("NVRTC_FAILED_DIR");
    if (failure && dir) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%04d.cu", dir, failure);
        FILE *out = fopen(file, "w");
        if (out) {
            fputs(src ? src : "", out);
            fputs("\n// options:", out);
            for (int i = 0; i < n; i++) fprintf(out, " %s", options[i]);
            fputs("\n", out);
            fclose(out);
        }
        size_t size = 0;
        nvrtcGetProgramLogSize(p, &size);
        char *text = calloc(1, size + 1);
        nvrtcGetProgramLog(p, text);
        snprintf(file, sizeof file, "%s/%04d.log", dir, failure);
        out = fopen(file, "w");
        if (out) { fputs(text, out); fclose(out); }
        free(text);
    }
    free((void *)src);
    return r;
}
