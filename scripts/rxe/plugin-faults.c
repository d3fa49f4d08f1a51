/*
 * plugin-faults: the plugin's lifecycle and failure paths over a real verbs device (rxe in the VM).
 *
 *   plugin-faults <plugin.so> devices N  init reports exactly N devices (names printed)
 *   plugin-faults <plugin.so> data       two processes, v11: sizes 0 B..8 MiB (rxe's max message)
 *                                          twice, then an 8-way multi-receive, byte for byte
 *   plugin-faults <plugin.so> lifecycle    load, init, devices, finalize, dlclose, three times:
 *                                          after each unload the process has no thread left
 *                                          (the async-event thread was joined at finalize)
 *   plugin-faults <plugin.so> peer-death   the receiver process is SIGKILLed after posting a
 *                                          receive; the sender's next send must complete with an
 *                                          error (never hang), reported in one WARN that names
 *                                          the peer's GID and the local GID
 *   plugin-faults <plugin.so> flush        a received buffer is flushed with iflush (an RDMA
 *                                          READ when the plugin flushes) and the result reported
 *
 * Each process dlopens the plugin itself, after fork: a verbs context must never cross a fork.
 * Every wait is bounded (FAULTS_DEADLINE_S, default 60 s). Exit status 0 on success.
 * FAULTS_AFTER_INIT, when set, is a shell command each process runs right after init.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ibnet.h"

#define CHECK(c)                                                                        \
  do {                                                                                  \
    if (!(c)) {                                                                         \
      fprintf(stderr, "FAIL [%d] %s:%d: %s\n", (int)getpid(), __FILE__, __LINE__, #c); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)
#define OK(call)                                                                        \
  do {                                                                                  \
    int rc_ = (call);                                                                   \
    if (rc_ != 0) {                                                                     \
      fprintf(stderr, "FAIL [%d] %s:%d: %s returned %d\n", (int)getpid(), __FILE__,     \
              __LINE__, #call, rc_);                                                    \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define LEN (1u << 20)
#define DATA_MAX (8u << 20) /* rxe's max_msg_sz */
static char g_warn[4096]; /* the last WARN line the plugin logged */

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt,
                   ...) {
  (void)flags, (void)file, (void)line;
  char msg[sizeof g_warn];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == 2) memcpy(g_warn, msg, sizeof msg);
  if (level == 2 || getenv("FAULTS_VERBOSE"))
    fprintf(stderr, "[%d plugin %s] %s\n", (int)getpid(), level == 2 ? "WARN" : "INFO", msg);
}

static double deadline(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  const char* s = getenv("FAULTS_DEADLINE_S");
  return t.tv_sec + t.tv_nsec * 1e-9 + (s ? atof(s) : 60.0);
}
static int expired(double d) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9 > d;
}

/* The process's thread count; with `show`, prints each thread's name. */
static int threads_named(int show) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  CHECK(d);
  for (struct dirent* e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    n++;
    char path[300], name[64] = "?";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE* f = fopen(path, "r");
    if (f && fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0;
    if (f) fclose(f);
    if (show) printf("  thread %s: %s\n", e->d_name, name);
  }
  closedir(d);
  return n;
}
static int threads(void) { return threads_named(0); }

static void* g_so;
static const ibnet_net_v11_t* load_any(const char* path, void** ctx, int* ndev) {
  g_so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!g_so) fprintf(stderr, "dlopen: %s\n", dlerror());
  CHECK(g_so);
  const ibnet_net_v11_t* n = dlsym(g_so, "ncclNetPlugin_v11");
  CHECK(n);
  ibnet_comm_config_t cfg = {-1};
  OK(n->init(ctx, 1, &cfg, logger, NULL));
  OK(n->devices(ndev));
  /* FAULTS_AFTER_INIT: a shell command run between init and the first listen/connect (e.g. an
   * address added, so the GID table changes after init). */
  const char* hook = getenv("FAULTS_AFTER_INIT");
  if (hook) CHECK(system(hook) == 0);
  return n;
}
static const ibnet_net_v11_t* load(const char* path, void** ctx) {
  int ndev = 0;
  const ibnet_net_v11_t* n = load_any(path, ctx, &ndev);
  CHECK(ndev >= 1);
  return n;
}
static void unload(const ibnet_net_v11_t* n, void* ctx) {
  OK(n->finalize(ctx));
  CHECK(dlclose(g_so) == 0);
}

/* Bounded completion wait: returns test()'s first non-zero result, or 0 once done. */
static int wait_req(const ibnet_net_v11_t* n, void* req, double d) {
  int done = 0, rc = 0;
  while (rc == 0 && !done) {
    rc = n->test(req, &done, NULL);
    CHECK(!expired(d));
  }
  return rc;
}

static void devices(const char* path, int want) {
  void* ctx = NULL;
  int ndev = -1;
  const ibnet_net_v11_t* n = load_any(path, &ctx, &ndev);
  for (int d = 0; d < ndev; d++) {
    ibnet_properties_v11_t p;
    OK(n->getProperties(d, &p));
    printf("dev %d: %s port %d speed %d Mbps\n", d, p.name, p.port, p.speed);
  }
  unload(n, ctx);
  printf("devices: %d (want %d)\n", ndev, want);
  CHECK(ndev == want);
}

static void lifecycle(const char* path) {
  int base = threads();
  for (int round = 0; round < 3; round++) {
    void* ctx = NULL;
    const ibnet_net_v11_t* n = load(path, &ctx);
    int loaded = threads();
    unload(n, ctx);
    /* A joined thread may linger in /proc for a moment until the kernel reaps it (well under a
     * millisecond): allow 200 ms, far too short for a thread that was only told to stop. */
    int waited = 0;
    for (; waited < 20 && threads() != base; waited++) usleep(10000);
    if (waited) printf("round %d: waited %d ms for the thread count\n", round, waited * 10);
    int after = threads_named(1);
    printf("round %d: %d thread(s) while loaded, %d after finalize+dlclose\n", round, loaded,
           after);
    CHECK(after == base);
  }
  printf("lifecycle: ok (load/init/finalize/unload x3, no thread outlives finalize)\n");
}

/* Receiver child: listen, accept, post receives, report the handle and progress on `out`. */
static void receiver(const char* path, int out, int posts, int flush) {
  void *ctx = NULL, *lc = NULL, *rc = NULL, *mh = NULL;
  double d = deadline();
  const ibnet_net_v11_t* n = load(path, &ctx);
  char handle[IBNET_HANDLE_MAXSIZE] = {0};
  OK(n->listen(ctx, 0, handle, &lc));
  CHECK(write(out, handle, sizeof handle) == (ssize_t)sizeof handle);
  while (rc == NULL) {
    OK(n->accept(lc, &rc, NULL));
    CHECK(!expired(d));
  }
  unsigned char* buf = aligned_alloc(4096, 2 * LEN);
  CHECK(buf);
  OK(n->regMr(rc, buf, 2 * LEN, IBNET_PTR_HOST, &mh));
  void* reqs[2] = {NULL, NULL};
  for (int i = 0; i < posts; i++) {
    void* data = buf + (size_t)i * LEN;
    size_t sz = LEN;
    int tag = i;
    while (reqs[i] == NULL) {
      OK(n->irecv(rc, 1, &data, &sz, &tag, &mh, NULL, &reqs[i]));
      CHECK(!expired(d));
    }
  }
  int got = -1;
  int done = 0;
  while (!done) {
    OK(n->test(reqs[0], &done, &got));
    CHECK(!expired(d));
  }
  for (unsigned i = 0; i < LEN; i++) CHECK(buf[i] == (unsigned char)(i * 7 + 1));
  printf("receiver: first message ok (%d bytes)\n", got);
  if (flush) {
    void* data = buf;
    int sz = (int)LEN;
    void* freq = NULL;
    OK(n->iflush(rc, 1, &data, &sz, &mh, &freq));
    if (freq == NULL) {
      printf("iflush: no request (the plugin has nothing to flush for host memory)\n");
    } else {
      OK(wait_req(n, freq, d));
      printf("iflush: completed (RDMA READ)\n");
    }
  }
  fflush(stdout);
  CHECK(write(out, "p", 1) == 1);
  if (!flush) pause(); /* peer-death: the parent kills us here */
  OK(n->deregMr(rc, mh));
  OK(n->closeRecv(rc));
  OK(n->closeListen(lc));
  unload(n, ctx);
  _exit(0);
}

/* ---- data: a lean byte-for-byte sweep, for the env-variant cases (QPs, AR, inline, RO). */
static const size_t kSizes[] = {0, 1, 8, 4096, 65536, 1u << 20, DATA_MAX};
#define NSIZES (sizeof kSizes / sizeof kSizes[0])
#define ROUNDS 2
static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)(i * 131u + seed * 7u + (i >> 12)); }

static void data_recv(const char* path, int out) {
  void *ctx = NULL, *lc = NULL, *rc = NULL, *mh = NULL;
  double d = deadline();
  const ibnet_net_v11_t* n = load(path, &ctx);
  char handle[IBNET_HANDLE_MAXSIZE] = {0};
  OK(n->listen(ctx, 0, handle, &lc));
  CHECK(write(out, handle, sizeof handle) == (ssize_t)sizeof handle);
  while (rc == NULL) {
    OK(n->accept(lc, &rc, NULL));
    CHECK(!expired(d));
  }
  unsigned char* buf = aligned_alloc(4096, 8 * (size_t)DATA_MAX);
  CHECK(buf);
  OK(n->regMr(rc, buf, 8 * (size_t)DATA_MAX, IBNET_PTR_HOST, &mh));
  for (unsigned s = 0; s < NSIZES * ROUNDS; s++) {
    size_t sz = kSizes[s % NSIZES];
    void* data = buf;
    int tag = 7, got = -1;
    void* req = NULL;
    memset(buf, 0, sz);
    while (req == NULL) {
      OK(n->irecv(rc, 1, &data, &sz, &tag, &mh, NULL, &req));
      CHECK(!expired(d));
    }
    int done = 0;
    while (!done) {
      OK(n->test(req, &done, &got));
      CHECK(!expired(d));
    }
    CHECK(got == (int)kSizes[s % NSIZES]);
    for (size_t i = 0; i < sz; i++) CHECK(buf[i] == pattern(i, s));
  }
  void* data[8];
  size_t sz[8];
  int tags[8], got[8];
  void* mhs[8];
  for (int i = 0; i < 8; i++) {
    data[i] = buf + (size_t)i * DATA_MAX, sz[i] = DATA_MAX, tags[i] = i, mhs[i] = mh;
  }
  void* req = NULL;
  while (req == NULL) {
    OK(n->irecv(rc, 8, data, sz, tags, mhs, NULL, &req));
    CHECK(!expired(d));
  }
  int done = 0;
  while (!done) {
    OK(n->test(req, &done, got));
    CHECK(!expired(d));
  }
  for (int k = 0; k < 8; k++) {
    size_t len = (size_t)(k + 1) * 65536;
    CHECK(got[k] == (int)len); /* each receive's bytes (the sizes FIFO), multi-receive too */
    for (size_t i = 0; i < len; i++) CHECK(((unsigned char*)data[k])[i] == pattern(i, 100 + k));
  }
  printf("receiver: %zu sizes (0 B..%u B) x %d rounds and an 8-way multi-receive verified\n",
         NSIZES, DATA_MAX, ROUNDS);
  OK(n->deregMr(rc, mh));
  OK(n->closeRecv(rc));
  OK(n->closeListen(lc));
  unload(n, ctx);
  _exit(0);
}

static void data_send(const char* path) {
  int p[2];
  CHECK(pipe(p) == 0);
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    close(p[0]);
    data_recv(path, p[1]);
  }
  close(p[1]);
  double d = deadline();
  void *ctx = NULL, *sc = NULL, *mh = NULL;
  const ibnet_net_v11_t* n = load(path, &ctx);
  char handle[IBNET_HANDLE_MAXSIZE];
  CHECK(read(p[0], handle, sizeof handle) == (ssize_t)sizeof handle);
  while (sc == NULL) {
    OK(n->connect(ctx, 0, handle, &sc, NULL));
    CHECK(!expired(d));
  }
  unsigned char* buf = aligned_alloc(4096, 8 * (size_t)DATA_MAX);
  CHECK(buf);
  OK(n->regMr(sc, buf, 8 * (size_t)DATA_MAX, IBNET_PTR_HOST, &mh));
  for (unsigned s = 0; s < NSIZES * ROUNDS; s++) {
    size_t sz = kSizes[s % NSIZES];
    for (size_t i = 0; i < sz; i++) buf[i] = pattern(i, s);
    void* req = NULL;
    while (req == NULL) {
      OK(n->isend(sc, buf, sz, 7, mh, NULL, &req));
      CHECK(!expired(d));
    }
    OK(wait_req(n, req, d));
  }
  void* reqs[8];
  for (int k = 0; k < 8; k++) {
    unsigned char* b = buf + (size_t)k * DATA_MAX;
    size_t len = (size_t)(k + 1) * 65536;
    for (size_t i = 0; i < len; i++) b[i] = pattern(i, 100 + k);
    reqs[k] = NULL;
    while (reqs[k] == NULL) {
      OK(n->isend(sc, b, len, k, mh, NULL, &reqs[k]));
      CHECK(!expired(d));
    }
  }
  for (int k = 0; k < 8; k++) OK(wait_req(n, reqs[k], d));
  int st = 0;
  CHECK(waitpid(child, &st, 0) == child);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  OK(n->deregMr(sc, mh));
  OK(n->closeSend(sc));
  unload(n, ctx);
  printf("data: ok\n");
}

static void sender_side(const char* path, int posts, int flush) {
  int p[2];
  CHECK(pipe(p) == 0);
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    close(p[0]);
    receiver(path, p[1], posts, flush);
  }
  close(p[1]);
  double d = deadline();
  void *ctx = NULL, *sc = NULL, *mh = NULL;
  const ibnet_net_v11_t* n = load(path, &ctx);
  char handle[IBNET_HANDLE_MAXSIZE];
  CHECK(read(p[0], handle, sizeof handle) == (ssize_t)sizeof handle);
  while (sc == NULL) {
    OK(n->connect(ctx, 0, handle, &sc, NULL));
    CHECK(!expired(d));
  }
  unsigned char* buf = aligned_alloc(4096, LEN);
  CHECK(buf);
  for (unsigned i = 0; i < LEN; i++) buf[i] = (unsigned char)(i * 7 + 1);
  OK(n->regMr(sc, buf, LEN, IBNET_PTR_HOST, &mh));
  void* req = NULL;
  while (req == NULL) {
    OK(n->isend(sc, buf, LEN, 0, mh, NULL, &req));
    CHECK(!expired(d));
  }
  OK(wait_req(n, req, d));
  char c;
  CHECK(read(p[0], &c, 1) == 1); /* the receiver got message 0 (and flushed) */
  if (flush) {
    int st = 0;
    CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    OK(n->deregMr(sc, mh));
    OK(n->closeSend(sc));
    unload(n, ctx);
    printf("flush: ok\n");
    return;
  }
  /* The receiver posted its second receive long ago (its FIFO entry is in our memory); kill it
   * now, then send into the dead peer: the RDMA write must fail with a completion error. */
  sleep(2);
  CHECK(kill(child, SIGKILL) == 0);
  CHECK(waitpid(child, NULL, 0) == child);
  printf("sender: receiver killed\n");
  fflush(stdout);
  int rc = 0;
  req = NULL;
  while (rc == 0 && req == NULL) {
    rc = n->isend(sc, buf, LEN, 1, mh, NULL, &req);
    CHECK(!expired(d));
  }
  if (rc == 0) rc = wait_req(n, req, d);
  printf("sender: send to the dead peer -> ncclResult_t %d\nsender: WARN: %s\n", rc, g_warn);
  CHECK(rc == 6 || rc == 2); /* RemoteError (completion error) or SystemError */
  const char* gid = getenv("FAULTS_GID");
  if (gid) { /* the WARN names the peer's GID (a completion error names the local one too) */
    CHECK(strstr(g_warn, gid) != NULL);
  }
  n->closeSend(sc); /* may report the error again; it must return */
  unload(n, ctx);
  printf("peer-death: ok (error reported, no hang, finalize returned)\n");
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s plugin.so devices N|data|lifecycle|peer-death|flush\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(argv[2], "devices") && argc == 4) devices(argv[1], atoi(argv[3]));
  else if (!strcmp(argv[2], "data")) data_send(argv[1]);
  else if (!strcmp(argv[2], "lifecycle")) lifecycle(argv[1]);
  else if (!strcmp(argv[2], "peer-death")) sender_side(argv[1], 2, 0);
  else if (!strcmp(argv[2], "flush")) sender_side(argv[1], 1, 1);
  else return 2;
  return 0;
}
