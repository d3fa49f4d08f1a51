//! A connection's life: setup, connect, free (NCCL's `*ProxySetup`, `*ProxyConnect`,
//! `*ProxyFree`).
//!
//! ```text
//!  setup(dir, req) ──▶ Setup ──connect_send / connect_recv──▶ Connected ──free──▶ (gone)
//!   recv: listen,          (Ok(None): net still            buffers, SendMem/RecvMem,
//!   returns the handle      connecting, call again)        registrations, credits
//!  free from either state releases exactly what was taken, in reverse order.
//! ```
//!
//! The caller makes the topology decisions NCCL makes in `sendSetup`/`recvSetup` (net device,
//! GPU-direct, flush, shared buffers) and hands them in a [`SetupReq`]. At connect the engine:
//! 1. obtains the net comm: `connect`/`accept`, or, for a shared-buffer connection on a net
//!    with `max_recvs > 1` and [`ProxyConfig::shared_comms`](super::ProxyConfig), a reference
//!    to the comm already open for (device, remote rank, channel);
//! 2. lays out the [`ConnectMap`]: dedicated buffers per protocol (device memory for LL128 and
//!    SIMPLE when GPU-direct on send, for every protocol on receive), or a reference to the
//!    shared pool plus an optional dedicated LL buffer; then the `SendMem` and `RecvMem`;
//! 3. allocates the banks through the [`MemProvider`], and GDR-copy words when available;
//! 4. initialises the ring: no credits yet in shared mode (`head = -STEPS`), every
//!    `connFifo` size -1 and mode NORMAL or OFFSET;
//! 5. registers every protocol buffer (as a DMA-BUF when the net, the config and the memory
//!    provider allow, for device memory).

use super::map::{Bank, ConnectMap, MapMem, Side};
use super::mem::{MemKind, MemProvider, Region};
use super::net::{CommRef, Net, NetHandle, PtrType};
use super::shared::{store_step, MemRef, RecvMem, SendMem};
use super::state::{Buf, Conn, ConnId, ProxyState, Resources};
use super::{
    Dir, Protocol, MAX_RECVS, MODE_NORMAL, MODE_OFFSET, NUM_PROTOCOLS, SHARED_STEPS, STEPS,
};
use crate::error::{Error, Result};

/// What the caller decided for a connection (NCCL's `setupReq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetupReq {
    /// This rank (the tag of its sends).
    pub tp_rank: u32,
    /// This rank's index among the local ranks (selects the shared pool).
    pub tp_local_rank: u32,
    /// The peer's rank (the tag of receives from it; the shared comm key on send).
    pub tp_remote_rank: u32,
    /// Shared-buffer mode (p2p); see [`SetupReq::shared_default`].
    pub shared: bool,
    /// The net device.
    pub net_dev: u32,
    /// GPU-direct RDMA: buffers in device memory.
    pub use_gdr: bool,
    /// Received data must be flushed before the GPU reads it (receive side, with `use_gdr`).
    pub need_flush: bool,
    /// The channel.
    pub channel: u32,
    /// The connection index.
    pub conn_index: u32,
}

impl SetupReq {
    /// NCCL's choice of shared-buffer mode: never for ring/tree graphs or connection index 0;
    /// otherwise `NCCL_NET_SHARED_BUFFERS` (`-2`, the default, means on).
    pub fn shared_default(has_graph: bool, conn_index: u32, net_shared_buffers: i64) -> bool {
        if has_graph || conn_index == 0 {
            false
        } else if net_shared_buffers != -2 {
            net_shared_buffers != 0
        } else {
            true
        }
    }
}

/// What the GPU side of a connection is given (addresses as the GPU sees them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceView {
    /// Direction of the connection.
    pub dir: Dir,
    /// The `head` word: credits (send) or consumed steps (recv). GDR-copy memory on send
    /// when in use.
    pub head: u64,
    /// The `tail` word: filled steps (send) or landed steps (recv). GDR-copy memory on recv
    /// when in use.
    pub tail: u64,
    /// The `RecvMem` (for `connFifo`).
    pub recv_mem: u64,
    /// Each protocol's buffer, 0 when absent.
    pub buffs: [u64; NUM_PROTOCOLS],
    /// Each protocol's buffer size.
    pub buff_sizes: [usize; NUM_PROTOCOLS],
    /// Shared-buffer mode: SIMPLE data sits at `connFifo[slot].offset` in `buffs[SIMPLE]`.
    pub shared: bool,
}

/// What `connect` took so far, so a failure half-way releases exactly that.
struct Taken<N: Net> {
    comm: Option<CommRef<N::Send, N::Recv>>,
    shared_comm: Option<usize>,
    host: Option<Region>,
    dev: Option<Region>,
    gdc: Option<Region>,
    pool: Option<usize>,
    mhandles: [Option<N::Mr>; NUM_PROTOCOLS],
}

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// Creates a connection. A receive connection starts listening and returns the handle the
    /// sending peer connects with.
    pub fn setup(&mut self, dir: Dir, req: SetupReq) -> Result<(ConnId, Option<NetHandle>)> {
        if req.shared && req.channel as usize >= self.cfg.p2p_nchannels {
            return Err(Error::OutOfRange {
                what: "channel of a shared-buffer connection",
                value: req.channel as i64,
                min: 0,
                max: self.cfg.p2p_nchannels as i64 - 1,
            });
        }
        let mut props = self.net.properties(req.net_dev)?;
        props.max_recvs = props.max_recvs.clamp(1, MAX_RECVS);
        let id = self.alloc_id()?;
        let (listen, handle) = match dir {
            Dir::Send => (None, None),
            Dir::Recv => {
                let mut h = [0u8; 128];
                let l = self.net.listen(req.net_dev, &mut h)?;
                (Some(l), Some(h))
            }
        };
        self.conns[id.index()] = Some(Conn {
            dir,
            req,
            props,
            listen,
            res: None,
            step: 0,
        });
        Ok((id, handle))
    }

    fn uses_shared_comm(&self, c: &Conn<N>) -> bool {
        c.req.shared && c.props.max_recvs > 1 && self.cfg.shared_comms
    }

    /// Connects a send connection to the peer's `handle`. `Ok(None)`: the net is still
    /// connecting; call again. On success returns the connection map.
    pub fn connect_send(&mut self, id: ConnId, handle: &NetHandle) -> Result<Option<ConnectMap>> {
        let c = self.conn(id)?;
        Self::check_connectable(c, Dir::Send)?;
        let (dev, remote, channel) = (c.req.net_dev, c.req.tp_remote_rank, c.req.channel);
        let (comm, shared_comm) = if self.uses_shared_comm(c) {
            match self.comms.take_ref(dev, remote, channel, Dir::Send) {
                Some((i, comm)) => (comm, Some(i)),
                None => {
                    let Some(s) = self.net.connect(dev, handle)? else {
                        return Ok(None);
                    };
                    let i = self.comms.insert(dev, remote, channel, CommRef::Send(s));
                    match i {
                        Ok(i) => (CommRef::Send(s), Some(i)),
                        Err(e) => {
                            let _ = self.net.close_send(s);
                            return Err(e);
                        }
                    }
                }
            }
        } else {
            let Some(s) = self.net.connect(dev, handle)? else {
                return Ok(None);
            };
            (CommRef::Send(s), None)
        };
        self.finish_connect(id, comm, shared_comm).map(Some)
    }

    /// Accepts the peer's connection on a receive connection; `remote_proxy_rank` is the rank
    /// whose proxy sends (the shared comm key). `Ok(None)`: not yet; call again.
    pub fn connect_recv(
        &mut self,
        id: ConnId,
        remote_proxy_rank: u32,
    ) -> Result<Option<ConnectMap>> {
        let c = self.conn(id)?;
        Self::check_connectable(c, Dir::Recv)?;
        let (dev, channel) = (c.req.net_dev, c.req.channel);
        let listen = c.listen.ok_or(Error::BadState {
            op: "connect_recv",
            state: "not listening",
        })?;
        let (comm, shared_comm) = if self.uses_shared_comm(c) {
            match self
                .comms
                .take_ref(dev, remote_proxy_rank, channel, Dir::Recv)
            {
                Some((i, comm)) => (comm, Some(i)),
                None => {
                    let Some(r) = self.net.accept(listen)? else {
                        return Ok(None);
                    };
                    match self
                        .comms
                        .insert(dev, remote_proxy_rank, channel, CommRef::Recv(r))
                    {
                        Ok(i) => (CommRef::Recv(r), Some(i)),
                        Err(e) => {
                            let _ = self.net.close_recv(r);
                            return Err(e);
                        }
                    }
                }
            }
        } else {
            let Some(r) = self.net.accept(listen)? else {
                return Ok(None);
            };
            (CommRef::Recv(r), None)
        };
        // The listener has served its purpose.
        let l = self.conn_mut(id)?.listen.take();
        let closed = l.map_or(Ok(()), |l| self.net.close_listen(l));
        let map = self.finish_connect(id, comm, shared_comm)?;
        closed.map(|()| Some(map))
    }

    fn check_connectable(c: &Conn<N>, dir: Dir) -> Result<()> {
        if c.dir != dir {
            return Err(Error::BadState {
                op: "connect",
                state: "wrong direction",
            });
        }
        if c.res.is_some() {
            return Err(Error::BadState {
                op: "connect",
                state: "connected",
            });
        }
        Ok(())
    }

    /// Steps 2–5 of the module doc; on failure releases everything taken, comm included.
    fn finish_connect(
        &mut self,
        id: ConnId,
        comm: CommRef<N::Send, N::Recv>,
        shared_comm: Option<usize>,
    ) -> Result<ConnectMap> {
        let mut t = Taken::<N> {
            comm: Some(comm),
            shared_comm,
            host: None,
            dev: None,
            gdc: None,
            pool: None,
            mhandles: [None; NUM_PROTOCOLS],
        };
        match self.build(id, &mut t) {
            Ok(res) => {
                let map = res.map;
                self.conn_mut(id)?.res = Some(res);
                Ok(map)
            }
            Err(e) => {
                let _ = self.release(&mut t);
                Err(e)
            }
        }
    }

    fn build(&mut self, id: ConnId, t: &mut Taken<N>) -> Result<Resources<N>> {
        let c = self.conn(id)?;
        let (dir, req, props) = (c.dir, c.req, c.props);
        let comm = t.comm.ok_or(Error::Missing { what: "net comm" })?;
        let cfg = self.cfg;
        let mut map = ConnectMap {
            same_process: 1,
            shared: req.shared as u32,
            ..ConnectMap::default()
        };
        let mut sizes = [0usize; NUM_PROTOCOLS];
        let ll = Protocol::Ll.index();
        let simple = Protocol::Simple.index();
        let mut pool_region = None;
        if !req.shared {
            for p in Protocol::ALL {
                // Send: LL stays in host memory (the proxy reads its flags); receive: all
                // protocols follow GPU-direct.
                let dev = req.use_gdr && (dir == Dir::Recv || p != Protocol::Ll);
                let i = p.index();
                map.buffs[i] = map.add(false, dev, cfg.buff_sizes[i] as u64)?;
                sizes[i] = cfg.buff_sizes[i];
            }
        } else {
            let size = cfg
                .p2p_nchannels
                .checked_mul(SHARED_STEPS * cfg.p2p_chunk_size)
                .ok_or(Error::OutOfRange {
                    what: "shared pool size",
                    value: i64::MAX,
                    min: 0,
                    max: u32::MAX as i64,
                })?;
            let (pi, r) =
                self.pools
                    .acquire(&mut self.mem, req.tp_local_rank, dir, req.use_gdr, size)?;
            t.pool = Some(pi);
            pool_region = Some(r);
            let bank = if req.use_gdr {
                Bank::SharedDevice
            } else {
                Bank::SharedHost
            };
            map.mems[bank as usize] = MapMem::of(&r);
            sizes[simple] = r.size();
            if cfg.alloc_p2p_ll_buffers {
                map.buffs[ll] = map.add(false, false, cfg.buff_sizes[ll] as u64)?;
                sizes[ll] = cfg.buff_sizes[ll];
            }
            map.buffs[simple] = map.add(true, req.use_gdr, r.size() as u64)?;
        }
        let send_off = map.add(false, false, core::mem::size_of::<SendMem>() as u64)?;
        let recv_off = map.add(false, false, core::mem::size_of::<RecvMem>() as u64)?;
        map.send_mem = send_off;
        map.recv_mem = recv_off;

        let dev_size = map.mems[Bank::Device as usize].size as usize;
        if dev_size > 0 {
            let r = self.mem.alloc(MemKind::Device, dev_size)?;
            t.dev = Some(r);
            map.mems[Bank::Device as usize] = MapMem::of(&r);
        }
        let host_size = map.mems[Bank::Host as usize].size as usize;
        let host = self.mem.alloc(MemKind::Host, host_size)?;
        t.host = Some(host);
        map.mems[Bank::Host as usize] = MapMem::of(&host);

        // GDR copy: send needs the credit word; receive the tail word and/or the flush word.
        let words = match dir {
            Dir::Send if cfg.gdr_copy_sync => 1,
            Dir::Recv if cfg.gdr_copy_sync || cfg.gdr_copy_flush => 2,
            _ => 0,
        };
        let (mut gdc_sync, mut gdc_flush) = (None, None);
        if words > 0 {
            if let Some(g) = self.mem.gdc_alloc(words)? {
                t.gdc = Some(g);
                if cfg.gdr_copy_sync {
                    gdc_sync = Some(MemRef::at(&g, 0)?);
                    map.mems[Bank::Gdc as usize] = MapMem {
                        size: 8,
                        ..MapMem::of(&g)
                    };
                }
                if dir == Dir::Recv && cfg.gdr_copy_flush {
                    gdc_flush = Some(MemRef::at(&g, 8)?);
                }
            }
        }

        let send_mem = MemRef::<SendMem>::at(&host, send_off.offset() as usize)?;
        let recv_mem = MemRef::<RecvMem>::at(&host, recv_off.offset() as usize)?;
        let mut bufs = [None; NUM_PROTOCOLS];
        for (i, b) in bufs.iter_mut().enumerate() {
            let item = map.buffs[i];
            let Some(cpu) = map.pointer(item, Side::Cpu) else {
                continue;
            };
            let region = match item.bank() {
                Bank::Host => host,
                Bank::Device => t.dev.ok_or(Error::Missing {
                    what: "device bank",
                })?,
                _ => pool_region.ok_or(Error::Missing {
                    what: "shared pool",
                })?,
            };
            *b = Some(Buf {
                cpu,
                size: sizes[i],
                dev: item.is_dev(),
                region,
            });
        }

        let mut res = Resources {
            comm,
            shared_comm: t.shared_comm,
            map,
            host: t.host,
            dev: t.dev,
            gdc: t.gdc,
            pool: t.pool,
            send_mem,
            recv_mem,
            gdc_sync,
            gdc_flush,
            bufs,
            mhandles: [None; NUM_PROTOCOLS],
        };
        // No credits yet in shared mode: they are posted per step by the progress.
        if dir == Dir::Send {
            let head = if req.shared {
                0u64.wrapping_sub(STEPS as u64)
            } else {
                0
            };
            store_step(res.proxy_word(Dir::Send), head);
            self.mem.store_fence();
        }
        let mode = if req.shared { MODE_OFFSET } else { MODE_NORMAL };
        for f in &res.recv_mem.get().conn_fifo {
            f.clear();
            f.set_mode(mode);
        }

        for i in 0..NUM_PROTOCOLS {
            let Some(b) = res.bufs[i] else { continue };
            let ptr = if b.dev {
                PtrType::Device
            } else {
                PtrType::Host
            };
            let mut fd = None;
            if b.dev && req.use_gdr && props.dmabuf && cfg.dmabuf {
                let off = (b.cpu - b.region.cpu()) as usize;
                fd = self.mem.dmabuf_fd(&b.region, off, b.size)?;
            }
            let r = self
                .net
                .reg_mr(comm, b.cpu, b.size, ptr, fd.map(|fd| (fd, 0)));
            if let Some(fd) = fd {
                self.mem.close_dmabuf(fd);
            }
            let mr = r?;
            t.mhandles[i] = Some(mr);
            res.mhandles[i] = Some(mr);
        }
        Ok(res)
    }

    /// Releases what `t` holds, in reverse order of taking; returns the first error.
    fn release(&mut self, t: &mut Taken<N>) -> Result<()> {
        let mut first = Ok(());
        let mut keep = |r: Result<()>| {
            if first.is_ok() {
                first = r;
            }
        };
        if let Some(comm) = t.comm {
            for mr in t.mhandles.iter_mut().filter_map(Option::take) {
                keep(self.net.dereg_mr(comm, mr));
            }
        }
        for r in [t.gdc.take(), t.host.take(), t.dev.take()]
            .into_iter()
            .flatten()
        {
            keep(self.mem.free(r));
        }
        if let Some(p) = t.pool.take() {
            keep(self.pools.release(&mut self.mem, p));
        }
        if let Some(comm) = t.comm.take() {
            let close = match t.shared_comm.take() {
                Some(i) => self.comms.release(i).unwrap_or_else(|e| {
                    keep(Err(e));
                    None
                }),
                None => Some(comm),
            };
            match close {
                Some(CommRef::Send(s)) => keep(self.net.close_send(s)),
                Some(CommRef::Recv(r)) => keep(self.net.close_recv(r)),
                None => {}
            }
        }
        first
    }

    /// Frees a connection in any state, releasing exactly what it took: registrations, memory,
    /// its reference on the shared pool and shared comm (closing them with the last one), its
    /// comm, its listener. Operations using it must be finished or aborted first.
    pub fn free(&mut self, id: ConnId) -> Result<()> {
        let i = self.slot_of(id)?;
        let c = self.conns[i].take().ok_or(Error::Missing {
            what: "proxy connection",
        })?;
        let mut first = Ok(());
        if let Some(r) = c.res {
            let mut t = Taken::<N> {
                comm: Some(r.comm),
                shared_comm: r.shared_comm,
                host: r.host,
                dev: r.dev,
                gdc: r.gdc,
                pool: r.pool,
                mhandles: r.mhandles,
            };
            first = self.release(&mut t);
        }
        if let Some(l) = c.listen {
            let r = self.net.close_listen(l);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// The connection map of a connected connection.
    pub fn map(&self, id: ConnId) -> Result<ConnectMap> {
        Ok(self.conn(id)?.res()?.map)
    }

    /// What the GPU side of a connected connection uses.
    pub fn device_view(&self, id: ConnId) -> Result<DeviceView> {
        let c = self.conn(id)?;
        let r = c.res()?;
        let map = &r.map;
        let gpu = |o| map.pointer(o, Side::Gpu).unwrap_or(0);
        let send_mem = gpu(map.send_mem);
        let recv_mem = gpu(map.recv_mem);
        let gdc = r.gdc_sync.and(r.gdc).map(|g| g.gpu());
        let (head, tail) = match (c.dir, gdc) {
            (Dir::Send, Some(g)) => (g, recv_mem),
            (Dir::Recv, Some(g)) => (send_mem, g),
            _ => (send_mem, recv_mem),
        };
        let mut buffs = [0; NUM_PROTOCOLS];
        let mut buff_sizes = [0; NUM_PROTOCOLS];
        for i in 0..NUM_PROTOCOLS {
            buffs[i] = gpu(map.buffs[i]);
            buff_sizes[i] = r.bufs[i].map_or(0, |b| b.size);
        }
        Ok(DeviceView {
            dir: c.dir,
            head,
            tail,
            recv_mem,
            buffs,
            buff_sizes,
            shared: c.req.shared,
        })
    }
}
