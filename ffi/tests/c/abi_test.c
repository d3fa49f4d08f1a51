/*
 * ABI test for libnccl-net-ibnet.so, loading it exactly as NCCL does (dlopen RTLD_NOW|RTLD_LOCAL).
 *
 *   abi_test <plugin.so> [expect-devices=N|any]                      one host (fork)
 *   abi_test <plugin.so> <expect-devices|any> --server PORT          two hosts: the receiver
 *   abi_test <plugin.so> <expect-devices|any> --client HOST:PORT     two hosts: the sender
 *
 * 1. Resolves ncclNetPlugin_v12, ncclNetPlugin_v11 and ncclNetPlugin_v8; checks the name "IBNet".
 * 2. v11: init, devices, getProperties of every device; bad input (NULL pointers, dev out of
 *    range, n > 8, a foreign handle, a corrupt progress token) returns the right ncclResult_t and
 *    always writes *request; finalize (twice, and NULL). v12: the same properties in the
 *    128-byte struct, railId/planeId -1 (ABI_TEST_RAIL/ABI_TEST_PLANE: the values expected,
 *    e.g. with NCCL_IB_HCA=soft0:1:3:2); makeVDevice refuses 5 devices through v11 (its struct
 *    holds 4) and 9 through v12 (8), each with ncclInvalidArgument.
 * 3. dlclose.
 * 4. With at least one device: a two-process data test through each table of ABI_TEST_TABLES
 *    (default "12,11,8"; any of 6..12, in the order given). Each process dlopens the table's
 *    symbol, inits through it (v11/v12: ctx/commId/config, v10: logger + profiler, v6..v9: logger),
 *    moves the data, then finalizes (v11) and dlcloses. The receiver listens, the sender
 *    connects: single receives of 0 B .. ABI_TEST_MAX_BYTES (default 16 MiB) and an 8-way
 *    multi-receive of 8 different sizes, data verified byte for byte and each receive reporting
 *    the bytes its send carried (the sizes FIFO), then a send larger than its posted receive
 *    (the sender gets an error ncclResult_t and a WARN). Prints sizes and GB/s.
 *    One host: fork before loading; the handle and the final ack travel over pipes.
 *    Two hosts (--server/--client): the same test between processes on two hosts; the handle and
 *    the ack travel over one TCP connection (the server accepts one client; the client retries
 *    its connect for up to 60 s); the server receives, the client sends. Run it with
 *    IBNET_PROVIDER=soft on a host without RDMA NICs (one host only).
 *    After close and dlclose, each process has as many threads as before loading (v8 too:
 *    the plugin stops its threads when the last comm closes).
 *    v10/v11: init gets a counting profiler callback and isend/irecv a parent handle; each
 *    process checks that the plugin started QP events and stopped every one (by close).
 * 5. A second load-use-unload cycle in this process.
 * ABI_TEST_BW_ITERS (default 50): timed messages per size after the 10 verified ones;
 * ABI_TEST_MIN_BYTES (default 0): leave out the smaller sizes. ABI_TEST_FAULT=1: a failing
 * test() (a fault injected from outside) ends the run: close the comm, finalize, dlclose, say so,
 * exit status 3.
 * Any hang is turned into a failure by alarm() (ABI_TEST_ALARM_S, default 600).
 * Exit status 0 on success. Writes its report to stdout (the plugin itself never does).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../../include/ibnet.h"
#include "net_tables_v6_v10.h"

#define CHECK(c)                                                          \
  do {                                                                    \
    if (!(c)) {                                                           \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);        \
      exit(1);                                                            \
    }                                                                     \
  } while (0)
#define EXPECT_RC(call, want)                                                              \
  do {                                                                                     \
    int rc_ = (call);                                                                      \
    if (rc_ != (want)) {                                                                   \
      fprintf(stderr, "FAIL %s:%d: %s returned %d, want %d\n", __FILE__, __LINE__, #call, \
              rc_, (want));                                                                \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static int g_warns;
/* The profiler callback given to v10/v11 init: counts QP events, checks what NCCL's would read. */
static int g_parent; /* &g_parent is the phandle passed to v10/v11 isend/irecv */
static long g_prof_starts, g_prof_stops, g_prof_next;
static int prof_cb(void** eh, int type, void* ph, int64_t id, void* ext) {
  if (type == 0) { /* start: parent given, IB plugin id v1, descriptor type ncclProfileQp */
    CHECK(eh && ph == &g_parent && id == ((1 << 16) | 1) && ext && *(const uint8_t*)ext == 1);
    *eh = (void*)(intptr_t)++g_prof_next;
    g_prof_starts++;
  } else if (type == 1) {
    CHECK(eh && *eh && ph == NULL && ext == NULL);
    g_prof_stops++;
  }
  return 0;
}
static int g_cma_refused; /* the soft provider's probe said cross-memory attach is refused */
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == 2) g_warns++;
  if (level == 2 && strstr(msg, "cross-memory attach is not permitted")) g_cma_refused = 1;
  if (getenv("ABI_TEST_VERBOSE") || level == 2)
    fprintf(stderr, "[plugin %s] %s\n", level == 2 ? "WARN" : level == 3 ? "INFO" : "TRACE", msg);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void bad_input(const ibnet_net_v11_t* n, int ndev) {
  ibnet_properties_v11_t p;
  void* req = (void*)0x1;
  void* comm = NULL;
  char handle[IBNET_HANDLE_MAXSIZE];
  int done;
  EXPECT_RC(n->devices(NULL), 3);
  EXPECT_RC(n->getProperties(ndev, &p), 4);
  EXPECT_RC(n->getProperties(-1, &p), 4);
  EXPECT_RC(n->getProperties(0, NULL), 3);
  EXPECT_RC(n->listen(NULL, ndev, handle, &comm), 4);
  CHECK(comm == NULL);
  EXPECT_RC(n->listen(NULL, 0, NULL, &comm), 3);
  /* A foreign handle: wrong magic. */
  memset(handle, 0x5a, sizeof handle);
  comm = (void*)0x1234;
  int rc = n->connect(NULL, 0, handle, &comm, NULL);
  CHECK(rc == 2 || (ndev == 0 && rc == 4));
  CHECK(comm == NULL);
  EXPECT_RC(n->isend(NULL, handle, 8, 0, NULL, NULL, &req), 3);
  CHECK(req == NULL);
  req = (void*)0x1; /* NCCL's optional-completion hint */
  EXPECT_RC(n->irecv(NULL, 1, NULL, NULL, NULL, NULL, NULL, &req), 3);
  CHECK(req == NULL);
  EXPECT_RC(n->isend(handle, handle, 8, 0, NULL, NULL, NULL), 3);
  EXPECT_RC(n->test(NULL, &done, NULL), 3);
  EXPECT_RC(n->test(handle, NULL, NULL), 3);
  EXPECT_RC(n->closeSend(NULL), 3);
  EXPECT_RC(n->closeRecv(NULL), 3);
  EXPECT_RC(n->closeListen(NULL), 3);
  /* A NULL mhandle is a no-op, as in NCCL's own plugin; a bogus one on no comm is refused. */
  EXPECT_RC(n->deregMr(NULL, NULL), 0);
  EXPECT_RC(n->deregMr(NULL, handle), 3);
  EXPECT_RC(n->regMr(NULL, handle, 8, IBNET_PTR_HOST, &comm), 3);
  CHECK(n->getDeviceMr == NULL && n->irecvConsumed == NULL);
}

static void fill(unsigned char* b, size_t len, unsigned seed) {
  for (size_t i = 0; i < len; i++) b[i] = (unsigned char)(i * 131u + seed * 7u + (i >> 12));
}

static int verify(const unsigned char* b, size_t len, unsigned seed) {
  for (size_t i = 0; i < len; i++)
    if (b[i] != (unsigned char)(i * 131u + seed * 7u + (i >> 12))) return 0;
  return 1;
}

/* One loaded plugin, through any table v6..v12: the pair test runs the same code over each. */
typedef struct {
  void* dl;
  int ver;
  const ibnet_net_v6_t* n6;
  const ibnet_net_v7_t* n7;
  const ibnet_net_v8_t* n8;
  const ibnet_net_v9_t* n9;
  const ibnet_net_v10_t* n10;
  const ibnet_net_v11_t* n11;
  const ibnet_net_v12_t* n12;
  void* ctx;
} net_t;

static void* table(net_t* n, int ver) {
  char sym[32];
  snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", ver);
  void* t = dlsym(n->dl, sym);
  if (!t) fprintf(stderr, "FAIL: %s not exported\n", sym);
  CHECK(t);
  CHECK(strcmp(*(const char* const*)t, "IBNet") == 0); /* every table starts with its name */
  return t;
}

static void net_load(net_t* n, const char* path, int ver) {
  memset(n, 0, sizeof *n);
  n->ver = ver;
  n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!n->dl) {
    fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
    exit(1);
  }
  int ndev = 0;
  ibnet_comm_config_t cfg = {-1};
  switch (ver) {
    case 6: n->n6 = table(n, 6); EXPECT_RC(n->n6->init(logger), 0); EXPECT_RC(n->n6->devices(&ndev), 0); break;
    case 7: n->n7 = table(n, 7); EXPECT_RC(n->n7->init(logger), 0); EXPECT_RC(n->n7->devices(&ndev), 0); break;
    case 8: n->n8 = table(n, 8); EXPECT_RC(n->n8->init(logger), 0); EXPECT_RC(n->n8->devices(&ndev), 0); break;
    case 9: n->n9 = table(n, 9); EXPECT_RC(n->n9->init(logger), 0); EXPECT_RC(n->n9->devices(&ndev), 0); break;
    case 10:
      n->n10 = table(n, 10);
      EXPECT_RC(n->n10->init(logger, prof_cb), 0);
      EXPECT_RC(n->n10->devices(&ndev), 0);
      break;
    case 11:
      n->n11 = table(n, 11);
      EXPECT_RC(n->n11->init(&n->ctx, 7, &cfg, logger, prof_cb), 0);
      EXPECT_RC(n->n11->devices(&ndev), 0);
      break;
    case 12:
      n->n12 = table(n, 12);
      EXPECT_RC(n->n12->init(&n->ctx, 7, &cfg, logger, prof_cb), 0);
      EXPECT_RC(n->n12->devices(&ndev), 0);
      break;
    default: fprintf(stderr, "FAIL: no table v%d\n", ver); exit(1);
  }
  CHECK(ndev >= 1);
}

/* v11: finalize (NCCL 2.28 does, then dlclose). v6..v10 have no finalize: the library's
 * destructor stops the provider's threads at dlclose. */
static void net_unload(net_t* n) {
  if (n->n11) EXPECT_RC(n->n11->finalize(n->ctx), 0);
  if (n->n12) EXPECT_RC(n->n12->finalize(n->ctx), 0);
  CHECK(dlclose(n->dl) == 0);
}

/* A member every table has with the same signature. */
#define CALL(n, f, ...)                                                     \
  ((n)->n12 ? (n)->n12->f(__VA_ARGS__) : (n)->n11 ? (n)->n11->f(__VA_ARGS__) : (n)->n10 ? (n)->n10->f(__VA_ARGS__) \
   : (n)->n9 ? (n)->n9->f(__VA_ARGS__) : (n)->n8 ? (n)->n8->f(__VA_ARGS__)   \
   : (n)->n7 ? (n)->n7->f(__VA_ARGS__) : (n)->n6->f(__VA_ARGS__))

static int net_listen(net_t* n, void* handle, void** lc) {
  if (n->n12) return n->n12->listen(n->ctx, 0, handle, lc);
  if (n->n11) return n->n11->listen(n->ctx, 0, handle, lc);
  return n->n10 ? n->n10->listen(0, handle, lc) : n->n9 ? n->n9->listen(0, handle, lc)
       : n->n8 ? n->n8->listen(0, handle, lc) : n->n7 ? n->n7->listen(0, handle, lc)
               : n->n6->listen(0, handle, lc);
}

static int net_connect(net_t* n, void* handle, void** sc) {
  ibnet_comm_config_t cfg = {-1};
  ibnet_device_handle_t* dh = NULL;
  switch (n->ver) {
    case 12: return n->n12->connect(n->ctx, 0, handle, sc, &dh);
    case 11: return n->n11->connect(n->ctx, 0, handle, sc, &dh);
    case 10: return n->n10->connect(0, &cfg, handle, sc, &dh);
    case 9: return n->n9->connect(0, handle, sc, &dh);
    case 8: return n->n8->connect(0, handle, sc, &dh);
    case 7: return n->n7->connect(0, handle, sc, &dh);
    default: return n->n6->connect(0, handle, sc);
  }
}

static int net_accept(net_t* n, void* lc, void** rc) {
  ibnet_device_handle_t* dh = NULL;
  if (n->n12) return n->n12->accept(lc, rc, &dh);
  return n->n11 ? n->n11->accept(lc, rc, &dh) : n->n10 ? n->n10->accept(lc, rc, &dh)
       : n->n9 ? n->n9->accept(lc, rc, &dh) : n->n8 ? n->n8->accept(lc, rc, &dh)
       : n->n7 ? n->n7->accept(lc, rc, &dh) : n->n6->accept(lc, rc);
}

static int net_regmr(net_t* n, void* c, void* d, size_t sz, void** mh) {
  if (n->n6 || n->n7) {
    CHECK(sz <= 0x7fffffff);
    return n->n6 ? n->n6->regMr(c, d, (int)sz, IBNET_PTR_HOST, mh) : n->n7->regMr(c, d, (int)sz, IBNET_PTR_HOST, mh);
  }
  if (n->n12) return n->n12->regMr(c, d, sz, IBNET_PTR_HOST, mh);
  return n->n11 ? n->n11->regMr(c, d, sz, IBNET_PTR_HOST, mh) : n->n10 ? n->n10->regMr(c, d, sz, IBNET_PTR_HOST, mh)
       : n->n9 ? n->n9->regMr(c, d, sz, IBNET_PTR_HOST, mh) : n->n8->regMr(c, d, sz, IBNET_PTR_HOST, mh);
}

static int net_isend(net_t* n, void* c, void* d, size_t sz, int tag, void* mh, void** req) {
  switch (n->ver) {
    case 12: return n->n12->isend(c, d, sz, tag, mh, &g_parent, req);
    case 11: return n->n11->isend(c, d, sz, tag, mh, &g_parent, req);
    case 10: return n->n10->isend(c, d, sz, tag, mh, &g_parent, req);
    case 9: return n->n9->isend(c, d, sz, tag, mh, req);
    case 8: return n->n8->isend(c, d, (int)sz, tag, mh, req);
    case 7: return n->n7->isend(c, d, (int)sz, tag, mh, req);
    default: return n->n6->isend(c, d, (int)sz, tag, mh, req);
  }
}

static int net_irecv(net_t* n, void* c, int k, void** d, const size_t* sz, int* tags, void** mh, void** req) {
  if (n->ver >= 9) {
    size_t s[8];
    void* ph[8];
    memcpy(s, sz, (size_t)k * sizeof *s);
    for (int i = 0; i < 8; i++) ph[i] = &g_parent;
    if (n->ver == 12) return n->n12->irecv(c, k, d, s, tags, mh, ph, req);
    if (n->ver == 11) return n->n11->irecv(c, k, d, s, tags, mh, ph, req);
    if (n->ver == 10) return n->n10->irecv(c, k, d, s, tags, mh, ph, req);
    return n->n9->irecv(c, k, d, s, tags, mh, req);
  }
  int isz[8];
  for (int i = 0; i < k; i++) isz[i] = (int)sz[i];
  return n->ver == 8 ? n->n8->irecv(c, k, d, isz, tags, mh, req)
       : n->ver == 7 ? n->n7->irecv(c, k, d, isz, tags, mh, req)
                     : n->n6->irecv(c, k, d, isz, tags, mh, req);
}

/* ABI_TEST_FAULT=1 (two hosts): a failing isend, irecv or test() is the expected end (the peer
 * or the link was killed; which call sees it first is timing): close the comm, finalize and
 * dlclose like NCCL would, report, exit 3. */
static void* g_comm;
static int g_comm_is_send;
static void net_unload(net_t* n);
static void fault_exit(net_t* n, int rc) {
  printf("fault: a data call returned ncclResult_t %d; closing the %s comm\n", rc, g_comm_is_send ? "send" : "recv");
  fflush(stdout);
  int crc = g_comm_is_send ? CALL(n, closeSend, g_comm) : CALL(n, closeRecv, g_comm);
  net_unload(n); /* finalize (v11) and dlclose: must not hang or fail */
  printf("survivor: close returned %d, finalize and dlclose ok after the fault\n", crc);
  fflush(stdout);
  exit(3);
}

static int fault_mode(void) {
  static int fault = -1;
  if (fault < 0) fault = getenv("ABI_TEST_FAULT") != NULL;
  return fault;
}

/* A data call's result: 0 to go on; with ABI_TEST_FAULT an error is the expected end. */
#define EXPECT_POST(call)                              \
  do {                                                 \
    int post_rc_ = (call);                             \
    if (post_rc_ != 0 && fault_mode()) fault_exit(n, post_rc_); \
    EXPECT_RC(post_rc_, 0);                            \
  } while (0)

static void wait_done(net_t* n, void* req, int* sizes) {
  int done = 0;
  while (!done) {
    int rc = CALL(n, test, req, &done, sizes);
    if (rc != 0 && fault_mode()) fault_exit(n, rc);
    EXPECT_RC(rc, 0);
    if (!done) sched_yield(); /* leave CPU to the provider's copy threads on small hosts */
  }
}

static size_t env_size(const char* name, size_t dflt) {
  const char* s = getenv(name);
  if (!s || !*s) return dflt;
  char* end;
  size_t v = strtoull(s, &end, 0);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  return v;
}

/* The message sizes: 0, 1, 8, 4 KiB, 64 KiB, 1 MiB, 4 MiB, 16 MiB up to ABI_TEST_MAX_BYTES (itself
 * included). The 8-way multi-receive moves i * max/16 bytes with tag i (0..7 MiB at 16 MiB). */
static const size_t kSizes[] = {0, 1, 8, 4096, 65536, 1u << 20, 4u << 20, 16u << 20};
#define MAXSIZES (sizeof kSizes / sizeof kSizes[0] + 1)
#define ITERS 10
static size_t g_max, g_slot, g_sizes[MAXSIZES], g_nsizes;
static const char* g_mode = "two-process"; /* or "two-host" */
static int g_bw_iters;
static void sizes_init(void) {
  g_max = env_size("ABI_TEST_MAX_BYTES", 16u << 20);
  CHECK(g_max >= 16 && g_max <= (64u << 20));
  g_bw_iters = (int)env_size("ABI_TEST_BW_ITERS", 50);
  size_t min = env_size("ABI_TEST_MIN_BYTES", 0);
  g_slot = g_max < (16u << 20) ? g_max : (16u << 20); /* one multi-receive slot */
  g_nsizes = 0;
  for (size_t i = 0; i < sizeof kSizes / sizeof kSizes[0] && kSizes[i] <= g_max; i++)
    if (kSizes[i] >= min) g_sizes[g_nsizes++] = kSizes[i];
  if (g_nsizes == 0 || g_sizes[g_nsizes - 1] != g_max) g_sizes[g_nsizes++] = g_max;
}
/* Eight different sizes, none a multiple of another's unit: 0, slot/16 + 11, ... */
static size_t multi_len(int i) { return (size_t)i * (g_slot / 16) + (size_t)(i % 3) * 11; }
static size_t buf_len(void) { return 8 * g_slot > g_max ? 8 * g_slot : g_max; }

/* Receiver. The peer (a pipe pair or one socket) gets the handle on wfd and acks on rfd. */
static void run_recv(net_t* n, int wfd, int rfd) {
  char handle[IBNET_HANDLE_MAXSIZE] = {0};
  void *lc = NULL, *rc = NULL, *mh = NULL;
  const int ver = n->ver;
  EXPECT_RC(net_listen(n, handle, &lc), 0);
  CHECK(lc != NULL);
  CHECK(write(wfd, handle, sizeof handle) == (ssize_t)sizeof handle);
  while (rc == NULL) EXPECT_RC(net_accept(n, lc, &rc), 0);
  unsigned char* buf = aligned_alloc(4096, buf_len());
  CHECK(buf);
  EXPECT_RC(net_regmr(n, rc, buf, buf_len(), &mh), 0);
  g_comm = rc, g_comm_is_send = 0;
  for (size_t s = 0; s < g_nsizes; s++) {
    double t0 = 0;
    for (int it = 0; it < ITERS + g_bw_iters; it++) {
      /* ITERS verified transfers, then g_bw_iters timed ones (no fill, clear or verify). */
      if (it == ITERS) t0 = now_s();
      void* data = buf;
      size_t sz = g_sizes[s];
      int tag = 7, got = -1;
      /* v9+: NCCL's optional-completion hint reaches the plugin; always overwritten. v6..v8:
       * NCCL's adapter passes NULL. */
      void* req = ver >= 9 ? (void*)0x1 : NULL;
      if (it < ITERS) memset(buf, 0, sz);
      do EXPECT_POST(net_irecv(n, rc, 1, &data, &sz, &tag, &mh, &req)); while (req == NULL);
      CHECK(req != (void*)0x1);
      wait_done(n, req, &got);
      CHECK(got == (int)g_sizes[s]);
      if (it < ITERS) CHECK(verify(buf, g_sizes[s], (unsigned)(s * 100 + it)));
    }
    double dt = now_s() - t0;
    printf("v%d %s %9zu B: %d verified; %d timed: %8.3f GB/s, %7.1f us/msg\n", ver, g_mode,
           g_sizes[s], ITERS, g_bw_iters, g_sizes[s] * (double)g_bw_iters / dt / 1e9,
           dt / (g_bw_iters ? g_bw_iters : 1) * 1e6);
    fflush(stdout);
  }
  /* 8-way multi-receive: tags 0..7, different sizes. */
  {
    void* data[8];
    size_t sz[8];
    int tags[8], got[8];
    void* mhs[8];
    for (int i = 0; i < 8; i++) {
      data[i] = buf + (size_t)i * g_slot;
      sz[i] = g_slot;
      tags[i] = i;
      mhs[i] = mh;
      memset(data[i], 0xee, multi_len(i));
    }
    void* req = NULL;
    double t0 = now_s();
    do EXPECT_POST(net_irecv(n, rc, 8, data, sz, tags, mhs, &req)); while (req == NULL);
    wait_done(n, req, got);
    double dt = now_s() - t0;
    size_t total = 0;
    for (int i = 0; i < 8; i++) {
      size_t len = multi_len(i);
      total += len;
      /* Each receive reports the bytes its send carried (the sizes FIFO, as NCCL 2.19+), not
       * the 0/1 of older net_ib nor the posted size. */
      if (got[i] != (int)len) fprintf(stderr, "FAIL: receive %d reported %d B, sent %zu B\n", i, got[i], len);
      CHECK(got[i] == (int)len);
      CHECK(verify(data[i], len, 900 + i));
    }
    printf("v%d %s multi-recv 8-way (0..%zu B, %zu B): verified, %.3f GB/s\n", ver, g_mode,
           multi_len(7), total, total / dt / 1e9);
    printf("v%d %s multi-recv 8-way sizes reported as sent:", ver, g_mode);
    for (int i = 0; i < 8; i++) printf(" %d", got[i]);
    printf("\n");
  }
  /* A receive smaller than the peer's send: the send is truncated to it, as NCCL 2.30 does:
   * 16 B arrive, reported as 16, and nothing lands past them (guard bytes). */
  {
    void* data = buf;
    size_t sz = 16;
    int tag = 7, got16 = -1;
    void* req = NULL;
    memset(buf + 16, 0xee, 4096);
    do EXPECT_POST(net_irecv(n, rc, 1, &data, &sz, &tag, &mh, &req)); while (req == NULL);
    wait_done(n, req, &got16);
    CHECK(got16 == 16);
    CHECK(verify(buf, 16, 777));
    for (int i = 16; i < 16 + 4096; i++) CHECK(buf[i] == 0xee);
    char ack;
    CHECK(read(rfd, &ack, 1) == 1); /* the sender saw its truncation */
  }
  EXPECT_RC(CALL(n, deregMr, rc, mh), 0);
  EXPECT_RC(CALL(n, closeRecv, rc), 0);
  EXPECT_RC(CALL(n, closeListen, lc), 0);
  free(buf);
}

/* Sender. */
static void run_send(net_t* n, int rfd, int wfd) {
  char handle[IBNET_HANDLE_MAXSIZE];
  void *sc = NULL, *mh = NULL;
  size_t got_h = 0;
  while (got_h < sizeof handle) {
    ssize_t r = read(rfd, handle + got_h, sizeof handle - got_h);
    CHECK(r > 0);
    got_h += (size_t)r;
  }
  while (sc == NULL) EXPECT_RC(net_connect(n, handle, &sc), 0);
  unsigned char* buf = aligned_alloc(4096, buf_len());
  CHECK(buf);
  EXPECT_RC(net_regmr(n, sc, buf, buf_len(), &mh), 0);
  g_comm = sc, g_comm_is_send = 1;
  for (size_t s = 0; s < g_nsizes; s++)
    for (int it = 0; it < ITERS + g_bw_iters; it++) {
      void* req = NULL;
      int got = -1;
      if (it < ITERS) fill(buf, g_sizes[s], (unsigned)(s * 100 + it));
      do EXPECT_POST(net_isend(n, sc, buf, g_sizes[s], 7, mh, &req)); while (req == NULL);
      wait_done(n, req, &got);
      CHECK(got == (int)g_sizes[s]);
    }
  {
    void* reqs[8];
    for (int i = 0; i < 8; i++) {
      unsigned char* p = buf + (size_t)i * g_slot;
      fill(p, multi_len(i), 900 + i);
      reqs[i] = NULL;
      do EXPECT_POST(net_isend(n, sc, p, multi_len(i), i, mh, &reqs[i])); while (reqs[i] == NULL);
    }
    for (int i = 0; i < 8; i++) wait_done(n, reqs[i], NULL);
  }
  {
    void* req = NULL;
    int warns = g_warns, got = -1;
    fill(buf, 4096, 777);
    do EXPECT_POST(net_isend(n, sc, buf, 4096, 7, mh, &req)); while (req == NULL);
    wait_done(n, req, &got);
    CHECK(got == 16);
    CHECK(g_warns == warns + 1);
    printf("v%d: send of 4096 B into a posted 16 B receive: truncated to %d B, one WARN\n", n->ver, got);
    fflush(stdout);
    CHECK(write(wfd, "x", 1) == 1);
  }
  EXPECT_RC(CALL(n, deregMr, sc, mh), 0);
  EXPECT_RC(CALL(n, closeSend, sc), 0);
  free(buf);
}

/* Threads of this process (entries of /proc/self/task). */
static int nthreads(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  CHECK(d);
  struct dirent* e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* After everything is closed and the library unloaded, the thread count is back to `base`
 * (joined threads may linger in /proc for a moment: up to 2 s). v6-v10 have no finalize: the
 * plugin stops its threads when the last comm closes. */
static void check_threads(int base, int ver, const char* who) {
  int n = nthreads();
  for (int i = 0; i < 200 && n != base; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    n = nthreads();
  }
  if (n != base) {
    fprintf(stderr, "FAIL v%d %s: %d thread(s) after dlclose, %d before load\n", ver, who, n, base);
    exit(1);
  }
  printf("v%d %s: threads back to %d after close + dlclose\n", ver, who, base);
}

/* Two processes, each loading the plugin itself (fork before any load: the plugin's state is
 * per process), through table `ver`. */
/* v10/v11: every QP event the plugin started through prof_cb since `starts0` was stopped
 * (the comm is closed by now), and there were some. */
static void check_prof(int ver, const char* who, long starts0, long stops0) {
  if (ver < 10) return;
  long a = g_prof_starts - starts0, b = g_prof_stops - stops0;
  printf("v%d %s: profiler: %ld QP events started, %ld stopped\n", ver, who, a, b);
  fflush(stdout);
  CHECK(a > 0 && a == b);
}

static void pair_test(const char* path, int ver) {
  int p2c[2], c2p[2];
  long starts0 = g_prof_starts, stops0 = g_prof_stops;
  CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0);
  net_t n;
  if (pid == 0) {
    alarm(300);
    int base = nthreads();
    net_load(&n, path, ver);
    run_send(&n, p2c[0], c2p[1]);
    net_unload(&n);
    check_prof(ver, "sender", starts0, stops0);
    check_threads(base, ver, "sender");
    fflush(stdout);
    _exit(0);
  }
  int base = nthreads();
  net_load(&n, path, ver);
  run_recv(&n, p2c[1], c2p[0]);
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  net_unload(&n);
  check_prof(ver, "receiver", starts0, stops0);
  check_threads(base, ver, "receiver");
}

/* The tables to move data through: ABI_TEST_TABLES, e.g. "6,7,8,9,10,11,12" (default "12,11,8"). */
static int tables(int* out) {
  const char* s = getenv("ABI_TEST_TABLES");
  if (!s || !*s) s = "12,11,8";
  int k = 0;
  for (char* end; *s && k < 16; s = *end ? end + 1 : end) {
    long v = strtol(s, &end, 10);
    if (end == s || v < 6 || v > 12) {
      fprintf(stderr, "FAIL: ABI_TEST_TABLES: not a table version 6..12 at \"%s\"\n", s);
      exit(2);
    }
    out[k++] = (int)v;
  }
  return k;
}

/* Two hosts: the server (receiver) accepts one TCP client on `port`; the client (sender)
 * connects to host:port, retrying for up to 60 s. Then the same test, table after table, with
 * the handle and the ack on that connection. */
static int tcp_server(int port) {
  int l = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0;
  CHECK(l >= 0);
  CHECK(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  CHECK(setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0);
  struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
  CHECK(bind(l, (struct sockaddr*)&a, sizeof a) == 0 && listen(l, 1) == 0);
  printf("server: listening on port %d\n", port);
  fflush(stdout);
  int s = accept(l, NULL, NULL);
  CHECK(s >= 0);
  close(l);
  return s;
}

static int tcp_client(const char* hostport) {
  char host[256];
  snprintf(host, sizeof host, "%s", hostport);
  char* colon = strrchr(host, ':');
  CHECK(colon);
  *colon = 0;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  CHECK(getaddrinfo(host, colon + 1, &hints, &ai) == 0);
  double end = now_s() + 60;
  for (;;) {
    int s = socket(ai->ai_family, SOCK_STREAM, 0);
    CHECK(s >= 0);
    if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0) {
      freeaddrinfo(ai);
      return s;
    }
    close(s);
    CHECK(now_s() < end);
    usleep(200000);
  }
}

static void host_test(const char* path, int server, const char* where) {
  int vers[16], k = tables(vers);
  g_mode = "two-host";
  int s = server ? tcp_server(atoi(where)) : tcp_client(where);
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  for (int i = 0; i < k; i++) {
    net_t n;
    double t0 = now_s();
    net_load(&n, path, vers[i]);
    if (server) run_recv(&n, s, s);
    else run_send(&n, s, s);
    net_unload(&n);
    printf("v%d two-host %s: verified, finalize%s + dlclose ok (%.1f s)\n", vers[i],
           server ? "receiver" : "sender", vers[i] == 11 ? "" : " (none in this table)", now_s() - t0);
    fflush(stdout);
  }
  close(s);
}

/* v12's properties of device d: v11's fields (p11) at v12's offsets, railId/planeId as
 * ABI_TEST_RAIL / ABI_TEST_PLANE say (default -1, unset). */
static void check_v12(const ibnet_net_v12_t* n12, int d, const ibnet_properties_v11_t* p11) {
  ibnet_properties_v12_t p;
  memset(&p, 0x5a, sizeof p);
  EXPECT_RC(n12->getProperties(d, &p), 0);
  CHECK(p.name == p11->name && p.speed == p11->speed && p.port == p11->port);
  CHECK(p.maxRecvs == 8 && p.maxComms == p11->maxComms && p.maxMultiRequestSize == 1);
  CHECK(p.vProps.ndevs == 1 && p.vProps.devs[0] == d);
  CHECK(p.maxP2pBytes == p11->maxP2pBytes && p.maxCollBytes == p11->maxCollBytes);
  const char* r = getenv("ABI_TEST_RAIL");
  const char* pl = getenv("ABI_TEST_PLANE");
  int rail = r && *r ? atoi(r) : IBNET_NET_ID_UNDEF, plane = pl && *pl ? atoi(pl) : IBNET_NET_ID_UNDEF;
  if (d == 0) CHECK(p.railId == rail && p.planeId == plane);
  printf("v12 dev %d: railId %d planeId %d maxP2pBytes %zu\n", d, p.railId, p.planeId, p.maxP2pBytes);
}

/* makeVDevice through v11 takes at most 4 devices (its struct's size), through v12 at most 8. */
static void vdevice_limits(const ibnet_net_v11_t* n11, const ibnet_net_v12_t* n12) {
  ibnet_vdevice_props_t v11 = {5, {0, 0, 0, 0}};
  ibnet_vdevice_props_v12_t v12 = {9, {0, 0, 0, 0, 0, 0, 0, 0}};
  int d = -7;
  EXPECT_RC(n11->makeVDevice(&d, &v11), 4);
  EXPECT_RC(n12->makeVDevice(&d, &v12), 4);
  v12.ndevs = 1;
  EXPECT_RC(n12->makeVDevice(&d, &v12), 0); /* one device: itself */
  CHECK(d == 0);
}

static int cycle(const char* path, int expect, int round) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
    exit(1);
  }
  const ibnet_net_v11_t* n = dlsym(h, "ncclNetPlugin_v11");
  const ibnet_net_v8_t* n8 = dlsym(h, "ncclNetPlugin_v8");
  const ibnet_net_v12_t* n12 = dlsym(h, "ncclNetPlugin_v12");
  CHECK(n && n8 && n12);
  CHECK(strcmp(n->name, "IBNet") == 0 && strcmp(n8->name, "IBNet") == 0 && strcmp(n12->name, "IBNet") == 0);
  void* ctx = NULL;
  ibnet_comm_config_t cfg = {-1};
  EXPECT_RC(n->init(&ctx, 42, &cfg, logger, NULL), 0);
  CHECK(ctx != NULL);
  int ndev = -1;
  EXPECT_RC(n->devices(&ndev), 0);
  CHECK(ndev >= 0);
  /* Expected devices (IBNET_PROVIDER=soft: 1) unless the soft provider's probe refused. */
  if (expect >= 0 && !(ndev == 0 && g_cma_refused)) CHECK(ndev == expect);
  for (int d = 0; d < ndev; d++) {
    ibnet_properties_v11_t p;
    EXPECT_RC(n->getProperties(d, &p), 0);
    CHECK(p.name && p.regIsGlobal == 1 && p.maxRecvs == 8 && (p.ptrSupport & IBNET_PTR_HOST));
    CHECK(p.maxMultiRequestSize == 1 && p.vProps.ndevs == 1 && p.vProps.devs[0] == d);
    printf("round %d dev %d: %s speed %d Mbps port %d guid %#llx ptr %#x\n", round, d, p.name,
           p.speed, p.port, (unsigned long long)p.guid, p.ptrSupport);
    ibnet_properties_v8_t p8;
    EXPECT_RC(n8->getProperties(d, &p8), 0);
    CHECK(p8.regIsGlobal == 1 && p8.speed == p.speed && p8.maxRecvs == 8);
    check_v12(n12, d, &p);
  }
  if (ndev > 0) vdevice_limits(n, n12);
  bad_input(n, ndev);
  EXPECT_RC(n->finalize(ctx), 0);
  EXPECT_RC(n->finalize(ctx), 0); /* stale: ignored */
  EXPECT_RC(n->finalize(NULL), 0);
  CHECK(dlclose(h) == 0);
  return ndev;
}

/* The proxy API's logger: ibnet_proxy_set_logger routes the library's WARN lines (here: a refused
 * ibnet_proxy_export_map) to the given function, at NCCL's WARN level with all subsystem flags. */
static int g_proxy_warns;
static void proxy_logger(int level, unsigned long flags, const char* file, int line,
                         const char* fmt, ...) {
  (void)file; (void)line;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == IBNET_LOG_WARN && flags == IBNET_LOG_FLAG_ALL &&
      strstr(msg, "NET/IBNET") && strstr(msg, "ibnet_proxy_export_map"))
    g_proxy_warns++;
}

static void proxy_logger_test(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL);
  __typeof__(ibnet_proxy_set_logger)* set_logger = dlsym(h, "ibnet_proxy_set_logger");
  __typeof__(ibnet_proxy_export_map)* export_map = dlsym(h, "ibnet_proxy_export_map");
  __typeof__(ibnet_proxy_process_id)* process_id = dlsym(h, "ibnet_proxy_process_id");
  CHECK(set_logger && export_map && process_id);
  EXPECT_RC(set_logger(proxy_logger), 0);
  char buf[IBNET_PROXY_MAP_BYTES];
  CHECK(export_map(NULL, 0, buf, sizeof buf) != 0); /* no proxy: refused, one WARN */
  CHECK(g_proxy_warns == 1);
  CHECK(set_logger(NULL) != 0);                      /* NULL is refused (and logged) */
  uint64_t id = 0;
  EXPECT_RC(process_id(&id), 0);
  CHECK(id != 0);
  EXPECT_RC(set_logger(logger), 0);
  printf("proxy logger: OK (%d WARN line(s) through ibnet_proxy_set_logger)\n", g_proxy_warns);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s plugin.so [expected-devices|any] [--server PORT | --client HOST:PORT]\n", argv[0]);
    return 2;
  }
  alarm((unsigned)env_size("ABI_TEST_ALARM_S", 600)); /* a hang is a failure */
  sizes_init();
  int expect = argc > 2 && strcmp(argv[2], "any") != 0 ? atoi(argv[2]) : -1;
  int server = argc > 4 && strcmp(argv[3], "--server") == 0;
  int client = argc > 4 && strcmp(argv[3], "--client") == 0;
  if (argc > 3 && !server && !client) {
    fprintf(stderr, "usage: %s plugin.so [expected-devices|any] [--server PORT | --client HOST:PORT]\n", argv[0]);
    return 2;
  }
  int a = cycle(argv[1], expect, 0);
  if (a == 0 && g_cma_refused) {
    printf("\n!!!!!!!! IBNET_PROVIDER=soft: cross-memory attach is NOT PERMITTED on this host: "
           "0 devices, two-process data test NOT RUN (see the plugin WARN above) !!!!!!!!\n\n");
  }
  if (a > 0 && (server || client)) {
    host_test(argv[1], server, argv[4]);
  } else if (a > 0) {
    int vers[16], k = tables(vers);
    for (int i = 0; i < k; i++) pair_test(argv[1], vers[i]);
  } else {
    printf("0 devices: two-process data test not run\n");
    if (server || client) return 1;
  }
  int b = cycle(argv[1], expect, 1);
  CHECK(a == b);
  proxy_logger_test(argv[1]);
  printf("abi_test: OK (%d device(s), %d plugin WARN line(s) for the bad-input checks)\n", a, g_warns);
  return 0;
}
