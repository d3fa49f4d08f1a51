/*
 * ibnet.h: C/C++ declarations of what libnccl-net-ibnet.so / libibnet.a export.
 *
 * The library exports exactly the NCCL net plugin tables ncclNetPlugin_v6 .. ncclNetPlugin_v11.
 * This header declares the v11 and v8 tables with ibnet_-prefixed type names (layouts identical
 * to NCCL 2.28's ncclNet_v11_t / ncclNet_v8_t), so it can be included next to NCCL's headers.
 * Static users link libibnet.a plus -lpthread -ldl -lm (the library dlopens libibverbs itself).
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

#ifdef __cplusplus
}
#endif
#endif /* IBNET_H */
