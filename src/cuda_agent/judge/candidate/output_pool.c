/* An allocator for torch's pluggable-allocator API whose every block is GPU memory of CUDA's virtual memory API,
 * exportable as a POSIX file descriptor (`ca_export`): on the cuda backend's trusted path the callee allocates
 * its outputs in `forward` from a `torch.cuda.MemPool` over it, and the trusted side maps the blocks and reads the
 * outputs where they lie, with no copy in the timed window (`output_pool.py` builds and loads it). It runs in the
 * callee's process: nothing it reports is believed; a descriptor that is no such memory fails to map. */
#include <cuda.h>
#include <stddef.h>
#include <sys/types.h>

#define MAX_BLOCKS 65536
typedef struct { CUdeviceptr ptr; size_t size; CUmemGenericAllocationHandle handle; unsigned long long serial; } Block;
static Block blocks[MAX_BLOCKS];
static unsigned long long serials;

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
    blocks[slot] = (Block){ptr, bytes, handle, ++serials};
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
            blocks[i] = (Block){0, 0, 0, 0};
            return;
        }
    }
}

/* The descriptor of the block holding `ptr` (the caller closes it), its base, size and serial (blocks are never
 * numbered twice, also where an address is reused); -1 if no block holds it. */
int ca_export(void *ptr, unsigned long long *base, unsigned long long *size, unsigned long long *serial) {
    CUdeviceptr p = (CUdeviceptr)ptr;
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (blocks[i].ptr && blocks[i].ptr <= p && p < blocks[i].ptr + blocks[i].size) {
            int fd = -1;
            if (cuMemExportToShareableHandle(&fd, blocks[i].handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                != CUDA_SUCCESS) return -1;
            *base = blocks[i].ptr;
            *size = blocks[i].size;
            *serial = blocks[i].serial;
            return fd;
        }
    }
    return -1;
}
