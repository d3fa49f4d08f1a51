//! Building a connection's resources at connect (steps 2–5 of [`lifecycle`](super::lifecycle)),
//! in four stages, and releasing them:
//!
//! ```text
//!  plan      lay out the ConnectMap: dedicated buffers per protocol, or a reference on the
//!            shared pool (+ an optional LL buffer); then SendMem and RecvMem
//!  allocate  the device and host banks through the MemProvider; GDR-copy words if any
//!  bind      MemRefs to SendMem / RecvMem, each protocol's buffer; the ring initialised
//!            (no credits yet in shared mode, every connFifo size -1, mode NORMAL or OFFSET)
//!  register  every protocol buffer with the net (as a DMA-BUF where allowed)
//! ```
//! Every stage records what it took in a [`Taken`], so a failure in any of them releases
//! exactly that ([`ProxyState::release`], in reverse order).

use super::map::{Bank, ConnectMap, MapMem, MapOffset, Side};
use super::mem::{MemKind, MemProvider, Region};
use super::net::{CommRef, Net, NetProps, PtrType};
use super::setup::SetupReq;
use super::shared::{store_step, MemRef, RecvMem, SendMem};
use super::state::{Buf, ProxyState, Resources};
use super::{Dir, Protocol, MODE_NORMAL, MODE_OFFSET, NUM_PROTOCOLS, SHARED_STEPS, STEPS};
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::AtomicU64;

/// What `connect` took so far, so a failure half-way releases exactly that.
pub(super) struct Taken<N: Net> {
    pub comm: Option<CommRef<N::Send, N::Recv>>,
    pub shared_comm: Option<usize>,
    pub host: Option<Region>,
    pub dev: Option<Region>,
    pub gdc: Option<Region>,
    pub pool: Option<usize>,
    pub mhandles: [Option<N::Mr>; NUM_PROTOCOLS],
}

/// The layout `plan` decides.
struct Plan {
    map: ConnectMap,
    /// Each protocol's buffer size (0: none).
    sizes: [usize; NUM_PROTOCOLS],
    /// The shared pool's region (shared mode).
    pool: Option<Region>,
    send_mem: MapOffset,
    recv_mem: MapOffset,
}

/// The GDR-copy words `allocate` obtained.
struct Words {
    sync: Option<MemRef<AtomicU64>>,
    flush: Option<MemRef<AtomicU64>>,
}

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// Builds the resources of a connection with comm `t.comm`: plan, allocate, bind,
    /// register. On failure `t` holds what was taken.
    pub(super) fn build(
        &mut self,
        dir: Dir,
        req: SetupReq,
        props: NetProps,
        t: &mut Taken<N>,
    ) -> Result<Resources<N>> {
        let comm = t.comm.ok_or(Error::Missing { what: "net comm" })?;
        let mut plan = self.plan(dir, &req, t)?;
        let words = self.allocate(dir, &mut plan, t)?;
        let mut res = self.bind(dir, &req, &plan, words, comm, t)?;
        self.register(&req, &props, &mut res, t)?;
        Ok(res)
    }

    /// Stage 1: the connection map and buffer sizes (a reference on the shared pool, which
    /// fixes the shared buffer, in shared mode).
    fn plan(&mut self, dir: Dir, req: &SetupReq, t: &mut Taken<N>) -> Result<Plan> {
        let cfg = self.cfg;
        let mut map = ConnectMap {
            same_process: (req.gpu_process == cfg.process_id) as u32,
            shared: req.shared as u32,
            ..ConnectMap::default()
        };
        let mut sizes = [0usize; NUM_PROTOCOLS];
        let ll = Protocol::Ll.index();
        let simple = Protocol::Simple.index();
        let mut pool = None;
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
            pool = Some(r);
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
        let send_mem = map.add(false, false, core::mem::size_of::<SendMem>() as u64)?;
        let recv_mem = map.add(false, false, core::mem::size_of::<RecvMem>() as u64)?;
        map.send_mem = send_mem;
        map.recv_mem = recv_mem;
        Ok(Plan {
            map,
            sizes,
            pool,
            send_mem,
            recv_mem,
        })
    }

    /// Stage 2: the device and host banks, and the GDR-copy words (send: the credit word;
    /// receive: the tail word and/or the flush word).
    fn allocate(&mut self, dir: Dir, plan: &mut Plan, t: &mut Taken<N>) -> Result<Words> {
        let cfg = self.cfg;
        let map = &mut plan.map;
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

        if map.same_process == 0 {
            self.export_banks(map, plan.pool, t)?;
        }
        // GDR copy maps device words into this process only: never across processes (as
        // NCCL, which uses it only when `sameProcess`).
        let words = match dir {
            _ if map.same_process == 0 => 0,
            Dir::Send if cfg.gdr_copy_sync => 1,
            Dir::Recv if cfg.gdr_copy_sync || cfg.gdr_copy_flush => 2,
            _ => 0,
        };
        let mut w = Words {
            sync: None,
            flush: None,
        };
        if words > 0 {
            if let Some(g) = self.mem.gdc_alloc(words)? {
                t.gdc = Some(g);
                if cfg.gdr_copy_sync {
                    w.sync = Some(MemRef::at(&g, 0)?);
                    map.mems[Bank::Gdc as usize] = MapMem {
                        size: 8,
                        ..MapMem::of(&g)
                    };
                }
                if dir == Dir::Recv && cfg.gdr_copy_flush {
                    w.flush = Some(MemRef::at(&g, 8)?);
                }
            }
        }
        Ok(w)
    }

    /// Stage 2 of a cross-process connection: every bank in use gets the descriptor the GPU's
    /// process maps it with.
    fn export_banks(
        &mut self,
        map: &mut ConnectMap,
        pool: Option<Region>,
        t: &Taken<N>,
    ) -> Result<()> {
        let banks = [
            (Bank::Host, t.host),
            (Bank::Device, t.dev),
            (Bank::SharedHost, pool),
            (Bank::SharedDevice, pool),
        ];
        for (b, r) in banks {
            let m = &mut map.mems[b as usize];
            if let (Some(r), true) = (r, m.cpu != 0) {
                m.desc = self.mem.export(&r)?.with_bank(b as usize);
            }
        }
        Ok(())
    }

    /// Stage 3: the resources over the allocated memory, with the ring initialised.
    fn bind(
        &mut self,
        dir: Dir,
        req: &SetupReq,
        plan: &Plan,
        words: Words,
        comm: CommRef<N::Send, N::Recv>,
        t: &Taken<N>,
    ) -> Result<Resources<N>> {
        let map = plan.map;
        let host = t.host.ok_or(Error::Missing { what: "host bank" })?;
        let send_mem = MemRef::<SendMem>::at(&host, plan.send_mem.offset() as usize)?;
        let recv_mem = MemRef::<RecvMem>::at(&host, plan.recv_mem.offset() as usize)?;
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
                _ => plan.pool.ok_or(Error::Missing {
                    what: "shared pool",
                })?,
            };
            *b = Some(Buf {
                cpu,
                size: plan.sizes[i],
                dev: item.is_dev(),
                region,
            });
        }
        let res = Resources {
            comm,
            shared_comm: t.shared_comm,
            map,
            host: t.host,
            dev: t.dev,
            gdc: t.gdc,
            pool: t.pool,
            send_mem,
            recv_mem,
            gdc_sync: words.sync,
            gdc_flush: words.flush,
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
        Ok(res)
    }

    /// Stage 4: registers every protocol buffer with the net, as a DMA-BUF when the net, the
    /// config and the memory provider allow (device memory with GPU-direct).
    fn register(
        &mut self,
        req: &SetupReq,
        props: &NetProps,
        res: &mut Resources<N>,
        t: &mut Taken<N>,
    ) -> Result<()> {
        for i in 0..NUM_PROTOCOLS {
            let Some(b) = res.bufs[i] else { continue };
            let ptr = if b.dev {
                PtrType::Device
            } else {
                PtrType::Host
            };
            let mut fd = None;
            if b.dev && req.use_gdr && props.dmabuf && self.cfg.dmabuf {
                let off = (b.cpu - b.region.cpu()) as usize;
                fd = self.mem.dmabuf_fd(&b.region, off, b.size)?;
            }
            let r = self
                .net
                .reg_mr(res.comm, b.cpu, b.size, ptr, fd.map(|fd| (fd, 0)));
            if let Some(fd) = fd {
                self.mem.close_dmabuf(fd);
            }
            let mr = r?;
            t.mhandles[i] = Some(mr);
            res.mhandles[i] = Some(mr);
        }
        Ok(())
    }

    /// Releases what `t` holds, in reverse order of taking; returns the first error.
    pub(super) fn release(&mut self, t: &mut Taken<N>) -> Result<()> {
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
}
