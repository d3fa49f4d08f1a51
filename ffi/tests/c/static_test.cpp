// C++ program linked against libibnet.a + include/ibnet.h: one in-process loopback transfer
// through ncclNetPlugin_v11 (listen, connect and accept driven from one thread). With zero
// devices (no RDMA NIC, no IBNET_PROVIDER=soft) it checks init/devices/finalize and skips the
// transfer, unless called as `static_test require-device` (what run-c-tests.sh does with
// IBNET_PROVIDER=soft), where zero devices is a failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ibnet.h"

#define CHECK(c) do { if (!(c)) { std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); std::exit(1); } } while (0)

int main(int argc, char** argv) {
  const bool require = argc > 1 && std::strcmp(argv[1], "require-device") == 0;
  const ibnet_net_v11_t& n = ncclNetPlugin_v11;
  CHECK(std::strcmp(n.name, "IBNet") == 0);
  void* ctx = nullptr;
  ibnet_comm_config_t cfg{-1};
  CHECK(n.init(&ctx, 1, &cfg, nullptr, nullptr) == 0);
  int ndev = -1;
  CHECK(n.devices(&ndev) == 0 && ndev >= 0);
  if (ndev == 0) {
    CHECK(!require);
    std::printf("static_test: 0 devices; loopback transfer skipped; init/devices/finalize OK\n");
    CHECK(n.finalize(ctx) == 0);
    return 0;
  }
  char handle[IBNET_HANDLE_MAXSIZE] = {};
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  CHECK(n.listen(ctx, 0, handle, &lc) == 0 && lc);
  while (!sc || !rc) {
    if (!sc) CHECK(n.connect(ctx, 0, handle, &sc, nullptr) == 0);
    if (!rc) CHECK(n.accept(lc, &rc, nullptr) == 0);
  }
  const size_t len = 1 << 20;
  std::vector<unsigned char> src(len + 4096), dst(len + 4096);
  for (size_t i = 0; i < len; i++) src[i] = (unsigned char)(i * 31 + 7);
  void *smh = nullptr, *rmh = nullptr;
  CHECK(n.regMr(sc, src.data(), len, IBNET_PTR_HOST, &smh) == 0);
  CHECK(n.regMr(rc, dst.data(), len, IBNET_PTR_HOST, &rmh) == 0);
  void* data = dst.data();
  size_t size = len;
  int tag = 3;
  void *rreq = nullptr, *sreq = nullptr;
  while (!rreq) CHECK(n.irecv(rc, 1, &data, &size, &tag, &rmh, nullptr, &rreq) == 0);
  while (!sreq) CHECK(n.isend(sc, src.data(), len, 3, smh, nullptr, &sreq) == 0);
  int sdone = 0, rdone = 0, got = 0;
  while (!sdone || !rdone) {
    if (!sdone) CHECK(n.test(sreq, &sdone, nullptr) == 0);
    if (!rdone) CHECK(n.test(rreq, &rdone, &got) == 0);
  }
  CHECK(got == (int)len && std::memcmp(src.data(), dst.data(), len) == 0);
  CHECK(n.deregMr(sc, smh) == 0 && n.deregMr(rc, rmh) == 0);
  CHECK(n.closeSend(sc) == 0 && n.closeRecv(rc) == 0 && n.closeListen(lc) == 0);
  CHECK(n.finalize(ctx) == 0);
  std::printf("static_test: loopback transfer of %zu bytes verified\n", len);
  return 0;
}
