//! The proxy-engine rig shared by the `proxy` bench and the `callgrind` counts: the bare comms
//! with the engine's pipelining depth, and the engine with an inline "GPU" on both sides (see
//! `benches/proxy.rs` for what each measures).

use ibnet_core::comm::{CommConfig, RecvBuf, RecvComm, SendComm};
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::request::ReqId;
use ibnet_proxy::{
    ConnId, DeviceRecv, DeviceSend, DeviceView, Dir, MemKind, MemProvider, Protocol, ProxyConfig,
    ProxyOp, ProxyState, Region, SetupReq, SubArgs, STEPS,
};
use ibnet_testkit::proxy::HostMem;
use ibnet_testkit::{connect_pair, InProcessNet};

/// Messages (steps) per batch.
pub const MSGS: u64 = 64;

/// Writes every page of `[addr, addr + len)` (see the module doc).
pub fn touch(addr: u64, len: usize) {
    // SAFETY: callers pass live, writable buffers that nothing else uses yet.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0x5a, len) };
}

/// The bare comms with the engine's depth: up to `STEPS` receives and sends in flight.
pub struct Bare<P: Provider + Clone> {
    dev: P,
    s: SendComm<P>,
    r: RecvComm<P>,
    src: Region,
    dst: Region,
    mem: HostMem,
    mrs: Option<(P::Mr, P::Mr)>,
    keys: (MrKeys, MrKeys),
    size: usize,
    /// Bytes between two slots: the engine's step size (its SIMPLE buffer / `STEPS`).
    stride: u64,
}

impl<P: Provider + Clone> Bare<P> {
    /// A connected pair moving `size`-byte messages.
    pub fn new(dev: &P, size: usize) -> Self {
        let (s, r) = connect_pair(dev, CommConfig::default()).expect("connect");
        // The same allocator as the engine's buffers (same alignment and placement).
        // The engine's SIMPLE buffer (see `Engine::new`), cut into `STEPS` slots as the engine
        // cuts it: the same addresses, so the same cache sets, as the engine's steps.
        let stride = size.max(4096);
        let slots = STEPS * stride;
        let mut mem = HostMem::default();
        let src = mem.alloc(MemKind::Host, slots).expect("alloc");
        let dst = mem.alloc(MemKind::Host, slots).expect("alloc");
        touch(src.cpu(), slots);
        touch(dst.cpu(), slots);
        let reg = |a| {
            dev.reg_mr(a, slots as u64, Access::ALL, RegKind::Plain)
                .expect("reg")
        };
        let (sm, rm) = (reg(src.cpu()), reg(dst.cpu()));
        let keys = (dev.mr_keys(&sm), dev.mr_keys(&rm));
        Self {
            dev: dev.clone(),
            s,
            r,
            src,
            dst,
            mem,
            mrs: Some((sm, rm)),
            keys,
            size,
            stride: stride as u64,
        }
    }

    /// [`MSGS`] messages.
    pub fn batch(&mut self) {
        let (size, stride) = (self.size as u64, self.stride);
        let (sk, rk) = self.keys;
        let mut sids = [None::<ReqId>; STEPS];
        let mut rids = [None::<ReqId>; STEPS];
        let (mut posted, mut sent, mut sdone, mut rdone) = (0u64, 0u64, 0u64, 0u64);
        while sdone < MSGS || rdone < MSGS {
            while posted < MSGS && posted < rdone + STEPS as u64 {
                let off = (posted % STEPS as u64) * stride;
                let buf = [RecvBuf {
                    addr: self.dst.cpu() + off,
                    size,
                    tag: 1,
                    mr: rk,
                }];
                match self.r.irecv(&buf).expect("irecv") {
                    Some(id) => rids[(posted % STEPS as u64) as usize] = Some(id),
                    None => break,
                }
                posted += 1;
            }
            while sent < posted && sent < sdone + STEPS as u64 {
                let off = (sent % STEPS as u64) * stride;
                match self
                    .s
                    .isend(self.src.cpu() + off, size, 1, sk)
                    .expect("isend")
                {
                    Some(id) => sids[(sent % STEPS as u64) as usize] = Some(id),
                    None => break,
                }
                sent += 1;
            }
            while sdone < sent {
                let i = (sdone % STEPS as u64) as usize;
                if self.s.test(sids[i].expect("sent")).expect("test").is_none() {
                    break;
                }
                sdone += 1;
            }
            while rdone < sent {
                let i = (rdone % STEPS as u64) as usize;
                if self
                    .r
                    .test(rids[i].expect("posted"))
                    .expect("test")
                    .is_none()
                {
                    break;
                }
                rdone += 1;
            }
        }
    }
}

impl<P: Provider + Clone> Drop for Bare<P> {
    fn drop(&mut self) {
        if let Some((a, b)) = self.mrs.take() {
            let _ = self.dev.dereg_mr(a);
            let _ = self.dev.dereg_mr(b);
        }
        let _ = self.mem.free(self.src);
        let _ = self.mem.free(self.dst);
    }
}

type Px<P> = ProxyState<InProcessNet<P, 2>, HostMem, 4>;

/// One send and one receive connection of an engine, with an inline "GPU" on each side.
pub struct Engine<P: Provider + Clone> {
    px: Px<P>,
    sc: ConnId,
    rc: ConnId,
    /// What each side's "GPU" was given at connect (a kernel gets its view once, not per op).
    views: (DeviceView, DeviceView),
    k_send: u64,
    k_recv: u64,
    size: usize,
}

impl<P: Provider + Clone> Engine<P> {
    /// An engine with one send and one receive connection for `size`-byte steps.
    pub fn new(dev: &P, size: usize) -> Self {
        let net = InProcessNet::new(dev.clone(), CommConfig::default());
        let cfg = ProxyConfig {
            buff_sizes: [STEPS * 4096, STEPS * 4096, STEPS * size.max(4096)],
            ..ProxyConfig::default()
        };
        let mut px = Px::new(net, HostMem::default(), cfg);
        let req = SetupReq {
            tp_rank: 1,
            tp_remote_rank: 1,
            ..SetupReq::default()
        };
        let (r, h) = px.setup(Dir::Recv, req).expect("setup");
        let (s, _) = px.setup(Dir::Send, req).expect("setup");
        let h = h.expect("handle");
        let (mut sd, mut rd) = (false, false);
        while !(sd && rd) {
            sd = sd || px.connect_send(s, &h).expect("connect").is_some();
            rd = rd || px.connect_recv(r, 0).expect("accept").is_some();
        }
        let views = (
            px.device_view(s).expect("view"),
            px.device_view(r).expect("view"),
        );
        for v in [views.0, views.1] {
            let p = Protocol::Simple.index();
            touch(v.buffs[p], v.buff_sizes[p]);
        }
        Self {
            px,
            sc: s,
            rc: r,
            views,
            k_send: 0,
            k_recv: 0,
            size,
        }
    }

    /// One send and one receive op of [`MSGS`] steps.
    pub fn batch(&mut self) {
        let size = self.size;
        // SAFETY: both connections stay connected while `self` lives.
        let gs = unsafe { DeviceSend::from_view(&self.views.0) }.expect("send view");
        // SAFETY: as above.
        let gr = unsafe { DeviceRecv::from_view(&self.views.1) }.expect("recv view");
        let mut so = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1).expect("op");
        let mut ro = ProxyOp::new(Dir::Recv, Protocol::Simple, 1, 1).expect("op");
        so.push(SubArgs::new(self.sc, MSGS, size * MSGS as usize))
            .expect("sub");
        ro.push(SubArgs::new(self.rc, MSGS, size * MSGS as usize))
            .expect("sub");
        // The GPUs' step counters in locals (in `self` they were reloaded after every store to
        // the shared words, which might alias them as far as the compiler knows).
        let (mut k_send, mut k_recv) = (self.k_send, self.k_recv);
        let end = k_send + MSGS;
        let (mut sd, mut rd) = (false, false);
        while !(sd && rd) {
            // The sending GPU: publish every credited step (the credit bound read once per
            // run, as a kernel keeps it until it used it up), then `tail` once for the run
            // (its Release covers every size before it).
            let credit = gs.credit_end().min(end);
            if k_send < credit {
                for k in k_send..credit {
                    gs.publish(k, size as u64);
                }
                k_send = credit;
                gs.advance(k_send);
            }
            sd = sd || self.px.progress(&mut so).expect("send").done;
            rd = rd || self.px.progress(&mut ro).expect("recv").done;
            // The receiving GPU: consume every landed step (`tail` read once per run), handing
            // the run's slots back with one `head` store.
            let landed = gr.landed_end();
            if k_recv < landed {
                k_recv = landed;
                gr.consume(k_recv);
            }
        }
        (self.k_send, self.k_recv) = (k_send, k_recv);
    }
}

impl<P: Provider + Clone> Drop for Engine<P> {
    fn drop(&mut self) {
        let _ = self.px.free(self.sc);
        let _ = self.px.free(self.rc);
    }
}
