/*
 * net_tables_v6_v10.h: the older NCCL net plugin tables that libnccl-net-ibnet.so exports next to
 * v11 and v8 (declared in include/ibnet.h), for the ABI test only. Layouts as NCCL's net_v6.h ..
 * net_v10.h: v6 and v7 take int sizes in regMr/isend/irecv, v9 size_t, v10 adds the profiler
 * callback to init, the comm config to connect and the phandles to isend/irecv.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef IBNET_NET_TABLES_V6_V10_H
#define IBNET_NET_TABLES_V6_V10_H

#include "../../../include/ibnet.h"

typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int speed; int port; float latency;
  int maxComms; int maxRecvs;
} ibnet_properties_v6_t;

typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int speed; int port; float latency;
  int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
} ibnet_properties_v7_t;

typedef struct {
  char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; int netDeviceType;
  int netDeviceVersion; ibnet_vdevice_props_t vProps; size_t maxP2pBytes; size_t maxCollBytes;
} ibnet_properties_v9_t; /* also v10's */

/* Members every table v6..v10 shares after accept, with the size type S of regMr. */
#define IBNET_TABLE_MR(S)                                                                     \
  ibnet_result_t (*regMr)(void* comm, void* data, S size, int type, void** mhandle);          \
  ibnet_result_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, \
                                int fd, void** mhandle);                                      \
  ibnet_result_t (*deregMr)(void* comm, void* mhandle);
#define IBNET_TABLE_TAIL                                                                      \
  ibnet_result_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,    \
                           void** request);                                                   \
  ibnet_result_t (*test)(void* request, int* done, int* sizes);                               \
  ibnet_result_t (*closeSend)(void* sendComm);                                                \
  ibnet_result_t (*closeRecv)(void* recvComm);                                                \
  ibnet_result_t (*closeListen)(void* listenComm);

typedef struct {
  const char* name;
  ibnet_result_t (*init)(ibnet_logger_t logFunction);
  ibnet_result_t (*devices)(int* ndev);
  ibnet_result_t (*getProperties)(int dev, ibnet_properties_v6_t* props);
  ibnet_result_t (*listen)(int dev, void* handle, void** listenComm);
  ibnet_result_t (*connect)(int dev, void* handle, void** sendComm);
  ibnet_result_t (*accept)(void* listenComm, void** recvComm);
  IBNET_TABLE_MR(int)
  ibnet_result_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ibnet_result_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                          void** mhandles, void** request);
  IBNET_TABLE_TAIL
} ibnet_net_v6_t;

typedef struct {
  const char* name;
  ibnet_result_t (*init)(ibnet_logger_t logFunction);
  ibnet_result_t (*devices)(int* ndev);
  ibnet_result_t (*getProperties)(int dev, ibnet_properties_v7_t* props);
  ibnet_result_t (*listen)(int dev, void* handle, void** listenComm);
  ibnet_result_t (*connect)(int dev, void* handle, void** sendComm, ibnet_device_handle_t** sendDevComm);
  ibnet_result_t (*accept)(void* listenComm, void** recvComm, ibnet_device_handle_t** recvDevComm);
  IBNET_TABLE_MR(int)
  ibnet_result_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ibnet_result_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                          void** mhandles, void** request);
  IBNET_TABLE_TAIL
  ibnet_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ibnet_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ibnet_net_v7_t;

typedef struct {
  const char* name;
  ibnet_result_t (*init)(ibnet_logger_t logFunction);
  ibnet_result_t (*devices)(int* ndev);
  ibnet_result_t (*getProperties)(int dev, ibnet_properties_v9_t* props);
  ibnet_result_t (*listen)(int dev, void* handle, void** listenComm);
  ibnet_result_t (*connect)(int dev, void* handle, void** sendComm, ibnet_device_handle_t** sendDevComm);
  ibnet_result_t (*accept)(void* listenComm, void** recvComm, ibnet_device_handle_t** recvDevComm);
  IBNET_TABLE_MR(size_t)
  ibnet_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  ibnet_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                          void** mhandles, void** request);
  IBNET_TABLE_TAIL
  ibnet_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ibnet_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ibnet_result_t (*makeVDevice)(int* d, ibnet_vdevice_props_t* props);
} ibnet_net_v9_t;

typedef struct {
  const char* name;
  ibnet_result_t (*init)(ibnet_logger_t logFunction, ibnet_profiler_cb_t profFunction);
  ibnet_result_t (*devices)(int* ndev);
  ibnet_result_t (*getProperties)(int dev, ibnet_properties_v9_t* props);
  ibnet_result_t (*listen)(int dev, void* handle, void** listenComm);
  ibnet_result_t (*connect)(int dev, ibnet_comm_config_t* config, void* handle, void** sendComm,
                            ibnet_device_handle_t** sendDevComm);
  ibnet_result_t (*accept)(void* listenComm, void** recvComm, ibnet_device_handle_t** recvDevComm);
  IBNET_TABLE_MR(size_t)
  ibnet_result_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                          void* phandle, void** request);
  ibnet_result_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                          void** mhandles, void** phandles, void** request);
  IBNET_TABLE_TAIL
  ibnet_result_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ibnet_result_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ibnet_result_t (*makeVDevice)(int* d, ibnet_vdevice_props_t* props);
} ibnet_net_v10_t;

#undef IBNET_TABLE_MR
#undef IBNET_TABLE_TAIL

#endif
