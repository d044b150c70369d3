/* An allocator for torch's pluggable-allocator API whose every block is GPU memory of CUDA's virtual memory API,
 * exportable as a POSIX file descriptor (`ca_export`): a probe of the cuda backend's output path, where outputs
 * allocated in `forward` are read by the trusted side without a copy (benchmarks/gpu_clock_attacks.py).
 * Build: gcc -shared -fPIC -O2 -I$CUDA_HOME/include exportable_pool.c -o exportable_pool.so -lcuda */
#include <cuda.h>
#include <stddef.h>
#include <sys/types.h>

#define MAX_BLOCKS 65536
typedef struct { CUdeviceptr ptr; size_t size; CUmemGenericAllocationHandle handle; } Block;
static Block blocks[MAX_BLOCKS];

static CUmemAllocationProp prop_for(int device) {
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

void *ca_alloc(ssize_t size, int device, void *stream) {
    (void)stream;
    CUmemAllocationProp prop = prop_for(device);
    size_t grain = 0;
    if (cuMemGetAllocationGranularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) return NULL;
    size_t bytes = size > 0 ? ((size_t)size + grain - 1) / grain * grain : grain;
    int slot = 0;
    while (slot < MAX_BLOCKS && blocks[slot].ptr) slot++;
    if (slot == MAX_BLOCKS) return NULL;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr ptr;
    if (cuMemCreate(&handle, bytes, &prop, 0) != CUDA_SUCCESS) return NULL;
    if (cuMemAddressReserve(&ptr, bytes, 0, 0, 0) != CUDA_SUCCESS) { cuMemRelease(handle); return NULL; }
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (cuMemMap(ptr, bytes, 0, handle, 0) != CUDA_SUCCESS || cuMemSetAccess(ptr, bytes, &access, 1) != CUDA_SUCCESS) {
        cuMemUnmap(ptr, bytes);
        cuMemAddressFree(ptr, bytes);
        cuMemRelease(handle);
        return NULL;
    }
    blocks[slot] = (Block){ptr, bytes, handle};
    return (void *)ptr;
}

void ca_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)size; (void)device; (void)stream;
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (blocks[i].ptr == (CUdeviceptr)ptr) {
            cuCtxSynchronize();
            cuMemUnmap(blocks[i].ptr, blocks[i].size);
            cuMemAddressFree(blocks[i].ptr, blocks[i].size);
            cuMemRelease(blocks[i].handle);
            blocks[i] = (Block){0, 0, 0};
            return;
        }
    }
}

/* The descriptor of the block holding `ptr` (the caller closes it), its base and size; -1 if no block holds it. */
int ca_export(void *ptr, unsigned long long *base, unsigned long long *size) {
    CUdeviceptr p = (CUdeviceptr)ptr;
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (blocks[i].ptr && blocks[i].ptr <= p && p < blocks[i].ptr + blocks[i].size) {
            int fd = -1;
            if (cuMemExportToShareableHandle(&fd, blocks[i].handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                != CUDA_SUCCESS) return -1;
            *base = blocks[i].ptr;
            *size = blocks[i].size;
            return fd;
        }
    }
    return -1;
}
