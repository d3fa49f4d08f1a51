/*
 * ABI test for libnccl-net-ibnet.so, loading it exactly as NCCL does (dlopen RTLD_NOW|RTLD_LOCAL).
 *
 *   abi_test <plugin.so> [expect-devices=N|any]
 *
 * 1. Resolves ncclNetPlugin_v11 and, separately, ncclNetPlugin_v8; checks the name "IBNet".
 * 2. v11: init, devices, getProperties of every device; bad input (NULL pointers, dev out of
 *    range, n > 8, a foreign handle, a corrupt progress token) returns the right ncclResult_t and
 *    always writes *request; finalize (twice, and NULL).
 * 3. dlclose.
 * 4. With at least one device: a two-process data test, once through the v11 table and once
 *    through the v8 table (fork before loading; each process dlopens, inits, and at the end
 *    finalizes (v11) and dlcloses; the parent receives, the child sends): single receives of
 *    0 B .. 16 MiB and an 8-way multi-receive, data verified byte for byte, then a send larger
 *    than its posted receive (the sender gets an error ncclResult_t and a WARN). Prints sizes and
 *    GB/s. Run it with IBNET_PROVIDER=soft on a host without RDMA NICs.
 *    After close and dlclose, each process has as many threads as before loading (v8 too:
 *    the plugin stops its threads when the last comm closes).
 * 5. A second load-use-unload cycle in this process.
 * Any hang is turned into a failure by alarm().
 * Exit status 0 on success. Writes its report to stdout (the plugin itself never does).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../../include/ibnet.h"

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
  EXPECT_RC(n->deregMr(NULL, NULL), 3);
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

/* One loaded plugin, through either table: the pair test runs the same code over v11 and v8. */
typedef struct {
  void* dl;
  const ibnet_net_v11_t* n11;
  const ibnet_net_v8_t* n8;
  void* ctx;
} net_t;

static void net_load(net_t* n, const char* path, int ver) {
  memset(n, 0, sizeof *n);
  n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!n->dl) {
    fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
    exit(1);
  }
  if (ver == 11) {
    n->n11 = dlsym(n->dl, "ncclNetPlugin_v11");
    CHECK(n->n11);
    ibnet_comm_config_t cfg = {-1};
    EXPECT_RC(n->n11->init(&n->ctx, 7, &cfg, logger, NULL), 0);
  } else {
    n->n8 = dlsym(n->dl, "ncclNetPlugin_v8");
    CHECK(n->n8);
    EXPECT_RC(n->n8->init(logger), 0);
  }
  int ndev = 0;
  EXPECT_RC(n->n11 ? n->n11->devices(&ndev) : n->n8->devices(&ndev), 0);
  CHECK(ndev >= 1);
}

/* v11: finalize (NCCL 2.28 does, then dlclose). v8 has no finalize: the library's destructor
 * stops the provider's threads at dlclose. */
static void net_unload(net_t* n) {
  if (n->n11) EXPECT_RC(n->n11->finalize(n->ctx), 0);
  CHECK(dlclose(n->dl) == 0);
}

#define CALL(n, f, ...) ((n)->n11 ? (n)->n11->f(__VA_ARGS__) : (n)->n8->f(__VA_ARGS__))

static int net_isend(net_t* n, void* c, void* d, size_t sz, int tag, void* mh, void** req) {
  return n->n11 ? n->n11->isend(c, d, sz, tag, mh, NULL, req) : n->n8->isend(c, d, (int)sz, tag, mh, req);
}

static int net_irecv(net_t* n, void* c, int k, void** d, const size_t* sz, int* tags, void** mh, void** req) {
  if (n->n11) return n->n11->irecv(c, k, d, (size_t*)sz, tags, mh, NULL, req);
  int isz[8];
  for (int i = 0; i < k; i++) isz[i] = (int)sz[i];
  return n->n8->irecv(c, k, d, isz, tags, mh, req);
}

static void wait_done(net_t* n, void* req, int* sizes) {
  int done = 0;
  while (!done) {
    EXPECT_RC(CALL(n, test, req, &done, sizes), 0);
    if (!done) sched_yield(); /* leave CPU to the provider's copy threads on small hosts */
  }
}

#define MAXSZ (16u << 20)
static const size_t kSizes[] = {0, 1, 8, 4096, 65536, 1u << 20, 4u << 20, MAXSZ};
#define NSIZES (sizeof kSizes / sizeof kSizes[0])
#define ITERS 10
#define BW_ITERS 50

/* Receiver. */
static void run_recv(net_t* n, int ver, int wfd, int rfd) {
  char handle[IBNET_HANDLE_MAXSIZE] = {0};
  void *lc = NULL, *rc = NULL, *mh = NULL;
  EXPECT_RC(n->n11 ? n->n11->listen(n->ctx, 0, handle, &lc) : n->n8->listen(0, handle, &lc), 0);
  CHECK(lc != NULL);
  CHECK(write(wfd, handle, sizeof handle) == (ssize_t)sizeof handle);
  while (rc == NULL) EXPECT_RC(CALL(n, accept, lc, &rc, NULL), 0);
  unsigned char* buf = aligned_alloc(4096, 8 * (size_t)MAXSZ);
  CHECK(buf);
  EXPECT_RC(CALL(n, regMr, rc, buf, 8 * (size_t)MAXSZ, IBNET_PTR_HOST, &mh), 0);
  for (size_t s = 0; s < NSIZES; s++) {
    double t0 = 0;
    for (int it = 0; it < ITERS + BW_ITERS; it++) {
      /* ITERS verified transfers, then BW_ITERS timed ones (no fill, clear or verify). */
      if (it == ITERS) t0 = now_s();
      void* data = buf;
      size_t sz = kSizes[s];
      int tag = 7, got = -1;
      void* req = (void*)0x1; /* v11: NCCL's optional-completion hint; always overwritten */
      if (it < ITERS) memset(buf, 0, sz);
      do EXPECT_RC(net_irecv(n, rc, 1, &data, &sz, &tag, &mh, &req), 0); while (req == NULL);
      CHECK(req != (void*)0x1);
      wait_done(n, req, &got);
      CHECK(got == (int)kSizes[s]);
      if (it < ITERS) CHECK(verify(buf, kSizes[s], (unsigned)(s * 100 + it)));
    }
    double dt = now_s() - t0;
    printf("v%d two-process %9zu B: %d verified; %d timed: %8.3f GB/s, %7.1f us/msg\n", ver,
           kSizes[s], ITERS, BW_ITERS, kSizes[s] * (double)BW_ITERS / dt / 1e9, dt / BW_ITERS * 1e6);
  }
  /* 8-way multi-receive: tags 0..7, different sizes (0 B .. 7 MiB). */
  {
    void* data[8];
    size_t sz[8];
    int tags[8], got[8];
    void* mhs[8];
    for (int i = 0; i < 8; i++) {
      data[i] = buf + (size_t)i * MAXSZ;
      sz[i] = (size_t)MAXSZ;
      tags[i] = i;
      mhs[i] = mh;
      memset(data[i], 0xee, (size_t)i << 20);
    }
    void* req = NULL;
    double t0 = now_s();
    do EXPECT_RC(net_irecv(n, rc, 8, data, sz, tags, mhs, &req), 0); while (req == NULL);
    wait_done(n, req, got);
    double dt = now_s() - t0;
    size_t total = 0;
    for (int i = 0; i < 8; i++) {
      size_t len = (size_t)i << 20;
      total += len;
      /* The seed's multi-receive reports one bit per receive (data or not), not the size. */
      CHECK(got[i] == (int)len || got[i] == (len > 0 ? 1 : 0));
      CHECK(verify(data[i], len, 900 + i));
    }
    printf("v%d two-process multi-recv 8-way (0..7 MiB, %zu B): verified, %.3f GB/s\n", ver, total,
           total / dt / 1e9);
  }
  /* A receive smaller than the peer's send: the sender must fail; we just post it. */
  {
    void* data = buf;
    size_t sz = 16;
    int tag = 7;
    void* req = NULL;
    do EXPECT_RC(net_irecv(n, rc, 1, &data, &sz, &tag, &mh, &req), 0); while (req == NULL);
    char ack;
    CHECK(read(rfd, &ack, 1) == 1); /* the sender saw its error */
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
  CHECK(read(rfd, handle, sizeof handle) == (ssize_t)sizeof handle);
  while (sc == NULL)
    EXPECT_RC(n->n11 ? n->n11->connect(n->ctx, 0, handle, &sc, NULL) : n->n8->connect(0, handle, &sc, NULL), 0);
  unsigned char* buf = aligned_alloc(4096, 8 * (size_t)MAXSZ);
  CHECK(buf);
  EXPECT_RC(CALL(n, regMr, sc, buf, 8 * (size_t)MAXSZ, IBNET_PTR_HOST, &mh), 0);
  for (size_t s = 0; s < NSIZES; s++)
    for (int it = 0; it < ITERS + BW_ITERS; it++) {
      void* req = NULL;
      int got = -1;
      if (it < ITERS) fill(buf, kSizes[s], (unsigned)(s * 100 + it));
      do EXPECT_RC(net_isend(n, sc, buf, kSizes[s], 7, mh, &req), 0); while (req == NULL);
      wait_done(n, req, &got);
      CHECK(got == (int)kSizes[s]);
    }
  {
    void* reqs[8];
    for (int i = 0; i < 8; i++) {
      unsigned char* p = buf + (size_t)i * MAXSZ;
      fill(p, (size_t)i << 20, 900 + i);
      reqs[i] = NULL;
      do EXPECT_RC(net_isend(n, sc, p, (size_t)i << 20, i, mh, &reqs[i]), 0); while (reqs[i] == NULL);
    }
    for (int i = 0; i < 8; i++) wait_done(n, reqs[i], NULL);
  }
  {
    void* req = NULL;
    int rc = 0, done = 0, warns = g_warns;
    while (rc == 0 && req == NULL) rc = net_isend(n, sc, buf, 4096, 7, mh, &req);
    while (rc == 0 && !done) rc = CALL(n, test, req, &done, NULL);
    CHECK(rc == 4 || rc == 5 || rc == 6);
    CHECK(g_warns > warns);
    printf("send of 4096 B into a posted 16 B receive: ncclResult_t %d and a WARN\n", rc);
    fflush(stdout);
    CHECK(write(wfd, "x", 1) == 1);
  }
  EXPECT_RC(CALL(n, deregMr, sc, mh), 0);
  CALL(n, closeSend, sc); /* the comm failed above: its close may report that */
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
static void pair_test(const char* path, int ver) {
  int p2c[2], c2p[2];
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
    check_threads(base, ver, "sender");
    fflush(stdout);
    _exit(0);
  }
  int base = nthreads();
  net_load(&n, path, ver);
  run_recv(&n, ver, p2c[1], c2p[0]);
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  net_unload(&n);
  check_threads(base, ver, "receiver");
}

static int cycle(const char* path, int expect, int round) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
    exit(1);
  }
  const ibnet_net_v11_t* n = dlsym(h, "ncclNetPlugin_v11");
  const ibnet_net_v8_t* n8 = dlsym(h, "ncclNetPlugin_v8");
  CHECK(n && n8);
  CHECK(strcmp(n->name, "IBNet") == 0 && strcmp(n8->name, "IBNet") == 0);
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
  }
  bad_input(n, ndev);
  EXPECT_RC(n->finalize(ctx), 0);
  EXPECT_RC(n->finalize(ctx), 0); /* stale: ignored */
  EXPECT_RC(n->finalize(NULL), 0);
  CHECK(dlclose(h) == 0);
  return ndev;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s plugin.so [expected-devices]\n", argv[0]);
    return 2;
  }
  alarm(600); /* a hang is a failure */
  int expect = argc > 2 ? atoi(argv[2]) : -1;
  int a = cycle(argv[1], expect, 0);
  if (a == 0 && g_cma_refused) {
    printf("\n!!!!!!!! IBNET_PROVIDER=soft: cross-memory attach is NOT PERMITTED on this host: "
           "0 devices, two-process data test NOT RUN (see the plugin WARN above) !!!!!!!!\n\n");
  }
  if (a > 0) {
    pair_test(argv[1], 11);
    pair_test(argv[1], 8);
  } else {
    printf("0 devices: two-process data test not run\n");
  }
  int b = cycle(argv[1], expect, 1);
  CHECK(a == b);
  printf("abi_test: OK (%d device(s), %d plugin WARN line(s) for the bad-input checks)\n", a, g_warns);
  return 0;
}
