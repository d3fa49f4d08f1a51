// verbs-probe: what the guest's verbs device looks like through plain libibverbs, independent
// of ibnet. It prints one `probe:` line per fact and checks the ones ibnet's discovery relies on.
//
//   verbs-probe DEV EXPECTED_GID_INDEX   (exit 0: all checks passed)
//
// Facts: port state / link layer / MTU / width x speed, max_msg_sz, the GID table with types,
// 8 MiB MR registration, relaxed-ordering registration (ibv_reg_mr_iova2), and the
// ibv_reg_dmabuf_mr(fd=-1) probe (EBADF: dmabuf supported; EOPNOTSUPP/EPROTONOSUPPORT: not).
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      printf("probe: CHECK FAILED: " __VA_ARGS__);                              \
      printf("\n");                                                             \
      failures++;                                                               \
    }                                                                           \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s DEV EXPECTED_GID_INDEX\n", argv[0]);
    return 2;
  }
  const char *want = argv[1];
  int want_gid = atoi(argv[2]);
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  CHECK(list && n > 0, "no verbs device (errno %d)", errno);
  struct ibv_context *ctx = NULL;
  for (int i = 0; list && i < n; i++) {
    printf("probe: device[%d] %s\n", i, ibv_get_device_name(list[i]));
    if (!ctx && strcmp(ibv_get_device_name(list[i]), want) == 0) ctx = ibv_open_device(list[i]);
  }
  if (!ctx) {
    printf("probe: CHECK FAILED: cannot open %s\n", want);
    return 1;
  }
  struct ibv_device_attr dev;
  CHECK(ibv_query_device(ctx, &dev) == 0, "ibv_query_device");
  struct ibv_port_attr port;
  CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port 1");
  printf("probe: port 1 state=%s link_layer=%s active_mtu=%d max_mtu=%d width=%u speed=%u "
         "max_msg_sz=%u gid_tbl_len=%d max_qp_wr=%d max_sge=%d\n",
         ibv_port_state_str(port.state),
         port.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
         128 << port.active_mtu, 128 << port.max_mtu, port.active_width, port.active_speed,
         port.max_msg_sz, port.gid_tbl_len, dev.max_qp_wr, dev.max_sge);
  CHECK(port.state == IBV_PORT_ACTIVE, "port 1 not ACTIVE");
  CHECK(port.link_layer == IBV_LINK_LAYER_ETHERNET, "port 1 is not RoCE (Ethernet)");

  int roce_v2_ipv4 = -1;
  for (int i = 0; i < port.gid_tbl_len && i < 16; i++) {
    struct ibv_gid_entry e;
    if (ibv_query_gid_ex(ctx, 1, i, &e, 0) != 0) continue;
    const uint8_t *g = e.gid.raw;
    printf("probe: gid[%d] ", i);
    for (int b = 0; b < 16; b += 2) printf("%02x%02x%s", g[b], g[b + 1], b < 14 ? ":" : "");
    const char *type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? "RoCEv2"
                       : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCEv1"
                                                            : "IB";
    printf(" %s ndev=%u\n", type, e.ndev_ifindex);
    static const uint8_t v4map[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (roce_v2_ipv4 < 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2 && !memcmp(g, v4map, 12))
      roce_v2_ipv4 = i;
  }
  printf("probe: first RoCEv2 IPv4-mapped gid index = %d\n", roce_v2_ipv4);
  CHECK(roce_v2_ipv4 == want_gid, "RoCEv2 IPv4 GID at %d, expected %d", roce_v2_ipv4, want_gid);

  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  CHECK(pd, "ibv_alloc_pd");
  size_t len = 8u << 20;
  char *buf = aligned_alloc(4096, len);
  int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, len, acc) : NULL;
  CHECK(mr, "ibv_reg_mr 8 MiB (errno %d)", errno);
  printf("probe: reg_mr 8 MiB %s\n", mr ? "ok" : strerror(errno));
  if (mr) ibv_dereg_mr(mr);

  errno = 0;
  mr = pd ? ibv_reg_mr_iova2(pd, buf, len, (uintptr_t)buf, acc | IBV_ACCESS_RELAXED_ORDERING) : NULL;
  printf("probe: reg_mr_iova2 RELAXED_ORDERING %s\n", mr ? "ok" : strerror(errno));
  if (mr) ibv_dereg_mr(mr);

  errno = 0;
  mr = pd ? ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, acc) : NULL;
  int e = errno;
  printf("probe: reg_dmabuf_mr(fd=-1) -> %s errno=%d (%s): dmabuf %s\n", mr ? "mr" : "NULL", e,
         strerror(e), e == EBADF ? "supported" : "not supported");
  if (mr) ibv_dereg_mr(mr);

  free(buf);
  if (pd) ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  printf("probe: %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
