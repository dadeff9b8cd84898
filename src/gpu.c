/* gpu.c: see gpu.h. The driver's entry points are looked up by name in libcuda.so.1; the
 * prototypes come from the toolkit's cuda.h, so their types are checked at build time. */
#include "gpu.h"

#include "error.h"

#ifndef KVX_HAVE_CUDA

kvx_status_t gpu_open(int64_t device, struct gpu **gpu_p)
{
    (void)gpu_p;
    return error_set(KVX_ERR_INVALID,
                     "GPU memory (device %lld): this build of kvx has no CUDA support "
                     "(build with -DKVX_CUDA=ON)",
                     (long long)device);
}

void gpu_close(struct gpu *gpu)
{
    (void)gpu;
}

kvx_status_t gpu_alloc(struct gpu *gpu, size_t size, void **ptr_p)
{
    (void)gpu;
    (void)size;
    (void)ptr_p;
    return error_set(KVX_ERR_INTERNAL, "gpu: no CUDA in this build");
}

void gpu_free(struct gpu *gpu, void *ptr)
{
    (void)gpu;
    (void)ptr;
}

kvx_status_t gpu_copy(struct gpu *gpu, void *dst, const void *src, size_t size)
{
    (void)gpu;
    (void)dst;
    (void)src;
    (void)size;
    return error_set(KVX_ERR_INTERNAL, "gpu: no CUDA in this build");
}

kvx_status_t gpu_check_device_memory(struct gpu *gpu, const void *ptr, size_t size)
{
    (void)gpu;
    (void)ptr;
    (void)size;
    return error_set(KVX_ERR_INTERNAL, "gpu: no CUDA in this build");
}

#else

#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>

/* The driver entry points kvx uses, by the names libcuda.so.1 exports them under. */
struct gpu_driver {
    void *library;
    CUresult (*init)(unsigned int);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*primary_ctx_release)(CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*pointer_get_attribute)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*get_error_string)(CUresult, const char **);
};

struct gpu {
    struct gpu_driver driver;
    CUdevice device;
    CUcontext context;
    int64_t index;
};

static const char *gpu_error_string(const struct gpu_driver *d, CUresult result)
{
    const char *text = NULL;

    if (d->get_error_string == NULL || d->get_error_string(result, &text) != CUDA_SUCCESS ||
        text == NULL)
        return "unknown CUDA error";
    return text;
}

static kvx_status_t gpu_fail(const struct gpu_driver *d, const char *what, CUresult result)
{
    return error_set(KVX_ERR_IO, "gpu: %s: %s (CUDA error %d)", what, gpu_error_string(d, result),
                     (int)result);
}

/* Looks `name` up; false (and a message) when the driver lacks it. */
static bool driver_symbol(struct gpu_driver *d, const char *name, void *slot)
{
    void *symbol = dlsym(d->library, name);

    if (symbol == NULL) {
        error_set(KVX_ERR_INVALID, "gpu: libcuda.so.1 has no %s: the NVIDIA driver is too old",
                  name);
        return false;
    }
    *(void **)slot = symbol;
    return true;
}

static kvx_status_t driver_load(struct gpu_driver *d)
{
    d->library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d->library == NULL)
        return error_set(KVX_ERR_INVALID,
                         "GPU memory needs the NVIDIA driver, and this machine has none: %s",
                         dlerror());
    if (driver_symbol(d, "cuInit", &d->init) &&
        driver_symbol(d, "cuDeviceGetCount", &d->device_get_count) &&
        driver_symbol(d, "cuDeviceGet", &d->device_get) &&
        driver_symbol(d, "cuDevicePrimaryCtxRetain", &d->primary_ctx_retain) &&
        driver_symbol(d, "cuDevicePrimaryCtxRelease_v2", &d->primary_ctx_release) &&
        driver_symbol(d, "cuCtxSetCurrent", &d->ctx_set_current) &&
        driver_symbol(d, "cuMemAlloc_v2", &d->mem_alloc) &&
        driver_symbol(d, "cuMemFree_v2", &d->mem_free) &&
        driver_symbol(d, "cuMemcpy", &d->memcpy) &&
        driver_symbol(d, "cuPointerGetAttribute", &d->pointer_get_attribute) &&
        driver_symbol(d, "cuGetErrorString", &d->get_error_string))
        return KVX_OK;
    dlclose(d->library);
    d->library = NULL;
    return KVX_ERR_INVALID;
}

kvx_status_t gpu_open(int64_t device, struct gpu **gpu_p)
{
    struct gpu *g = calloc(1, sizeof(*g));
    kvx_status_t status;
    CUresult result;
    int count = 0;

    if (g == NULL)
        return error_no_memory("a GPU");
    status = driver_load(&g->driver);
    if (status != KVX_OK) {
        free(g);
        return status;
    }
    if ((result = g->driver.init(0)) != CUDA_SUCCESS)
        status = gpu_fail(&g->driver, "cuInit", result);
    else if ((result = g->driver.device_get_count(&count)) != CUDA_SUCCESS)
        status = gpu_fail(&g->driver, "counting devices", result);
    else if (device < 0 || device >= count)
        status = error_set(KVX_ERR_INVALID, "GPU memory: no CUDA device %lld (this machine has %d)",
                           (long long)device, count);
    else if ((result = g->driver.device_get(&g->device, (int)device)) != CUDA_SUCCESS)
        status = gpu_fail(&g->driver, "cuDeviceGet", result);
    else if ((result = g->driver.primary_ctx_retain(&g->context, g->device)) != CUDA_SUCCESS)
        status = gpu_fail(&g->driver, "retaining the device's context", result);
    else if ((result = g->driver.ctx_set_current(g->context)) != CUDA_SUCCESS) {
        g->driver.primary_ctx_release(g->device);
        status = gpu_fail(&g->driver, "making the context current", result);
    }
    if (status != KVX_OK) {
        dlclose(g->driver.library);
        free(g);
        return status;
    }
    g->index = device;
    *gpu_p   = g;
    return KVX_OK;
}

void gpu_close(struct gpu *gpu)
{
    if (gpu == NULL)
        return;
    gpu->driver.primary_ctx_release(gpu->device);
    dlclose(gpu->driver.library);
    free(gpu);
}

kvx_status_t gpu_alloc(struct gpu *gpu, size_t size, void **ptr_p)
{
    CUdeviceptr ptr = 0;
    CUresult result = gpu->driver.mem_alloc(&ptr, size);

    if (result != CUDA_SUCCESS)
        return gpu_fail(&gpu->driver, "allocating device memory", result);
    *ptr_p = (void *)(uintptr_t)ptr;
    return KVX_OK;
}

void gpu_free(struct gpu *gpu, void *ptr)
{
    if (ptr != NULL)
        gpu->driver.mem_free((CUdeviceptr)(uintptr_t)ptr);
}

kvx_status_t gpu_copy(struct gpu *gpu, void *dst, const void *src, size_t size)
{
    /* The caller's thread may not be the one that opened the device (a Python thread). */
    CUresult result = gpu->driver.ctx_set_current(gpu->context);

    if (result == CUDA_SUCCESS)
        result = gpu->driver.memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, size);
    return result == CUDA_SUCCESS ? KVX_OK : gpu_fail(&gpu->driver, "copying", result);
}

kvx_status_t gpu_check_device_memory(struct gpu *gpu, const void *ptr, size_t size)
{
    const char *ends[2] = {ptr, (const char *)ptr + (size > 0 ? size - 1 : 0)};

    for (size_t i = 0; i < 2; i++) {
        unsigned int type = 0;
        int ordinal       = -1;
        CUdeviceptr at    = (CUdeviceptr)(uintptr_t)ends[i];

        if (gpu->driver.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, at) !=
                CUDA_SUCCESS ||
            type != CU_MEMORYTYPE_DEVICE ||
            gpu->driver.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, at) !=
                CUDA_SUCCESS ||
            ordinal != gpu->index)
            return error_set(KVX_ERR_INVALID,
                             "GPU memory: %p + %zu bytes is not memory of CUDA device %lld", ptr,
                             size, (long long)gpu->index);
    }
    return KVX_OK;
}

#endif
