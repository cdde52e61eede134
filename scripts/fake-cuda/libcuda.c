/* A stand-in CUDA driver (libcuda.so.1) for compiling a CUDA build's kernels on a machine
 * without a GPU: one device that says it is an H100/H200 (compute capability 9.0, 132 SMs,
 * 80 GiB), with "device" memory in host memory and kernel launches that run nothing.
 * CubeCL generates each kernel's CUDA C++ and compiles it with the real NVRTC (from the
 * nvidia-cuda-nvrtc wheel) exactly as on a GPU machine; only what the driver does after
 * that (load the PTX, launch it) is faked. So a run through it shows whether every kernel
 * a recipe needs compiles for sm_90a, how many there are and how long NVRTC takes for
 * them; never a step time, a loss or a result (every kernel's output is left as it was).
 *
 * Environment: FAKE_CUDA_PTX_DIR (write each loaded module's PTX there, NNNN.ptx, for
 * ptxas), FAKE_CUDA_LOG (append one line per kernel launch: the entry point's name),
 * FAKE_CUDA_CC (compute capability, default 90).
 * Built by scripts/cuda-compile-check.sh; see there. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
/* Both names of these: cudarc may ask for either. */
#undef cuDeviceGetUuid
#undef cuEventElapsedTime

static int cc(void) {
    const char *e = getenv("FAKE_CUDA_CC");
    return e ? atoi(e) : 90;
}

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) {
    const char *e = getenv("FAKE_CUDA_DRIVER");
    *v = e ? atoi(e) : 13000;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int i) {
    if (i != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *s, int len, CUdevice d) {
    (void)d;
    snprintf(s, len, "Stand-in GPU (no device: kernels compile, nothing runs)");
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = (size_t)80 << 30; return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { (void)d; memset(u, 7, sizeof *u); return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = cc() / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = cc() % 10; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *v = 2; break;
    default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}

/* Contexts and streams: distinct non-null handles, nothing behind them. */
static char ctx_storage, stream_storage[4096], event_storage[1 << 16], pool_storage;
static int streams, events;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&ctx_storage; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int f) { (void)d; (void)f; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *f, int *active) { (void)d; *f = 0; *active = 1; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)&ctx_storage; return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }
CUresult cuCtxSetLimit(CUlimit l, size_t v) { (void)l; (void)v; return CUDA_SUCCESS; }
CUresult cuCtxGetLimit(size_t *v, CUlimit l) { (void)l; *v = 0; return CUDA_SUCCESS; }
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return CUDA_SUCCESS; }

static CUstream next_stream(void) {
    pthread_mutex_lock(&lock);
    CUstream s = (CUstream)&stream_storage[(streams++) % sizeof stream_storage];
    pthread_mutex_unlock(&lock);
    return s;
}
CUresult cuStreamCreate(CUstream *s, unsigned int f) { (void)f; *s = next_stream(); return CUDA_SUCCESS; }
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int f, int p) { (void)f; (void)p; *s = next_stream(); return CUDA_SUCCESS; }
CUresult cuStreamDestroy_v2(CUstream s) { (void)s; return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return CUDA_SUCCESS; }
CUresult cuStreamQuery(CUstream s) { (void)s; return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) { (void)s; (void)e; (void)f; return CUDA_SUCCESS; }

CUresult cuEventCreate(CUevent *e, unsigned int f) {
    (void)f;
    pthread_mutex_lock(&lock);
    *e = (CUevent)&event_storage[(events++) % sizeof event_storage];
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) { (void)e; (void)s; return CUDA_SUCCESS; }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int f) { (void)e; (void)s; (void)f; return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent e) { (void)e; return CUDA_SUCCESS; }
CUresult cuEventQuery(CUevent e) { (void)e; return CUDA_SUCCESS; }
CUresult cuEventDestroy_v2(CUevent e) { (void)e; return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { (void)a; (void)b; *ms = 0.01f; return CUDA_SUCCESS; }
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

/* Memory: host memory under device addresses. */
static CUresult host_alloc(CUdeviceptr *p, size_t n) {
    void *m = calloc(1, n ? n : 1);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)m;
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return host_alloc(p, n); }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return host_alloc(p, n); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { (void)pool; (void)s; return host_alloc(p, n); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
    (void)e;
    *pitch = (w + 511) / 512 * 512;
    return host_alloc(p, *pitch * h);
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)p); return CUDA_SUCCESS; }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; free((void *)p); return CUDA_SUCCESS; }
CUresult cuMemAllocHost_v2(void **p, size_t n) { *p = calloc(1, n ? n : 1); return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int f) { (void)f; return cuMemAllocHost_v2(p, n); }
CUresult cuMemFreeHost(void *p) { free(p); return CUDA_SUCCESS; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int f) { (void)p; (void)n; (void)f; return CUDA_SUCCESS; }
CUresult cuMemHostUnregister(void *p) { (void)p; return CUDA_SUCCESS; }
CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) { *free_ = (size_t)79 << 30; *total = (size_t)80 << 30; return CUDA_SUCCESS; }
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d) { (void)d; *p = (CUmemoryPool)&pool_storage; return CUDA_SUCCESS; }
CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice d) { return cuDeviceGetDefaultMemPool(p, d); }
CUresult cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v) { (void)p; (void)a; (void)v; return CUDA_SUCCESS; }
CUresult cuMemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v) { (void)p; (void)a; memset(v, 0, 8); return CUDA_SUCCESS; }
CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t n) { (void)p; (void)n; return CUDA_SUCCESS; }

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { memcpy((void *)d, h, n); return CUDA_SUCCESS; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) { (void)s; return cuMemcpyHtoD_v2(d, h, n); }
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { memcpy(h, (const void *)d, n); return CUDA_SUCCESS; }
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) { (void)s; return cuMemcpyDtoH_v2(h, d, n); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr a, CUdeviceptr b, size_t n) { memmove((void *)a, (const void *)b, n); return CUDA_SUCCESS; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) { (void)s; return cuMemcpyDtoD_v2(a, b, n); }
CUresult cuMemcpyAsync(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) { (void)s; return cuMemcpyDtoD_v2(a, b, n); }
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s) {
    (void)s;
    const char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST ? (const char *)c->srcHost : (const char *)c->srcDevice;
    char *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ? (char *)c->dstHost : (char *)c->dstDevice;
    src += c->srcY * c->srcPitch + c->srcXInBytes;
    dst += c->dstY * c->dstPitch + c->dstXInBytes;
    for (size_t row = 0; row < c->Height; row++)
        memmove(dst + row * c->dstPitch, src + row * c->srcPitch, c->WidthInBytes);
    return CUDA_SUCCESS;
}
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *c) { return cuMemcpy2DAsync_v2(c, 0); }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset((void *)d, v, n); return CUDA_SUCCESS; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; return cuMemsetD8_v2(d, v, n); }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
    (void)s;
    for (size_t i = 0; i < n; i++) ((unsigned int *)d)[i] = v;
    return CUDA_SUCCESS;
}

/* Modules: the PTX is kept (and written out where asked); functions are their names. */
typedef struct { char *ptx; int id; } Module;
typedef struct { char name[256]; Module *module; } Function;
static int modules;

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    Module *mod = calloc(1, sizeof *mod);
    mod->ptx = strdup((const char *)image);
    pthread_mutex_lock(&lock);
    mod->id = modules++;
    pthread_mutex_unlock(&lock);
    const char *dir = getenv("FAKE_CUDA_PTX_DIR");
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%05d.ptx", dir, mod->id);
        FILE *f = fopen(path, "w");
        if (f) { fputs(mod->ptx, f); fclose(f); }
    }
    *m = (CUmodule)mod;
    return CUDA_SUCCESS;
}
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v) {
    (void)n; (void)o; (void)v;
    return cuModuleLoadData(m, image);
}
CUresult cuModuleUnload(CUmodule m) { Module *mod = (Module *)m; free(mod->ptx); free(mod); return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    Module *mod = (Module *)m;
    if (!strstr(mod->ptx, name)) return CUDA_ERROR_NOT_FOUND;
    Function *fn = calloc(1, sizeof *fn);
    snprintf(fn->name, sizeof fn->name, "%s", name);
    fn->module = mod;
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { (void)f; (void)a; (void)v; return CUDA_SUCCESS; }
CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) { (void)f; (void)a; *v = 0; return CUDA_SUCCESS; }
CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c) { (void)f; (void)c; return CUDA_SUCCESS; }

static void log_launch(CUfunction f) {
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path) return;
    FILE *out = fopen(path, "a");
    if (out) { fprintf(out, "%s\n", ((Function *)f)->name); fclose(out); }
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s; (void)params; (void)extra;
    log_launch(f);
    return CUDA_SUCCESS;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)c; (void)params; (void)extra;
    log_launch(f);
    return CUDA_SUCCESS;
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shared, CUstream s, void **params) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, NULL);
}

/* TMA descriptors: a launch that would read them runs nothing. */
CUresult cuTensorMapEncodeTiled(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t r, void *a, const cuuint64_t *d,
                                const cuuint64_t *s, const cuuint32_t *b, const cuuint32_t *e, CUtensorMapInterleave i,
                                CUtensorMapSwizzle w, CUtensorMapL2promotion l, CUtensorMapFloatOOBfill o) {
    (void)t; (void)r; (void)a; (void)d; (void)s; (void)b; (void)e; (void)i; (void)w; (void)l; (void)o;
    memset(m, 0, sizeof *m);
    return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeIm2col(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t r, void *a, const cuuint64_t *d,
                                 const cuuint64_t *s, const int *lo, const int *hi, cuuint32_t c, cuuint32_t p,
                                 const cuuint32_t *e, CUtensorMapInterleave i, CUtensorMapSwizzle w,
                                 CUtensorMapL2promotion l, CUtensorMapFloatOOBfill o) {
    (void)t; (void)r; (void)a; (void)d; (void)s; (void)lo; (void)hi; (void)c; (void)p; (void)e; (void)i; (void)w; (void)l; (void)o;
    memset(m, 0, sizeof *m);
    return CUDA_SUCCESS;
}

/* NVRTC loads the driver too and asks it for its private tables: there are none here, so
 * it goes on without them (left undefined, the lookup returned null and NVRTC crashed). */
CUresult cuGetExportTable(const void **table, const CUuuid *id) { (void)id; *table = NULL; return CUDA_ERROR_NOT_SUPPORTED; }

CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "CUDA_ERROR_STAND_IN"; return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "stand-in driver"; return CUDA_SUCCESS; }
