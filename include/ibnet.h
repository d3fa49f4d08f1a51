/*
 * ibnet.h: C/C++ declarations of what libnccl-net-ibnet.so / libibnet.a export.
 *
 * The library exports the NCCL net plugin tables ncclNetPlugin_v6 .. ncclNetPlugin_v11 and the
 * proxy engine's C API (ibnet_proxy_*, at the end of this header).
 * This header declares the v11 and v8 tables with ibnet_-prefixed type names (layouts identical
 * to NCCL 2.28's ncclNet_v11_t / ncclNet_v8_t), so it can be included next to NCCL's headers.
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

typedef struct { int ndevs; int devs[4]; } ibnet_vdevice_props_t;
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
  ibnet_result_t (*makeVDevice)(int* d, ibnet_vdevice_props_t* props);            /* NULL */
  ibnet_result_t (*finalize)(void* ctx);
  ibnet_result_t (*setNetAttr)(void* ctx, ibnet_net_attr_t* netAttr);
} ibnet_net_v11_t;

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
 * lines whose last 8 bytes are the flag 1 + k) are the NCCL protocols; see core::proxy.
 *
 * Complete example: one SIMPLE transfer of 3 steps through ibnet's own soft provider
 * (run with IBNET_PROVIDER=soft; link with -lnccl-net-ibnet or libibnet.a):
 *
 *   #include <stdatomic.h>
 *   #include <stdio.h>
 *   #include <string.h>
 *   #include "ibnet.h"
 *   #define TRY(x) do { if ((x) != 0) { fprintf(stderr, "%s failed\n", #x); return 1; } } while (0)
 *
 *   int main(void) {
 *     ibnet_proxy_config_t cfg = {0};            // zero fields: NCCL 2.28 defaults
 *     cfg.buffSizes[IBNET_PROTO_SIMPLE] = 8 << 16;  // 8 slots of 64 KiB
 *     ibnet_proxy_t* px;
 *     TRY(ibnet_proxy_create(NULL, &cfg, NULL, &px)); // NULL: this library's table, host memory
 *     ibnet_proxy_setup_t rq = {0}, sq = {0};
 *     rq.tpRank = 1; rq.tpRemoteRank = 0;        // rank 1 receives from rank 0
 *     sq.tpRank = 0; sq.tpRemoteRank = 1;
 *     char handle[IBNET_HANDLE_MAXSIZE];
 *     uint32_t r, s;
 *     TRY(ibnet_proxy_setup(px, IBNET_PROXY_RECV, &rq, &r, handle));
 *     TRY(ibnet_proxy_setup(px, IBNET_PROXY_SEND, &sq, &s, NULL));
 *     for (int sd = 0, rd = 0; !sd || !rd;) {    // in real use: the handle crosses processes
 *       if (!sd) TRY(ibnet_proxy_connect_send(px, s, handle, &sd));
 *       if (!rd) TRY(ibnet_proxy_connect_recv(px, r, 0, &rd));
 *     }
 *     ibnet_proxy_device_view_t sv, rv;
 *     TRY(ibnet_proxy_device_view(px, s, &sv));
 *     TRY(ibnet_proxy_device_view(px, r, &rv));
 *     const size_t slot = sv.buffSizes[IBNET_PROTO_SIMPLE] / IBNET_PROXY_STEPS;
 *     ibnet_proxy_op_t *so, *ro;
 *     TRY(ibnet_proxy_op_create(IBNET_PROXY_SEND, IBNET_PROTO_SIMPLE, 1, 1, &so));
 *     TRY(ibnet_proxy_op_create(IBNET_PROXY_RECV, IBNET_PROTO_SIMPLE, 1, 1, &ro));
 *     TRY(ibnet_proxy_op_add(so, s, 3, 3 * slot, NULL));  // 3 steps through the connection
 *     TRY(ibnet_proxy_op_add(ro, r, 3, 3 * slot, NULL));
 *     _Atomic uint64_t* shead = (_Atomic uint64_t*)sv.head;
 *     _Atomic uint64_t* stail = (_Atomic uint64_t*)sv.tail;
 *     _Atomic uint64_t* rhead = (_Atomic uint64_t*)rv.head;
 *     _Atomic uint64_t* rtail = (_Atomic uint64_t*)rv.tail;
 *     ibnet_conn_fifo_t* fifo = (ibnet_conn_fifo_t*)(sv.recvMem + 64);
 *     uint64_t ks = 0, kr = 0;
 *     for (int sd = 0, rd = 0; !sd || !rd;) {
 *       // The sending "GPU": fill every credited slot, publish its size, then tail.
 *       while (ks < 3 && atomic_load(shead) + IBNET_PROXY_STEPS > ks) {
 *         memset((void*)(sv.buffs[IBNET_PROTO_SIMPLE] + (ks % 8) * slot), 'a' + (int)ks, slot);
 *         atomic_store((_Atomic int64_t*)&fifo[ks % 8].size, (int64_t)slot);
 *         atomic_store(stail, ++ks);
 *       }
 *       if (!sd) TRY(ibnet_proxy_progress(px, so, &sd, NULL));
 *       if (!rd) TRY(ibnet_proxy_progress(px, ro, &rd, NULL));
 *       // The receiving "GPU": check every landed slot, then give it back.
 *       while (kr < atomic_load(rtail)) {
 *         const char* p = (const char*)(rv.buffs[IBNET_PROTO_SIMPLE] + (kr % 8) * slot);
 *         if (p[0] != 'a' + (int)kr || p[slot - 1] != 'a' + (int)kr) return 1;
 *         atomic_store(rhead, ++kr);
 *       }
 *     }
 *     TRY(ibnet_proxy_op_destroy(so));
 *     TRY(ibnet_proxy_op_destroy(ro));
 *     TRY(ibnet_proxy_free(px, s));
 *     TRY(ibnet_proxy_free(px, r));
 *     TRY(ibnet_proxy_destroy(px));
 *     printf("3 steps of %zu bytes verified\n", slot);
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

/* The caller's allocator (NULL in ibnet_proxy_create: zeroed host memory from the library).
 * alloc: kind 0 host, 1 device; returns 0 and zeroed, 4096-aligned memory mapped at *cpu for
 * this process, *gpu for kernels (same as cpu for host memory), *handle for itself. */
typedef struct {
  void* ctx;
  int (*alloc)(void* ctx, int kind, size_t size, void** cpu, uint64_t* gpu, uint64_t* handle);
  int (*free)(void* ctx, void* cpu, uint64_t handle);
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
ibnet_result_t ibnet_proxy_op_destroy(ibnet_proxy_op_t* op);
/* Releases exactly what the connection took (comm references, buffers, registrations). */
ibnet_result_t ibnet_proxy_free(ibnet_proxy_t* proxy, uint32_t conn);
/* Frees the proxy (finalizing the plugin context); every connection must be freed first. */
ibnet_result_t ibnet_proxy_destroy(ibnet_proxy_t* proxy);

#ifdef __cplusplus
}
#endif
#endif /* IBNET_H */
