/*
 * ibnet.h: C/C++ declarations of what libnccl-net-ibnet.so / libibnet.a export.
 *
 * The library exports the NCCL net plugin tables ncclNetPlugin_v6 .. ncclNetPlugin_v12 and the
 * proxy engine's C API (ibnet_proxy_*, at the end of this header). NCCL 2.30+ uses v12.
 * This header declares the v12, v11 and v8 tables with ibnet_-prefixed type names (layouts
 * identical to NCCL 2.30's ncclNet_v12_t and NCCL 2.28's ncclNet_v11_t / ncclNet_v8_t), so it
 * can be included next to NCCL's headers.
 * Static users link libibnet.a plus -lpthread -ldl -lm (the library dlopens libibverbs itself).
 *
 * The void* values the library hands out for listen/send/recv comms, requests and mhandles are
 * opaque tokens, not pointers: never dereference them. A closed comm's token (and its requests'
 * tokens) is rejected with an error; a memory handle is valid only on comms of its device.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef IBNET_H
#define IBNET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int ibnet_result_t; /* ncclResult_t: 0 success, 2 system, 3 internal, 4 invalid argument,
                               5 invalid usage, 6 remote error */
typedef void (*ibnet_logger_t)(int level, unsigned long flags, const char* file, int line,
                               const char* fmt, ...);
typedef ibnet_result_t (*ibnet_profiler_cb_t)(void** eHandle, int type, void* pHandle,
                                              int64_t pluginId, void* extData);

#define IBNET_HANDLE_MAXSIZE 128
#define IBNET_PTR_HOST 0x1
#define IBNET_PTR_CUDA 0x2
#define IBNET_PTR_DMABUF 0x4
#define IBNET_MAX_RECVS 8

typedef struct { int ndevs; int devs[4]; } ibnet_vdevice_props_t;     /* v9..v11 */
typedef struct { int ndevs; int devs[8]; } ibnet_vdevice_props_v12_t; /* v12: up to 8 devices */
#define IBNET_NET_ID_UNDEF -1 /* railId / planeId not set */
typedef struct { int trafficClass; } ibnet_comm_config_t;
typedef struct {
  int netDeviceType; int netDeviceVersion; void* handle; size_t size; int needsProxyProgress;
} ibnet_device_handle_t;
typedef struct {
  int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
} ibnet_comm_attr_t;
typedef struct { ibnet_comm_attr_t sendCommAttr, recvCommAttr; uint32_t op, algo, proto; } ibnet_net_attr_t;

typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; int netDeviceType;
  int netDeviceVersion; ibnet_vdevice_props_t vProps; size_t maxP2pBytes; size_t maxCollBytes;
  int maxMultiRequestSize;
} ibnet_properties_v11_t;

typedef struct {
  const char* name;
  ibnet_result_t (*init)(void** ctx, uint64_t commId, ibnet_comm_config_t* config,
                         ibnet_logger_t logFunction, ibnet_profiler_cb_t profFunction);
  ibnet_result_t (*devices)(int* ndev);
  ibnet_result_t (*getProperties)(int dev, ibnet_properties_v11_t* props);
  ibnet_result_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ibnet_result_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                            ibnet_device_handle_t** sendDevComm);
  ibnet_result_t (*accept)(void* listenComm, void** recvComm, ibnet_device_handle_t** recvDevComm);
  ibnet_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ibnet_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle);
  ibnet_result_t (*deregMr)(void* comm, void* mhandle);
  ibnet_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                          void* phandle, void** request);
  ibnet_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                          void** mhandles, void** phandles, void** request);
  ibnet_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                           void** request);
  ibnet_result_t (*test)(void* request, int* done, int* sizes);
  ibnet_result_t (*closeSend)(void* sendComm);
  ibnet_result_t (*closeRecv)(void* recvComm);
  ibnet_result_t (*closeListen)(void* listenComm);
  ibnet_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle); /* NULL */
  ibnet_result_t (*irecvConsumed)(void* recvComm, int n, void* request);          /* NULL */
  ibnet_result_t (*makeVDevice)(int* d, ibnet_vdevice_props_t* props);           /* <= 4 devs */
  ibnet_result_t (*finalize)(void* ctx);
  ibnet_result_t (*setNetAttr)(void* ctx, ibnet_net_attr_t* netAttr);
} ibnet_net_v11_t;

/* v12 (NCCL 2.30+): vProps holds 8 devices, so maxP2pBytes moves to offset 104; railId and planeId
 * (from NCCL_IB_HCA's dev:port:rail:plane, IBNET_NET_ID_UNDEF when unset) end the struct at 128. */
typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; int netDeviceType;
  int netDeviceVersion; ibnet_vdevice_props_v12_t vProps; size_t maxP2pBytes; size_t maxCollBytes;
  int maxMultiRequestSize; int16_t railId; int16_t planeId;
} ibnet_properties_v12_t;

typedef struct {
  const char* name;
  ibnet_result_t (*init)(void** ctx, uint64_t commId, ibnet_comm_config_t* config,
                         ibnet_logger_t logFunction, ibnet_profiler_cb_t profFunction);
  ibnet_result_t (*devices)(int* ndev);
  ibnet_result_t (*getProperties)(int dev, ibnet_properties_v12_t* props);
  ibnet_result_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ibnet_result_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                            ibnet_device_handle_t** sendDevComm);
  ibnet_result_t (*accept)(void* listenComm, void** recvComm, ibnet_device_handle_t** recvDevComm);
  ibnet_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ibnet_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle);
  ibnet_result_t (*deregMr)(void* comm, void* mhandle);
  ibnet_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                          void* phandle, void** request);
  ibnet_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                          void** mhandles, void** phandles, void** request);
  ibnet_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                           void** request);
  ibnet_result_t (*test)(void* request, int* done, int* sizes);
  ibnet_result_t (*closeSend)(void* sendComm);
  ibnet_result_t (*closeRecv)(void* recvComm);
  ibnet_result_t (*closeListen)(void* listenComm);
  ibnet_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle); /* NULL */
  ibnet_result_t (*irecvConsumed)(void* recvComm, int n, void* request);          /* NULL */
  ibnet_result_t (*makeVDevice)(int* d, ibnet_vdevice_props_v12_t* props);       /* <= 8 devs */
  ibnet_result_t (*finalize)(void* ctx);
  ibnet_result_t (*setNetAttr)(void* ctx, ibnet_net_attr_t* netAttr);
} ibnet_net_v12_t;

typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int speed; int port;
  float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
} ibnet_properties_v8_t;

typedef struct {
  const char* name;
  ibnet_result_t (*init)(ibnet_logger_t logFunction);
  ibnet_result_t (*devices)(int* ndev);
  ibnet_result_t (*getProperties)(int dev, ibnet_properties_v8_t* props);
  ibnet_result_t (*listen)(int dev, void* handle, void** listenComm);
  ibnet_result_t (*connect)(int dev, void* handle, void** sendComm, ibnet_device_handle_t** sendDevComm);
  ibnet_result_t (*accept)(void* listenComm, void** recvComm, ibnet_device_handle_t** recvDevComm);
  ibnet_result_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ibnet_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle);
  ibnet_result_t (*deregMr)(void* comm, void* mhandle);
  ibnet_result_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ibnet_result_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                          void** mhandles, void** request);
  ibnet_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                           void** request);
  ibnet_result_t (*test)(void* request, int* done, int* sizes);
  ibnet_result_t (*closeSend)(void* sendComm);
  ibnet_result_t (*closeRecv)(void* recvComm);
  ibnet_result_t (*closeListen)(void* listenComm);
  ibnet_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ibnet_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ibnet_net_v8_t;

/* The exported tables (v6, v7, v9 and v10 are exported too; see NCCL's net_v*.h). */
extern const ibnet_net_v12_t ncclNetPlugin_v12;
extern const ibnet_net_v11_t ncclNetPlugin_v11;
extern const ibnet_net_v8_t ncclNetPlugin_v8;

/* ============================================================================================
 * The proxy engine (NCCL's net transport, net.cc, as a library)
 * ============================================================================================
 *
 * Feeds any net plugin (its newest of ncclNetPlugin_v11 .. _v6, loaded from a path, or this
 * library's own v11 table) from GPU-side rings exactly as NCCL's proxy thread does. One thread drives a proxy and its
 * operations; the GPU side (a kernel, or host code) touches only the shared memory described
 * by ibnet_proxy_device_view_t. Calls return 0 on success, else an ibnet_result_t (the failure
 * is logged as a WARN through the plugin's logger). Bad handles and arguments are errors,
 * never crashes (as far as a pointer can be checked).
 *
 *   create ─▶ setup(recv) → 128-byte handle ─▶ setup(send)            (per connection pair)
 *          ─▶ connect_send(handle) / connect_recv(rank) until *connected == 1 for both
 *          ─▶ device_view: what the GPU side uses
 *          ─▶ op_create, op_add (one sub per connection), progress until *done, op_destroy
 *          ─▶ free each connection ─▶ destroy
 *
 * The ring (ibnet_proxy_device_view_t, 8 slots, step k uses slot k % 8):
 *   send, GPU side: wait until *head + 8 > k; write the slot (SIMPLE: at
 *     buffs[2] + (k%8) * buffSizes[2]/8, or at buffs[2] + connFifo[k%8].offset in shared mode);
 *     store connFifo[k%8].size = bytes (release); store *tail = k + 1 (release; LL: flags only).
 *   recv, GPU side: wait until *tail > k (acquire); read the slot; store *head = k + 1.
 *   recvMem points to: { uint64_t tail; uint8_t pad[56]; ibnet_conn_fifo_t connFifo[8]; ... }
 *   and connFifo[k%8].size is -1 when the slot is empty.
 * SIMPLE, LL (16-byte lines: two {data32, flag32} halves, flag = 1 + k) and LL128 (128-byte
 * lines whose last 8 bytes are the flag 1 + k) are the NCCL protocols; see the ibnet-proxy crate (proxy/).
 *
 * Across processes (NCCL's PXN: the GPU's process is not the proxy's): the GPU process sends
 * its ibnet_proxy_process_id to the proxy, which puts it in ibnet_proxy_setup_t.gpuProcess;
 * the engine then allocates exportable banks (POSIX shared memory with mem == NULL, or the
 * caller's exportMem) and ibnet_proxy_export_map gives the IBNET_PROXY_MAP_BYTES the GPU
 * process passes to ibnet_proxy_attach (checked in full, banks mapped there) for its
 * ibnet_proxy_device_view_t; ibnet_proxy_detach unmaps them, ibnet_proxy_free on the proxy
 * side frees them. GDR-copy words are used only when the GPU side is in the proxy's process.
 *
 * Complete example: one SIMPLE transfer of 3 steps through ibnet's own soft provider, the
 * proxy in this process, the "GPU" (both kernels) in a forked one
 * (run with IBNET_PROVIDER=soft; link with -lnccl-net-ibnet or libibnet.a):
 *
 *   #include <stdarg.h>
 *   #include <stdatomic.h>
 *   #include <stdio.h>
 *   #include <string.h>
 *   #include <sys/wait.h>
 *   #include <unistd.h>
 *   #include "ibnet.h"
 *   #define TRY(x) do { if ((x) != 0) { fprintf(stderr, "%s failed\n", #x); return 1; } } while (0)
 *   enum { NSTEPS = 3 };
 *
 *   static void logger(int level, unsigned long flags, const char* file, int line,
 *                      const char* fmt, ...) {
 *     (void)flags; (void)file; (void)line;
 *     if (level > IBNET_LOG_WARN) return;       // WARN lines only
 *     va_list ap;
 *     va_start(ap, fmt);
 *     vfprintf(stderr, fmt, ap);
 *     va_end(ap);
 *     fputc('\n', stderr);
 *   }
 *   static void onEvent(void* ctx, const ibnet_proxy_event_t* ev) {
 *     if (ev->kind == IBNET_PROF_STEP_STOP) *(int*)ctx += (int)(ev->to - ev->from);
 *   }
 *
 *   // The GPU process: maps both connections, plays the sending and the receiving kernel.
 *   static int gpu(int in, int out, pid_t proxy) {
 *     uint64_t id;
 *     TRY(ibnet_proxy_process_id(&id));
 *     if (write(out, &id, sizeof id) != sizeof id) return 1;
 *     char maps[2][IBNET_PROXY_MAP_BYTES];
 *     if (read(in, maps, sizeof maps) != sizeof maps) return 1;
 *     ibnet_proxy_attach_t *sa, *ra;
 *     ibnet_proxy_device_view_t sv, rv;          // addresses in this process
 *     TRY(ibnet_proxy_attach(NULL, maps[0], sizeof maps[0], &sa, &sv));
 *     TRY(ibnet_proxy_attach(NULL, maps[1], sizeof maps[1], &ra, &rv));
 *     const size_t slot = sv.buffSizes[IBNET_PROTO_SIMPLE] / IBNET_PROXY_STEPS;
 *     _Atomic uint64_t* shead = (_Atomic uint64_t*)sv.head;
 *     _Atomic uint64_t* stail = (_Atomic uint64_t*)sv.tail;
 *     _Atomic uint64_t* rhead = (_Atomic uint64_t*)rv.head;
 *     _Atomic uint64_t* rtail = (_Atomic uint64_t*)rv.tail;
 *     ibnet_conn_fifo_t* fifo = (ibnet_conn_fifo_t*)(sv.recvMem + 64);
 *     for (uint64_t ks = 0, kr = 0; kr < NSTEPS;) {
 *       if (getppid() != proxy) return 1;        // the proxy died: never wait forever
 *       while (ks < NSTEPS && atomic_load(shead) + IBNET_PROXY_STEPS > ks) {
 *         memset((void*)(sv.buffs[IBNET_PROTO_SIMPLE] + (ks % 8) * slot), 'a' + (int)ks, slot);
 *         atomic_store((_Atomic int64_t*)&fifo[ks % 8].size, (int64_t)slot);
 *         atomic_store(stail, ++ks);
 *       }
 *       while (kr < atomic_load(rtail)) {
 *         const char* p = (const char*)(rv.buffs[IBNET_PROTO_SIMPLE] + (kr % 8) * slot);
 *         if (p[0] != 'a' + (int)kr || p[slot - 1] != 'a' + (int)kr) return 1;
 *         atomic_store(rhead, ++kr);
 *       }
 *     }
 *     TRY(ibnet_proxy_detach(sa));
 *     TRY(ibnet_proxy_detach(ra));
 *     return 0;
 *   }
 *
 *   int main(void) {
 *     int up[2], down[2];
 *     if (pipe(up) != 0 || pipe(down) != 0) return 1;
 *     const pid_t me = getpid(), child = fork();
 *     if (child < 0) return 1;
 *     if (child == 0) _exit(gpu(down[0], up[1], me));
 *     uint64_t gpuId;                            // who the GPU side is: decides sameProcess
 *     if (read(up[0], &gpuId, sizeof gpuId) != sizeof gpuId) return 1;
 *     TRY(ibnet_proxy_set_logger(logger));
 *     ibnet_proxy_config_t cfg = {0};            // zero fields: NCCL 2.28 defaults
 *     cfg.buffSizes[IBNET_PROTO_SIMPLE] = 8 << 16;  // 8 slots of 64 KiB
 *     ibnet_proxy_t* px;
 *     TRY(ibnet_proxy_create(NULL, &cfg, NULL, &px)); // NULL: this library's table, shared memory
 *     int steps = 0;
 *     ibnet_proxy_profiler_t prof = { &steps, onEvent };
 *     TRY(ibnet_proxy_set_profiler(px, &prof));
 *     ibnet_proxy_setup_t rq = {0}, sq = {0};
 *     rq.tpRank = 1; rq.tpRemoteRank = 0; rq.gpuProcess = gpuId;  // rank 1 receives from rank 0
 *     sq.tpRank = 0; sq.tpRemoteRank = 1; sq.gpuProcess = gpuId;
 *     char handle[IBNET_HANDLE_MAXSIZE];
 *     uint32_t r, s;
 *     TRY(ibnet_proxy_setup(px, IBNET_PROXY_RECV, &rq, &r, handle));
 *     TRY(ibnet_proxy_setup(px, IBNET_PROXY_SEND, &sq, &s, NULL));
 *     for (int sd = 0, rd = 0; !sd || !rd;) {    // in real use: the handle crosses nodes
 *       if (!sd) TRY(ibnet_proxy_connect_send(px, s, handle, &sd));
 *       if (!rd) TRY(ibnet_proxy_connect_recv(px, r, 0, &rd));
 *     }
 *     char maps[2][IBNET_PROXY_MAP_BYTES];
 *     TRY(ibnet_proxy_export_map(px, s, maps[0], sizeof maps[0]));
 *     TRY(ibnet_proxy_export_map(px, r, maps[1], sizeof maps[1]));
 *     if (write(down[1], maps, sizeof maps) != sizeof maps) return 1;
 *     ibnet_proxy_device_view_t sv;
 *     TRY(ibnet_proxy_device_view(px, s, &sv));
 *     const size_t slot = sv.buffSizes[IBNET_PROTO_SIMPLE] / IBNET_PROXY_STEPS;
 *     ibnet_proxy_op_t *so, *ro;
 *     TRY(ibnet_proxy_op_create(IBNET_PROXY_SEND, IBNET_PROTO_SIMPLE, 1, 1, &so));
 *     TRY(ibnet_proxy_op_create(IBNET_PROXY_RECV, IBNET_PROTO_SIMPLE, 1, 1, &ro));
 *     TRY(ibnet_proxy_op_add(so, s, NSTEPS, NSTEPS * slot, NULL));
 *     TRY(ibnet_proxy_op_add(ro, r, NSTEPS, NSTEPS * slot, NULL));
 *     int status = 0, reaped = 0;
 *     for (int sd = 0, rd = 0; !sd || !rd;) {
 *       if (!sd) TRY(ibnet_proxy_progress(px, so, &sd, NULL));
 *       if (!rd) TRY(ibnet_proxy_progress(px, ro, &rd, NULL));
 *       if (!reaped && waitpid(child, &status, WNOHANG) == child) {
 *         reaped = 1;                              // the GPU process ended: fine if it succeeded
 *         if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;  // never wait on it
 *       }
 *     }
 *     if (!reaped && waitpid(child, &status, 0) != child) return 1;
 *     if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
 *     TRY(ibnet_proxy_op_destroy(so));
 *     TRY(ibnet_proxy_op_destroy(ro));
 *     TRY(ibnet_proxy_free(px, s));
 *     TRY(ibnet_proxy_free(px, r));
 *     TRY(ibnet_proxy_destroy(px));
 *     printf("%d steps of %zu bytes verified in another process\n", steps / 2, slot);
 *     return 0;
 *   }
 */

#define IBNET_PROXY_STEPS 8   /* slots in a connection's ring (NCCL_STEPS) */
#define IBNET_PROXY_SEND 0
#define IBNET_PROXY_RECV 1
#define IBNET_PROTO_LL 0
#define IBNET_PROTO_LL128 1
#define IBNET_PROTO_SIMPLE 2

typedef struct ibnet_proxy ibnet_proxy_t;       /* an engine (connections, shared pools) */
typedef struct ibnet_proxy_op ibnet_proxy_op_t; /* an operation: up to 16 subs */
typedef struct ibnet_proxy_attach ibnet_proxy_attach_t; /* a connection mapped in a GPU process */

/* Bytes of a cross-process connection map (ibnet_proxy_export_map, ibnet_proxy_attach). */
#define IBNET_PROXY_MAP_BYTES 544
/* Kinds of export handles (ibnet_proxy_mem_t exportMem / importMem). */
#define IBNET_HANDLE_PROCESS_FD 1 /* an fd of the exporting process: int32 fd, 4 zero bytes, uint64 inode, uint64 device */
#define IBNET_HANDLE_CUMEM_FD 2   /* a cuMem POSIX-fd shareable handle of the exporting process (same bytes) */
#define IBNET_HANDLE_CUDA_IPC 3   /* the 64 bytes of a cudaIpcMemHandle_t */
#define IBNET_HANDLE_PROVIDER 4   /* bytes only the caller's importMem understands */

/* ibnet_logger_t levels and subsystem flags (NCCL's ncclDebugLogLevel, NCCL_INIT, NCCL_NET, ...). */
#define IBNET_LOG_WARN 2
#define IBNET_LOG_INFO 3
#define IBNET_LOG_TRACE 5
#define IBNET_LOG_FLAG_INIT 0x1UL
#define IBNET_LOG_FLAG_NET 0x10UL
#define IBNET_LOG_FLAG_ENV 0x80UL
#define IBNET_LOG_FLAG_ALL (~0UL)

/* Profiler events (ibnet_proxy_event_t.kind), and their states (.state; -1 when none). */
#define IBNET_PROF_OP_START 0   /* dir, nsteps, bytes (the sub's total) */
#define IBNET_PROF_OP_STATE 1   /* state: IBNET_PROF_OP_*; step in from (= to); bytes so far */
#define IBNET_PROF_OP_STOP 2
#define IBNET_PROF_STEP_START 3 /* steps [from, to) of the sub (relative to its first step) */
#define IBNET_PROF_STEP_STATE 4 /* state: IBNET_PROF_STEP_* */
#define IBNET_PROF_STEP_STOP 5
#define IBNET_PROF_OP_SEND_POSTED 0      /* NCCL's ncclProfilerProxyOpSendPosted, ... */
#define IBNET_PROF_OP_SEND_REM_FIFO_WAIT 1
#define IBNET_PROF_OP_SEND_TRANSMITTED 2
#define IBNET_PROF_OP_SEND_DONE 3
#define IBNET_PROF_OP_RECV_POSTED 4
#define IBNET_PROF_OP_RECV_RECEIVED 5
#define IBNET_PROF_OP_RECV_TRANSMITTED 6
#define IBNET_PROF_OP_RECV_DONE 7
#define IBNET_PROF_STEP_SEND_GPU_WAIT 0  /* NCCL's ncclProfilerProxyStepSendGPUWait, ... */
#define IBNET_PROF_STEP_SEND_WAIT 1
#define IBNET_PROF_STEP_RECV_WAIT 2
#define IBNET_PROF_STEP_RECV_FLUSH_WAIT 3
#define IBNET_PROF_STEP_RECV_GPU_WAIT 4
typedef struct {
  int kind;               /* IBNET_PROF_OP_START .. IBNET_PROF_STEP_STOP */
  int dir;                /* IBNET_PROXY_SEND / RECV on OP_START, else -1 */
  int state;
  uint32_t sub;           /* the sub-operation */
  uint64_t from, to;      /* steps */
  uint64_t bytes;
  uint64_t nsteps;        /* OP_START */
} ibnet_proxy_event_t;
/* Called on the proxy thread during ibnet_proxy_progress (keep it short; it must not call the proxy). */
typedef struct {
  void* ctx;
  void (*event)(void* ctx, const ibnet_proxy_event_t* ev);
} ibnet_proxy_profiler_t;

/* One slot descriptor in recvMem (NCCL's struct ncclConnFifo). */
typedef struct { uint32_t mode; uint32_t offset; int64_t size; uint64_t ptr; } ibnet_conn_fifo_t;

/* Engine settings; zero fields take NCCL 2.28's defaults. */
typedef struct {
  size_t buffSizes[3];  /* dedicated buffer bytes per protocol (LL, LL128, SIMPLE); 8 slots each */
  size_t p2pChunkSize;  /* shared-buffer slot bytes (NCCL_P2P_NET_CHUNKSIZE, 128 KiB) */
  int p2pNChannels;     /* channels a shared pool serves (32) */
  int sharedComms;      /* NCCL_NET_SHARED_COMMS: 0 default (on), 1 on, 2 off */
  int gdrCopyFlush;     /* flush with a GDR-copy read (needs a memory provider offering it) */
  size_t maxNetSize;    /* largest network piece of a registered buffer (1 GiB) */
} ibnet_proxy_config_t;

/* The caller's memory (NULL in ibnet_proxy_create: zeroed host memory from the library, POSIX
 * shared memory so a GPU process can map it). Callbacks return 0 on success.
 * alloc: kind 0 host, 1 device; zeroed, 4096-aligned memory mapped at *cpu for this process,
 *   *gpu for kernels (same as cpu for host memory), *handle for itself. free: gives back what
 *   alloc or gdcAlloc returned.
 * Optional (NULL: not offered):
 * gdcAlloc: GDR copy (NCCL's gdcSync/gdcFlush): `words` zeroed 8-byte device words at device
 *   address *gpu, mapped write-combined for this process at *cpu. The engine keeps the ring
 *   counter it writes there (send: head; receive: tail, then the flush word) when the GPU side
 *   is in this process; storeFence orders its stores (NCCL's wc_store_fence); with
 *   gdrCopyFlush, received data is flushed by reading the flush word: flushRead (NULL: the
 *   library reads it).
 * dmabufFd: a DMA-BUF fd for [offset, offset + len) of the device region at cpu (*fd = -1:
 *   none, register by address); the library closes it after registering.
 * exportMem: describes the region at cpu for another process: *kind (IBNET_HANDLE_*), up to
 *   64 bytes at handleOut, *offset of the region in the exported object (a multiple of 256).
 * importMem / unimportMem (GPU process, ibnet_proxy_attach): maps what exportMem described
 *   (owner: the exporting pid) at *cpu, *gpu for kernels, *token for unimportMem. Without
 *   importMem, IBNET_HANDLE_PROCESS_FD banks are mapped by the library. */
typedef struct {
  void* ctx;
  int (*alloc)(void* ctx, int kind, size_t size, void** cpu, uint64_t* gpu, uint64_t* handle);
  int (*free)(void* ctx, void* cpu, uint64_t handle);
  int (*gdcAlloc)(void* ctx, size_t words, void** cpu, uint64_t* gpu, uint64_t* handle);
  void (*storeFence)(void* ctx);
  void (*flushRead)(void* ctx, const uint64_t* word);
  int (*dmabufFd)(void* ctx, void* cpu, uint64_t handle, size_t offset, size_t len, int* fd);
  int (*exportMem)(void* ctx, void* cpu, uint64_t handle, size_t size, int* kind,
                   uint8_t* handleOut, uint64_t* offset);
  int (*importMem)(void* ctx, int kind, const uint8_t* handle, uint64_t owner, size_t size,
                   uint64_t offset, void** cpu, uint64_t* gpu, uint64_t* token);
  int (*unimportMem)(void* ctx, void* cpu, uint64_t token);
} ibnet_proxy_mem_t;

/* What the caller decided for a connection (NCCL's setupReq). */
typedef struct {
  uint32_t tpRank;        /* this rank: the tag of its sends */
  uint32_t tpLocalRank;   /* selects the shared pool */
  uint32_t tpRemoteRank;  /* the peer: the tag of receives; the shared comm key on send */
  uint32_t netDev;        /* the plugin's device */
  uint32_t channel;
  uint32_t connIndex;
  int shared;             /* shared buffers (p2p) */
  int useGdr;             /* buffers in device memory */
  int needFlush;          /* flush received data before the GPU reads it */
  uint64_t gpuProcess;    /* the GPU process's ibnet_proxy_process_id; 0: this process */
} ibnet_proxy_setup_t;

/* What the GPU side of a connection uses (GPU addresses). */
typedef struct {
  uint64_t head;          /* send: credits; recv: consumed steps (8-byte word) */
  uint64_t tail;          /* send: filled steps; recv: landed steps (8-byte word) */
  uint64_t recvMem;       /* { tail, pad, connFifo[8] } (4096 bytes) */
  uint64_t buffs[3];      /* per protocol, 0 when absent */
  size_t buffSizes[3];
  int dir;                /* IBNET_PROXY_SEND / IBNET_PROXY_RECV */
  int shared;             /* SIMPLE data at connFifo[k%8].offset in buffs[2] */
} ibnet_proxy_device_view_t;

/* pluginPath: a library exporting ncclNetPlugin_v11 .. _v6 (the newest is used; dlopen'ed,
 * never unloaded), or NULL for this library's own table. cfg, mem: NULL for defaults. Allocates. */
ibnet_result_t ibnet_proxy_create(const char* pluginPath, const ibnet_proxy_config_t* cfg,
                                  const ibnet_proxy_mem_t* mem, ibnet_proxy_t** proxy);
/* dir: IBNET_PROXY_SEND/RECV. A receive connection starts listening and writes the
 * IBNET_HANDLE_MAXSIZE-byte handle the sending peer connects with (handle may be NULL on send). */
ibnet_result_t ibnet_proxy_setup(ibnet_proxy_t* proxy, int dir, const ibnet_proxy_setup_t* req,
                                 uint32_t* conn, void* handle);
/* Call until *connected == 1. */
ibnet_result_t ibnet_proxy_connect_send(ibnet_proxy_t* proxy, uint32_t conn, const void* handle,
                                        int* connected);
/* remoteProxyRank: the rank whose proxy sends (the shared comm key). Call until *connected. */
ibnet_result_t ibnet_proxy_connect_recv(ibnet_proxy_t* proxy, uint32_t conn,
                                        uint32_t remoteProxyRank, int* connected);
ibnet_result_t ibnet_proxy_device_view(ibnet_proxy_t* proxy, uint32_t conn,
                                       ibnet_proxy_device_view_t* view);
/* proto: IBNET_PROTO_*; sliceSteps in 1..8 (steps per network operation), chunkSteps in
 * sliceSteps..8 (alignment of each sub's first step). Allocates. */
ibnet_result_t ibnet_proxy_op_create(int dir, int proto, uint32_t sliceSteps, uint32_t chunkSteps,
                                     ibnet_proxy_op_t** op);
/* One sub per connection (before the first progress): nsteps ring steps carrying nbytes, or,
 * with regBuff != NULL (SIMPLE, shared-buffer connection), nbytes straight from/to regBuff. */
ibnet_result_t ibnet_proxy_op_add(ibnet_proxy_op_t* op, uint32_t conn, uint64_t nsteps,
                                  size_t nbytes, void* regBuff);
/* Advances op without waiting; *done = 1 once finished; *idle (may be NULL) = 1 when nothing
 * moved. Never allocates. After an error the op is unusable: abort it. */
ibnet_result_t ibnet_proxy_progress(ibnet_proxy_t* proxy, ibnet_proxy_op_t* op, int* done,
                                    int* idle);
/* Bytes sub `sub` moved on the network so far. */
ibnet_result_t ibnet_proxy_op_bytes(ibnet_proxy_op_t* op, uint32_t sub, uint64_t* bytes);
/* Gives up on op (deregisters the user buffers it registered); free its connections next. */
ibnet_result_t ibnet_proxy_op_abort(ibnet_proxy_t* proxy, ibnet_proxy_op_t* op);
/* Frees op. An unfinished op that registered user buffers is refused (abort it first). */
ibnet_result_t ibnet_proxy_op_destroy(ibnet_proxy_op_t* op);
/* Releases exactly what the connection took (comm references, buffers, registrations). */
ibnet_result_t ibnet_proxy_free(ibnet_proxy_t* proxy, uint32_t conn);
/* Frees the proxy (finalizing the plugin context); every connection must be freed first. */
ibnet_result_t ibnet_proxy_destroy(ibnet_proxy_t* proxy);

/* The profiler: prof->event receives the engine's op and step events (NULL: none). */
ibnet_result_t ibnet_proxy_set_profiler(ibnet_proxy_t* proxy, const ibnet_proxy_profiler_t* prof);
/* The library's log lines (each starting NET/IBNET, passed as "%s") go to logger (NULL: refused). */
ibnet_result_t ibnet_proxy_set_logger(ibnet_logger_t logger);
/* This process's identity (a hash of host name and pid) for ibnet_proxy_setup_t.gpuProcess. */
ibnet_result_t ibnet_proxy_process_id(uint64_t* id);
/* A connection whose gpuProcess is another process: the map that process attaches with. */
ibnet_result_t ibnet_proxy_export_map(ibnet_proxy_t* proxy, uint32_t conn, void* buf, size_t len);
/* GPU process: checks and maps a map from ibnet_proxy_export_map (mem: NULL for a proxy using
 * the library's memory, else callbacks with importMem) and writes the view in this process. */
ibnet_result_t ibnet_proxy_attach(const ibnet_proxy_mem_t* mem, const void* map, size_t len,
                                  ibnet_proxy_attach_t** att, ibnet_proxy_device_view_t* view);
/* Unmaps what ibnet_proxy_attach mapped (after the kernels stopped using it). */
ibnet_result_t ibnet_proxy_detach(ibnet_proxy_attach_t* att);

#ifdef __cplusplus
}
#endif
#endif /* IBNET_H */
