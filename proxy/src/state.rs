//! The proxy's state: configuration, the connection table, shared pools and shared comms.
//!
//! A [`ProxyState`] is driven by one thread (NCCL's proxy thread). Connections live in a
//! fixed table of `C` entries and are named by [`ConnId`] (index + generation, so a freed
//! connection's id is detected, never aliased). Operations ([`super::ProxyOp`]) are owned by
//! the caller and refer to connections by id.

use super::map::ConnectMap;
use super::mem::{MemProvider, Region};
use super::net::{CommRef, Net, NetProps};
use super::pools::{Pools, SharedComms};
use super::setup::SetupReq;
use super::shared::{MemRef, RecvMem, SendMem};
use super::{Dir, NUM_PROTOCOLS};
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::AtomicU64;

/// Engine-wide settings, resolved by the caller (NCCL's variables, with NCCL 2.28 defaults in
/// [`ProxyConfig::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Dedicated buffer bytes per protocol, indexed by [`super::Protocol::index`]
    /// (`NCCL_BUFFSIZE` for SIMPLE; LL and LL128 from their line geometry). Each is split into
    /// [`super::STEPS`] slots.
    pub buff_sizes: [usize; NUM_PROTOCOLS],
    /// Bytes of one shared-buffer slot (`NCCL_P2P_NET_CHUNKSIZE`).
    pub p2p_chunk_size: usize,
    /// Channels a shared pool serves (NCCL's `p2pnChannels`).
    pub p2p_nchannels: usize,
    /// Give shared-buffer connections a dedicated LL buffer (`NCCL_ALLOC_P2P_NET_LL_BUFFERS`).
    pub alloc_p2p_ll_buffers: bool,
    /// Reuse net comms between shared-buffer connections (`NCCL_NET_SHARED_COMMS`).
    pub shared_comms: bool,
    /// Keep the proxy-written ring counter in GDR-copy memory when the memory provider offers
    /// it (`NCCL_GDRCOPY_SYNC_ENABLE`).
    pub gdr_copy_sync: bool,
    /// Flush received data by reading a GDR-copy word instead of `iflush`
    /// (`NCCL_GDRCOPY_FLUSH_ENABLE`).
    pub gdr_copy_flush: bool,
    /// Register device buffers as DMA-BUFs when the net and the memory provider can
    /// (NCCL's `dmaBufSupport`, `NCCL_DMABUF_ENABLE`).
    pub dmabuf: bool,
    /// The most bytes one network operation of a registered sub carries
    /// ([`MAX_NET_SIZE`](super::MAX_NET_SIZE), 1 GiB; smaller values split sooner).
    pub max_net_size: usize,
    /// This (the proxy's) process's identity, compared with each connection's
    /// [`SetupReq::gpu_process`] to decide `same_process` (0 by default; a caller running
    /// GPU processes apart sets both, e.g. to a hash of host and pid).
    pub process_id: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            // LL: 8 lines/thread × 512 threads × 8 steps × 16 B; LL128: 120 elems/thread ×
            // 640 threads × 8 steps × 8 B; SIMPLE: NCCL_BUFFSIZE = 4 MiB.
            buff_sizes: [8 * 512 * 8 * 16, 120 * 640 * 8 * 8, 1 << 22],
            p2p_chunk_size: 1 << 17,
            p2p_nchannels: 32,
            alloc_p2p_ll_buffers: false,
            shared_comms: true,
            gdr_copy_sync: true,
            gdr_copy_flush: false,
            dmabuf: true,
            max_net_size: super::MAX_NET_SIZE,
            process_id: 0,
        }
    }
}

/// A connection's handle: table index + generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    idx: u16,
    gen: u16,
}

impl ConnId {
    /// Packs the id into a `u32` (for C handles).
    pub fn to_bits(self) -> u32 {
        (self.gen as u32) << 16 | self.idx as u32
    }
    /// The table index.
    #[inline]
    pub(crate) fn index(self) -> usize {
        self.idx as usize
    }
    /// Unpacks [`ConnId::to_bits`].
    pub fn from_bits(b: u32) -> Self {
        Self {
            idx: b as u16,
            gen: (b >> 16) as u16,
        }
    }
}

/// A protocol buffer of a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buf {
    /// The proxy's address.
    pub cpu: u64,
    /// Bytes.
    pub size: usize,
    /// In device memory.
    pub dev: bool,
    /// The region it lies in (bounds for flag reads).
    pub region: Region,
}

/// What a connected connection holds; everything here is released by `free`.
pub(crate) struct Resources<N: Net> {
    pub comm: CommRef<N::Send, N::Recv>,
    /// Index into the shared comm table when the comm is shared.
    pub shared_comm: Option<usize>,
    pub map: ConnectMap,
    pub host: Option<Region>,
    pub dev: Option<Region>,
    pub gdc: Option<Region>,
    /// Index into the shared pools.
    pub pool: Option<usize>,
    pub send_mem: MemRef<SendMem>,
    pub recv_mem: MemRef<RecvMem>,
    pub gdc_sync: Option<MemRef<AtomicU64>>,
    pub gdc_flush: Option<MemRef<AtomicU64>>,
    pub bufs: [Option<Buf>; NUM_PROTOCOLS],
    pub mhandles: [Option<N::Mr>; NUM_PROTOCOLS],
}

impl<N: Net> Resources<N> {
    /// The ring counter the proxy writes: `head` (send) or `tail` (recv), in GDR-copy memory
    /// when there is some.
    pub fn proxy_word(&self, dir: Dir) -> &AtomicU64 {
        match (self.gdc_sync.as_ref(), dir) {
            (Some(w), _) => w.get(),
            (None, Dir::Send) => &self.send_mem.get().head,
            (None, Dir::Recv) => &self.recv_mem.get().tail,
        }
    }
}

/// One connection.
pub(crate) struct Conn<N: Net> {
    pub dir: Dir,
    pub req: SetupReq,
    pub props: NetProps,
    pub listen: Option<N::Listen>,
    pub res: Option<Resources<N>>,
    /// The next step number the connection's ops start from (rounded up per op).
    pub step: u64,
}

impl<N: Net> Conn<N> {
    /// The resources, or an error when the connection is not connected.
    pub fn res(&self) -> Result<&Resources<N>> {
        self.res.as_ref().ok_or(Error::BadState {
            op: "proxy progress",
            state: "connection not connected",
        })
    }
}

impl<N: Net> Resources<N> {
    /// The send comm of a send connection (send progress on a receive connection is a
    /// `BadState`).
    #[inline(always)]
    pub fn send_comm(&self) -> Result<N::Send> {
        match self.comm {
            CommRef::Send(c) => Ok(c),
            CommRef::Recv(_) => Err(Error::BadState {
                op: "send progress",
                state: "receive comm",
            }),
        }
    }
}

/// Checks the size a GPU wrote into a connFifo slot: `size` bytes at `off` must fit the
/// step's `room` and the buffer's `buf_size` (`OutOfRange` names the largest that fits).
#[inline(always)]
pub(crate) fn check_gpu_size(size: usize, off: usize, room: usize, buf_size: usize) -> Result<()> {
    if size > room || off + size > buf_size {
        return Err(Error::OutOfRange {
            what: "connFifo size from the GPU",
            value: size as i64,
            min: 0,
            max: room.min(buf_size.saturating_sub(off)) as i64,
        });
    }
    Ok(())
}

/// The proxy engine: `C` connections over net `N` with memory from `M`.
pub struct ProxyState<N: Net, M: MemProvider, const C: usize = 64> {
    pub(crate) net: N,
    pub(crate) mem: M,
    pub(crate) cfg: ProxyConfig,
    pub(crate) conns: [Option<Conn<N>>; C],
    pub(crate) gens: [u16; C],
    pub(crate) pools: Pools,
    pub(crate) comms: SharedComms<N::Send, N::Recv>,
}

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// An engine with no connections.
    pub fn new(net: N, mem: M, cfg: ProxyConfig) -> Self {
        const { assert!(C > 0 && C <= u16::MAX as usize) };
        Self {
            net,
            mem,
            cfg,
            conns: core::array::from_fn(|_| None),
            gens: [0; C],
            pools: Pools::default(),
            comms: SharedComms::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyConfig {
        &self.cfg
    }
    /// The net.
    pub fn net(&self) -> &N {
        &self.net
    }
    /// The net, mutably (e.g. to drive comms the engine does not own).
    pub fn net_mut(&mut self) -> &mut N {
        &mut self.net
    }
    /// The memory provider.
    pub fn mem(&self) -> &M {
        &self.mem
    }

    /// Live connections, shared pools and shared comms (for leak checks).
    pub fn live(&self) -> (usize, usize, usize) {
        (
            self.conns.iter().filter(|c| c.is_some()).count(),
            self.pools.live(),
            self.comms.live(),
        )
    }

    pub(crate) fn alloc_id(&mut self) -> Result<ConnId> {
        let i = self
            .conns
            .iter()
            .position(Option::is_none)
            .ok_or(Error::Full {
                what: "proxy connections",
                cap: C,
            })?;
        self.gens[i] = self.gens[i].wrapping_add(1);
        Ok(ConnId {
            idx: i as u16,
            gen: self.gens[i],
        })
    }

    pub(crate) fn slot_of(&self, id: ConnId) -> Result<usize> {
        let i = id.idx as usize;
        match self.conns.get(i) {
            Some(Some(_)) if self.gens[i] == id.gen => Ok(i),
            _ => Err(Error::Missing {
                what: "proxy connection",
            }),
        }
    }

    pub(crate) fn conn(&self, id: ConnId) -> Result<&Conn<N>> {
        let i = self.slot_of(id)?;
        self.conns[i].as_ref().ok_or(Error::Missing {
            what: "proxy connection",
        })
    }

    pub(crate) fn conn_mut(&mut self, id: ConnId) -> Result<&mut Conn<N>> {
        let i = self.slot_of(id)?;
        self.conns[i].as_mut().ok_or(Error::Missing {
            what: "proxy connection",
        })
    }
}

/// Looks `id` up in a connection table (a free function, so callers can borrow other fields
/// of the `ProxyState` mutably at the same time).
pub(crate) fn lookup<'a, N: Net>(
    conns: &'a [Option<Conn<N>>],
    gens: &[u16],
    id: ConnId,
) -> Result<&'a Conn<N>> {
    let i = id.idx as usize;
    match (conns.get(i), gens.get(i)) {
        (Some(Some(c)), Some(&g)) if g == id.gen => Ok(c),
        _ => Err(Error::Missing {
            what: "proxy connection",
        }),
    }
}
