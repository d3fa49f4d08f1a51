/* SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * A fake CUDA driver for testing ibnet-hip's CUDA path on machines without GPUs.
 * "Device memory" is host memory; two devices; GPU 0 supports DMA-BUF, GPU 1 does not.
 * Like the real driver it requires a current context for address-range, alloc, free and
 * export calls, and it only exports page-aligned ranges or whole allocations. An exported
 * "DMA-BUF" is a memfd whose size is the exported length, so a test can fstat() it.
 * Written from the documented API (cuda.h prototypes), not from any driver source.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_DEVICE = 101, INVALID_CONTEXT = 201 };

struct alloc { CUdeviceptr base; size_t size; int dev; };
static struct alloc allocs[64];
static int nallocs, inited;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char ctxs[2];               /* contexts are the addresses of these bytes */
static __thread int stack[16], sp; /* per-thread context stack */

static int cur(void) { return sp ? stack[sp - 1] : -1; }

static struct alloc *find(CUdeviceptr p) {
  for (int i = 0; i < nallocs; i++)
    if (p >= allocs[i].base && p < allocs[i].base + allocs[i].size) return &allocs[i];
  return NULL;
}

CUresult cuInit(unsigned flags) { if (flags) return INVALID_VALUE; inited = 1; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 2; return OK; }
CUresult cuDeviceGet(int *d, int o) { if (o < 0 || o > 1) return INVALID_DEVICE; *d = o; return OK; }

CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  if (dev < 0 || dev > 1) return INVALID_DEVICE;
  if (attr == 124) *v = dev == 0;      /* DMA_BUF_SUPPORTED */
  else if (attr == 116) *v = 1;        /* GPU_DIRECT_RDMA_SUPPORTED */
  else return INVALID_VALUE;
  return OK;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p);
  CUresult rc = OK;
  if (!a) rc = INVALID_VALUE;
  else if (attr == 2) *(unsigned *)data = 2;            /* MEMORY_TYPE = DEVICE */
  else if (attr == 8) *(unsigned char *)data = 0;       /* IS_MANAGED, written as a 1-byte bool */
  else if (attr == 9) *(int *)data = a->dev;            /* DEVICE_ORDINAL */
  else rc = INVALID_VALUE;
  pthread_mutex_unlock(&mu);
  return rc;
}

/* Like the real driver: releasing the last retain of a primary context destroys it, and with
 * it every allocation made in it. */
static int retains[2];
CUresult cuDevicePrimaryCtxRetain(void **c, int dev) {
  if (dev < 0 || dev > 1) return INVALID_DEVICE;
  *c = &ctxs[dev];
  pthread_mutex_lock(&mu);
  retains[dev]++;
  pthread_mutex_unlock(&mu);
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  if (dev < 0 || dev > 1) return INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  if (retains[dev] > 0 && --retains[dev] == 0) {
    for (int i = 0; i < nallocs;) {
      if (allocs[i].dev == dev) {
        free((void *)(uintptr_t)allocs[i].base);
        allocs[i] = allocs[--nallocs];
      } else {
        i++;
      }
    }
  }
  pthread_mutex_unlock(&mu);
  return OK;
}
CUresult cuCtxPushCurrent_v2(void *c) {
  if (sp == 16 || (c != &ctxs[0] && c != &ctxs[1])) return INVALID_VALUE;
  stack[sp++] = c == &ctxs[0] ? 0 : 1;
  return OK;
}
CUresult cuCtxPopCurrent_v2(void **c) {
  if (!sp) return INVALID_CONTEXT;
  sp--;
  if (c) *c = &ctxs[stack[sp]];
  return OK;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  if (cur() < 0) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p);
  if (a) { *base = a->base; *size = a->size; }
  pthread_mutex_unlock(&mu);
  return a ? OK : INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (cur() < 0) return INVALID_CONTEXT;
  if (n == 0) return INVALID_VALUE;
  size_t rounded = (n + 65535) & ~(size_t)65535;
  void *m = aligned_alloc(65536, rounded);
  if (!m) return 2;
  pthread_mutex_lock(&mu);
  if (nallocs == 64) { pthread_mutex_unlock(&mu); free(m); return 2; }
  allocs[nallocs++] = (struct alloc){ (CUdeviceptr)(uintptr_t)m, n, cur() };
  pthread_mutex_unlock(&mu);
  *p = (CUdeviceptr)(uintptr_t)m;
  return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  if (cur() < 0) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nallocs; i++) {
    if (allocs[i].base == p) {
      free((void *)(uintptr_t)p);
      allocs[i] = allocs[--nallocs];
      pthread_mutex_unlock(&mu);
      return OK;
    }
  }
  pthread_mutex_unlock(&mu);
  return INVALID_VALUE;
}

static int inside(CUdeviceptr p, size_t n) {
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p);
  int ok = a && p + n <= a->base + a->size;
  pthread_mutex_unlock(&mu);
  return ok;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
  if (!inside(d, n)) return INVALID_VALUE;
  memcpy((void *)(uintptr_t)d, s, n);
  return OK;
}
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
  if (!inside(s, n)) return INVALID_VALUE;
  memcpy(d, (const void *)(uintptr_t)s, n);
  return OK;
}

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t n, int type,
                                       unsigned long long flags) {
  if (cur() < 0) return INVALID_CONTEXT;
  if (type != 1 || flags != 0 || n == 0) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p);
  int ok = a && p + n <= a->base + a->size;
  int whole = ok && p == a->base && n == a->size;
  pthread_mutex_unlock(&mu);
  if (!ok) return INVALID_VALUE;
  unsigned long long pg = (unsigned long long)sysconf(_SC_PAGESIZE);
  if (!whole && ((p | n) & (pg - 1))) return INVALID_VALUE;
  int fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)n) != 0) return 999;
  *(int *)handle = fd;
  return OK;
}

CUresult cuGetErrorName(CUresult e, const char **s) {
  *s = e == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
     : e == INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT"
     : "CUDA_ERROR_UNKNOWN";
  return OK;
}

/* ---- For the proxy memory provider: memset, device-to-device copies, pinned host memory,
 * IPC handles (the "other process" maps an allocation at the same address here). */
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  if (cur() < 0) return INVALID_CONTEXT;
  if (!inside(d, n)) return INVALID_VALUE;
  memset((void *)(uintptr_t)d, v, n);
  return OK;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
  if (!inside(d, n) || !inside(s, n)) return INVALID_VALUE;
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  return OK;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
  if (cur() < 0) return INVALID_CONTEXT;
  if (n == 0 || (flags & ~3u)) return INVALID_VALUE;
  void *m = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
  if (!m) return 2;
  memset(m, 0xab, n); /* not zeroed, like the real driver: the provider must zero it */
  *p = m;
  return OK;
}
CUresult cuMemFreeHost(void *p) {
  if (cur() < 0) return INVALID_CONTEXT;
  free(p);
  return OK;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
  if (cur() < 0) return INVALID_CONTEXT;
  if (flags) return INVALID_VALUE;
  *d = (CUdeviceptr)(uintptr_t)p;
  return OK;
}
typedef struct { char reserved[64]; } CUipcMemHandle;
static int ipc_open_count;
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  if (cur() < 0) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p);
  int base = a && a->base == p;
  pthread_mutex_unlock(&mu);
  if (!base) return INVALID_VALUE;
  memset(h, 0, sizeof *h);
  memcpy(h->reserved, "fakeipc!", 8);
  memcpy(h->reserved + 8, &p, sizeof p);
  return OK;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *d, CUipcMemHandle h, unsigned flags) {
  if (cur() < 0) return INVALID_CONTEXT;
  if (flags != 1 || memcmp(h.reserved, "fakeipc!", 8) != 0) return INVALID_VALUE;
  CUdeviceptr p;
  memcpy(&p, h.reserved + 8, sizeof p);
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p);
  pthread_mutex_unlock(&mu);
  if (!a || a->base != p) return INVALID_VALUE;
  __atomic_add_fetch(&ipc_open_count, 1, __ATOMIC_SEQ_CST);
  *d = p;
  return OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr d) {
  if (cur() < 0) return INVALID_CONTEXT;
  (void)d;
  return __atomic_sub_fetch(&ipc_open_count, 1, __ATOMIC_SEQ_CST) >= 0 ? OK : INVALID_VALUE;
}
