/* A stand-in for libcuda.so.1 for tests on machines without a GPU: the driver API calls tilecraft's
   CUDA runtime makes, with host memory as "device" memory and launches recorded instead of run, so the
   runtime's use of cuda-python (argument types, launch geometry, kernel parameters) is exercised.
   cuda-python 13 finds every entry point through cuGetProcAddress_v2; older ones dlsym them by name. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
static unsigned last_dims[6];
static uint64_t last_args[32];
static int expect_args = 0, launches = 0;
static char last_name[256];
void stub_expect_args(int n) { expect_args = n; }
int stub_launches(void) { return launches; }
const unsigned *stub_last_dims(void) { return last_dims; }
const uint64_t *stub_last_args(void) { return last_args; }
const char *stub_last_function(void) { return last_name; }
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)0x1000; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == (void *)0x1000 ? 0 : 201; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuDeviceGetAttribute(int *v, int attrib, int dev) {
  switch (attrib) {  /* CUdevice_attribute values from cuda.h */
    case 1: *v = 1024; break;                      /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: *v = 1024; break; case 4: *v = 64; break;  /* MAX_BLOCK_DIM_X/Y/Z */
    case 5: *v = 2147483647; break; case 6: case 7: *v = 65535; break;  /* MAX_GRID_DIM_X/Y/Z */
    case 75: *v = 9; break; case 76: *v = 0; break;  /* COMPUTE_CAPABILITY_MAJOR/MINOR */
    default: *v = 0;
  }
  return 0;
}
CUresult cuDeviceGetName(char *name, int len, int dev) { strncpy(name, "stub GPU", len); return 0; }
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) { *p = (uint64_t)(uintptr_t)malloc(n); return *p ? 0 : 2; }
CUresult cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
CUresult cuModuleLoadData(void **m, const void *image) {
  if (memcmp(image, "\177ELF", 4) != 0) return 200;  /* CUDA_ERROR_INVALID_IMAGE: a cubin is an ELF file */
  *m = (void *)0x2000; return 0;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { strncpy(last_name, name, 255); *f = (void *)0x3000; return 0; }
CUresult cuModuleUnload(void *m) { return 0; }
CUresult cuEventCreate(void **e, unsigned flags) { *e = malloc(8); return 0; }
CUresult cuEventRecord(void *e, void *stream) { return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { *ms = 0.25f; return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = 0.25f; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                        void *stream, void **params, void **extra) {
  unsigned d[6] = {gx, gy, gz, bx, by, bz};
  memcpy(last_dims, d, sizeof d);
  for (int i = 0; i < expect_args && i < 32; i++) last_args[i] = *(uint64_t *)params[i];
  launches++;
  return 0;
}
CUresult cuGetErrorString(int e, const char **s) { *s = "stub error"; return 0; }
CUresult cuGetErrorName(int e, const char **s) { *s = "STUB_ERROR"; return 0; }
/* cuda-python 13 asks for base names ("cuMemAlloc"); the driver's exported symbol may carry a version suffix */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
  char name[300];
  snprintf(name, sizeof name, "%s_v2", symbol);
  void *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  *pfn = self ? dlsym(self, name) : NULL;
  if (!*pfn && self) *pfn = dlsym(self, symbol);
  if (status) *status = *pfn ? 0 : 1;  /* CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND */
  return *pfn ? 0 : 500;  /* CUDA_ERROR_NOT_FOUND */
}
/* NVRTC 13 looks for the driver's private tables once a libcuda is loaded: there are none here */
CUresult cuGetExportTable(const void **table, const void *id) { *table = NULL; return 801; /* CUDA_ERROR_NOT_SUPPORTED */ }
