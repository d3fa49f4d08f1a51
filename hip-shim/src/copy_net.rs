//! A loopback [`Net`] that moves bytes with a copy function (the driver's `cuMemcpy*` in the
//! GPU probe): a stand-in for a GPU-direct NIC, so the proxy engine can run with its banks in
//! GPU memory on a machine without RDMA.
//!
//! ```text
//!  listen ─▶ pair id in the handle; connect(handle) = Send(pair); accept = Recv(pair)
//!  isend / irecv queue; a receive matches the oldest send of its pair with its tag, the copy
//!  runs at once (device or host per registration), both requests complete with the size
//! ```
//! One receive per `irecv` (`max_recvs` 1); `iflush` has nothing to flush. Not for the data
//! path of anything but probes and tests (it allocates on every operation).

use std::collections::{HashMap, VecDeque};

use ibnet_core::{Error, Result};
use ibnet_proxy::MAX_RECVS;
use ibnet_proxy::{CommRef, Net, NetBuf, NetHandle, NetProps, PtrType, SizeReport};

/// `copy(dst, dst_is_device, src, src_is_device, len)`.
pub type CopyFn<'a> = Box<dyn FnMut(u64, bool, u64, bool, usize) -> Result<()> + 'a>;

struct PendingSend {
    req: u64,
    addr: u64,
    dev: bool,
    size: usize,
    tag: u32,
}

struct PendingRecv {
    req: u64,
    addr: u64,
    dev: bool,
    size: usize,
    tag: u32,
}

/// The loopback net (see the module doc).
pub struct CopyNet<'a> {
    copy: CopyFn<'a>,
    pairs: u32,
    mrs: Vec<bool>,
    sends: HashMap<u32, VecDeque<PendingSend>>,
    recvs: HashMap<u32, VecDeque<PendingRecv>>,
    done: HashMap<u64, usize>,
    next_req: u64,
    /// Bytes copied so far.
    pub copied: u64,
}

impl<'a> CopyNet<'a> {
    /// A net copying with `copy`.
    pub fn new(copy: CopyFn<'a>) -> Self {
        Self {
            copy,
            pairs: 0,
            mrs: Vec::new(),
            sends: HashMap::new(),
            recvs: HashMap::new(),
            done: HashMap::new(),
            next_req: 1,
            copied: 0,
        }
    }

    fn req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    fn dev(&self, mr: u32) -> Result<bool> {
        self.mrs.get(mr as usize).copied().ok_or(Error::Missing {
            what: "registration",
        })
    }

    /// Runs every match of pair `p`.
    fn progress(&mut self, p: u32) -> Result<()> {
        loop {
            let (Some(rq), Some(sq)) = (self.recvs.get_mut(&p), self.sends.get_mut(&p)) else {
                return Ok(());
            };
            let Some(r) = rq.front() else { return Ok(()) };
            let Some(i) = sq.iter().position(|s| s.tag == r.tag) else {
                return Ok(());
            };
            let s = sq.remove(i).ok_or(Error::Missing { what: "send" })?;
            let r = rq.pop_front().ok_or(Error::Missing { what: "receive" })?;
            if s.size > r.size {
                return Err(Error::OutOfRange {
                    what: "send larger than its receive",
                    value: s.size as i64,
                    min: 0,
                    max: r.size as i64,
                });
            }
            if s.size > 0 {
                (self.copy)(r.addr, r.dev, s.addr, s.dev, s.size)?;
            }
            self.copied += s.size as u64;
            self.done.insert(s.req, s.size);
            self.done.insert(r.req, s.size);
        }
    }
}

impl Net for CopyNet<'_> {
    type Listen = u32;
    type Send = u32;
    type Recv = u32;
    type Mr = u32;
    type Req = u64;

    fn properties(&mut self, _dev: u32) -> Result<NetProps> {
        Ok(NetProps {
            max_recvs: 1,
            dmabuf: false,
            sizes: SizeReport::Bytes,
        })
    }
    fn listen(&mut self, _dev: u32, handle: &mut NetHandle) -> Result<u32> {
        self.pairs += 1;
        handle[..4].copy_from_slice(&self.pairs.to_le_bytes());
        Ok(self.pairs)
    }
    fn connect(&mut self, _dev: u32, handle: &NetHandle) -> Result<Option<u32>> {
        let p = u32::from_le_bytes([handle[0], handle[1], handle[2], handle[3]]);
        if p == 0 || p > self.pairs {
            return Err(Error::Missing { what: "listener" });
        }
        Ok(Some(p))
    }
    fn accept(&mut self, listen: u32) -> Result<Option<u32>> {
        Ok(Some(listen))
    }
    fn reg_mr(
        &mut self,
        _comm: CommRef<u32, u32>,
        _addr: u64,
        _size: usize,
        ptr: PtrType,
        _dmabuf: Option<(i32, u64)>,
    ) -> Result<u32> {
        self.mrs.push(ptr == PtrType::Device);
        Ok(self.mrs.len() as u32 - 1)
    }
    fn dereg_mr(&mut self, _comm: CommRef<u32, u32>, mr: u32) -> Result<()> {
        self.dev(mr).map(|_| ())
    }
    fn isend(
        &mut self,
        comm: u32,
        addr: u64,
        size: usize,
        tag: u32,
        mr: u32,
    ) -> Result<Option<u64>> {
        let dev = self.dev(mr)?;
        let req = self.req();
        self.sends.entry(comm).or_default().push_back(PendingSend {
            req,
            addr,
            dev,
            size,
            tag,
        });
        self.progress(comm)?;
        Ok(Some(req))
    }
    fn irecv(&mut self, comm: u32, bufs: &[NetBuf<u32>]) -> Result<Option<u64>> {
        let [b] = bufs else {
            return Err(Error::OutOfRange {
                what: "receives in one irecv of the copy net",
                value: bufs.len() as i64,
                min: 1,
                max: 1,
            });
        };
        let dev = self.dev(b.mr)?;
        let req = self.req();
        self.recvs.entry(comm).or_default().push_back(PendingRecv {
            req,
            addr: b.addr,
            dev,
            size: b.size,
            tag: b.tag,
        });
        self.progress(comm)?;
        Ok(Some(req))
    }
    fn iflush(&mut self, _comm: u32, _bufs: &[NetBuf<u32>]) -> Result<Option<u64>> {
        Ok(None)
    }
    fn test(
        &mut self,
        _comm: CommRef<u32, u32>,
        req: u64,
        sizes: &mut [usize; MAX_RECVS],
    ) -> Result<bool> {
        match self.done.remove(&req) {
            Some(n) => {
                sizes[0] = n;
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn close_send(&mut self, _comm: u32) -> Result<()> {
        Ok(())
    }
    fn close_recv(&mut self, _comm: u32) -> Result<()> {
        Ok(())
    }
    fn close_listen(&mut self, _listen: u32) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_by_tag_in_order_and_copies() {
        let log = std::cell::RefCell::new(Vec::new());
        let mut n = CopyNet::new(Box::new(|d, dd, s, sd, len| {
            log.borrow_mut().push((d, dd, s, sd, len));
            Ok(())
        }));
        let mut h = [0u8; 128];
        let l = n.listen(0, &mut h).unwrap();
        let s = n.connect(0, &h).unwrap().unwrap();
        let r = n.accept(l).unwrap().unwrap();
        let smr = n
            .reg_mr(CommRef::Send(s), 0x1000, 64, PtrType::Device, None)
            .unwrap();
        let rmr = n
            .reg_mr(CommRef::Recv(r), 0x9000, 64, PtrType::Host, None)
            .unwrap();
        let a = n.isend(s, 0x1000, 10, 7, smr).unwrap().unwrap();
        let b = n.isend(s, 0x1010, 20, 8, smr).unwrap().unwrap();
        let mut sizes = [0; MAX_RECVS];
        assert!(
            !n.test(CommRef::Send(s), a, &mut sizes).unwrap(),
            "no receive yet"
        );
        let buf = |tag| NetBuf {
            addr: 0x9000,
            size: 64,
            tag,
            mr: rmr,
        };
        let q = n.irecv(r, &[buf(8)]).unwrap().unwrap();
        assert!(n.test(CommRef::Recv(r), q, &mut sizes).unwrap());
        assert_eq!(sizes[0], 20, "matched by tag");
        assert!(n.test(CommRef::Send(s), b, &mut sizes).unwrap());
        assert_eq!(log.borrow()[0], (0x9000, false, 0x1010, true, 20));
        let big = NetBuf { size: 5, ..buf(7) };
        assert!(n.irecv(r, &[big]).is_err(), "send larger than the receive");
        assert!(n.connect(0, &[0; 128]).is_err());
        assert!(n.irecv(r, &[buf(1), buf(2)]).is_err());
    }
}
