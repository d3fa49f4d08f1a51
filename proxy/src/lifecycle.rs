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
//! GPU-direct, flush, shared buffers, and which process the GPU side runs in) and hands them in
//! a [`SetupReq`]. At connect the engine:
//! 1. obtains the net comm: `connect`/`accept`, or, for a shared-buffer connection on a net
//!    with `max_recvs > 1` and [`ProxyConfig::shared_comms`](super::ProxyConfig), a reference
//!    to the comm already open for (device, remote rank, channel);
//! 2. lays out the [`ConnectMap`]: dedicated buffers per protocol (device memory for LL128 and
//!    SIMPLE when GPU-direct on send, for every protocol on receive), or a reference to the
//!    shared pool plus an optional dedicated LL buffer; then the `SendMem` and `RecvMem`;
//! 3. allocates the banks through the [`MemProvider`]; for a GPU side in another process
//!    (`same_process` decided from [`SetupReq::gpu_process`]) exports each bank
//!    ([`MemProvider::export`]); GDR-copy words when available and in the same process;
//! 4. initialises the ring: no credits yet in shared mode (`head = -STEPS`), every
//!    `connFifo` size -1 and mode NORMAL or OFFSET;
//! 5. registers every protocol buffer (as a DMA-BUF when the net, the config and the memory
//!    provider allow, for device memory).

use super::build::Taken;
use super::map::{ConnectMap, Side};
use super::mem::MemProvider;
use super::net::{CommRef, Net, NetHandle};
use super::state::{Conn, ConnId, ProxyState};
use super::xmap::XMap;
use super::{Dir, MAX_RECVS, NUM_PROTOCOLS};
use ibnet_core::error::{Error, Result};

pub use super::setup::SetupReq;

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

    /// Steps 2–5 of the module doc ([`build`](super::build)); on failure releases everything
    /// taken, comm included.
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
        let c = self.conn(id)?;
        let (dir, req, props) = (c.dir, c.req, c.props);
        match self.build(dir, req, props, &mut t) {
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

    /// The message the GPU's process maps a cross-process connection with (its
    /// [`SetupReq::gpu_process`] differs from this proxy's
    /// [`ProxyConfig::process_id`](super::ProxyConfig::process_id)); see
    /// [`xmap`](super::xmap). Refused for a same-process connection, whose map holds
    /// addresses instead.
    pub fn export_map(&self, id: ConnId) -> Result<XMap> {
        let c = self.conn(id)?;
        let r = c.res()?;
        if r.map.same_process != 0 {
            return Err(Error::BadState {
                op: "export_map",
                state: "the GPU side runs in the proxy's process",
            });
        }
        let sizes = core::array::from_fn(|i| r.bufs[i].map_or(0, |b| b.size as u64));
        XMap::new(c.dir, c.req.shared, self.cfg.process_id, &r.map, sizes)
    }

    /// What the GPU side of a connected connection uses (same-process connections; the GPU
    /// process of a cross-process one attaches to [`ProxyState::export_map`]'s message).
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
