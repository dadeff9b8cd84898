/* gpu.h: GPU memory through the CUDA driver, loaded at run time (dlopen of libcuda.so.1), so
 * that one build runs on machines with and without a GPU: without one, every call fails with
 * a message naming what is missing, and nothing crashes. Built only with -DKVX_CUDA=ON
 * (KVX_HAVE_CUDA); otherwise every call says the build has no CUDA. The agent's "vram"
 * storages live here (docs/gpu.md). */
#ifndef KVX_SRC_GPU_H
#define KVX_SRC_GPU_H

#include "kvx.h"

#include <stddef.h>
#include <stdint.h>

struct gpu;

/* Opens CUDA device `device` (its primary context, made current on this thread). */
kvx_status_t gpu_open(int64_t device, struct gpu **gpu_p);
void gpu_close(struct gpu *gpu);

/* Device memory of `size` bytes, and its release. */
kvx_status_t gpu_alloc(struct gpu *gpu, size_t size, void **ptr_p);
void gpu_free(struct gpu *gpu, void *ptr);

/* Copies between host and device memory (either direction, unified addressing). */
kvx_status_t gpu_copy(struct gpu *gpu, void *dst, const void *src, size_t size);

/* KVX_OK when [ptr, ptr + size) is device memory of this GPU: what an engine registers. */
kvx_status_t gpu_check_device_memory(struct gpu *gpu, const void *ptr, size_t size);

#endif
