//! The `Net` trait: the plugin operations the engine drives.
//!
//! This is `ncclNet_t` as the engine uses it: connection setup (`listen` / `connect` /
//! `accept`), memory registration, the non-blocking data operations and their `test`, and the
//! property the engine groups receives by (`max_recvs`). Handles are small `Copy` values (a C
//! plugin's `void*`, or an index for `ibnet_testkit::InProcessNet`), so the engine stores them freely.
//!
//! Contract (NCCL's):
//! * `connect` / `accept` / `isend` / `irecv` may return `Ok(None)`: "not yet, call again".
//! * `test(req)` returns `true` once `req` is complete, writing the bytes received per buffer
//!   into `sizes` (receives) or the bytes sent into `sizes[0]` (sends); a completed request is
//!   gone.
//! * `iflush` may return `Ok(None)` when there is nothing to flush.
//!
//! Simplification for Rust drivers: the engine never calls `getProperties` for anything but
//! [`NetProps`], never asks for device handles (`ncclNetDeviceHandle`, the unpack path) and
//! passes DMA-BUF registrations as an optional `(fd, offset)`.

use super::MAX_RECVS;
use ibnet_core::error::Result;

/// The opaque connection handle `listen` produces and `connect` consumes
/// (`NCCL_NET_HANDLE_MAXSIZE`).
pub type NetHandle = [u8; 128];

/// What a buffer's address points to (`NCCL_PTR_HOST` / `NCCL_PTR_CUDA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtrType {
    /// Host memory.
    Host,
    /// Device memory.
    Device,
}

/// How a multi-receive (`n > 1`) reports sizes in `test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeReport {
    /// Bytes received per buffer (ibnet's comms, and NCCL's IB plugin since 2.19, whose
    /// sender writes them into the receiver's sizes FIFO).
    Bytes,
    /// 1 when the matching send carried data, 0 when it was empty (NCCL's IB plugin before
    /// 2.19, with a bitmask immediate). The engine substitutes the size it posted for any
    /// non-zero value, so this mode is also safe, if coarse, over a plugin that reports bytes.
    Flags,
}

/// The properties of a device the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetProps {
    /// Receives one `irecv` may group (1..=8).
    pub max_recvs: usize,
    /// DMA-BUF registration is supported (`NCCL_PTR_DMABUF` in `ptrSupport`).
    pub dmabuf: bool,
    /// How multi-receive sizes are reported.
    pub sizes: SizeReport,
}

/// A comm of either direction (for `reg_mr`, `dereg_mr` and `test`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommRef<S, R> {
    /// A send comm.
    Send(S),
    /// A receive comm.
    Recv(R),
}

/// One buffer of an `irecv` or `iflush`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetBuf<M> {
    /// Address.
    pub addr: u64,
    /// Bytes (for `irecv`, the largest send accepted).
    pub size: usize,
    /// Tag the matching send carries.
    pub tag: u32,
    /// Registration covering the buffer.
    pub mr: M,
}

/// The plugin operations the engine drives.
pub trait Net {
    /// A listening endpoint.
    type Listen: Copy;
    /// A send comm.
    type Send: Copy + PartialEq;
    /// A receive comm.
    type Recv: Copy + PartialEq;
    /// A memory registration (`mhandle`).
    type Mr: Copy;
    /// An outstanding request.
    type Req: Copy;

    /// Whether [`Net::irecv_consumed`] does anything. `false` lets the engine skip handing
    /// completed receives back one by one (a plain receive's retire run becomes one count).
    /// Default `true`; a net that overrides `irecv_consumed` keeps it `true`.
    const IRECV_CONSUMED: bool = true;

    /// The properties of device `dev`.
    fn properties(&mut self, dev: u32) -> Result<NetProps>;
    /// Starts listening on `dev`; writes the handle the connecting side needs into `handle`.
    fn listen(&mut self, dev: u32, handle: &mut NetHandle) -> Result<Self::Listen>;
    /// Connects to the listener `handle` describes; `Ok(None)` while in progress.
    fn connect(&mut self, dev: u32, handle: &NetHandle) -> Result<Option<Self::Send>>;
    /// Accepts a connection on `listen`; `Ok(None)` while in progress.
    fn accept(&mut self, listen: Self::Listen) -> Result<Option<Self::Recv>>;
    /// Registers `[addr, addr + size)` for `comm`; `dmabuf` is `(fd, offset)` when the memory
    /// is exported as a DMA-BUF.
    fn reg_mr(
        &mut self,
        comm: CommRef<Self::Send, Self::Recv>,
        addr: u64,
        size: usize,
        ptr: PtrType,
        dmabuf: Option<(i32, u64)>,
    ) -> Result<Self::Mr>;
    /// Deregisters.
    fn dereg_mr(&mut self, comm: CommRef<Self::Send, Self::Recv>, mr: Self::Mr) -> Result<()>;
    /// Sends `size` bytes at `addr` with `tag`; `Ok(None)` when the receiver has not posted yet.
    fn isend(
        &mut self,
        comm: Self::Send,
        addr: u64,
        size: usize,
        tag: u32,
        mr: Self::Mr,
    ) -> Result<Option<Self::Req>>;
    /// A hint before [`Net::isend`]: `false` only when an `isend` on `comm` now could not
    /// send because the receiver has not posted its receive yet (the engine then skips the
    /// call). The default, `true`, always calls `isend`.
    #[inline(always)]
    fn send_ready(&mut self, comm: Self::Send) -> bool {
        let _ = comm;
        true
    }
    /// Posts a (multi-)receive of 1..=`max_recvs` buffers; `Ok(None)`: try again later.
    fn irecv(&mut self, comm: Self::Recv, bufs: &[NetBuf<Self::Mr>]) -> Result<Option<Self::Req>>;
    /// Flushes received data to the GPU; `Ok(None)` when there is nothing to flush.
    fn iflush(&mut self, comm: Self::Recv, bufs: &[NetBuf<Self::Mr>]) -> Result<Option<Self::Req>>;
    /// Whether `req` is complete; see the module doc for `sizes`.
    fn test(
        &mut self,
        comm: CommRef<Self::Send, Self::Recv>,
        req: Self::Req,
        sizes: &mut [usize; MAX_RECVS],
    ) -> Result<bool>;
    /// [`Net::test`] of a send request, without the byte count (which a send through the
    /// connection's own buffer does not need). A net may answer it with less work than `test`;
    /// the default asks `test`.
    #[inline(always)]
    fn test_send(&mut self, comm: Self::Send, req: Self::Req) -> Result<bool> {
        let mut sizes = [0usize; MAX_RECVS];
        self.test(CommRef::Send(comm), req, &mut sizes)
    }
    /// [`Net::test`] of a receive of one buffer: `Some(bytes received)` once complete. A net
    /// may answer it with less work than `test`; the default asks `test`.
    #[inline(always)]
    fn test_recv1(&mut self, comm: Self::Recv, req: Self::Req) -> Result<Option<usize>> {
        let mut sizes = [0usize; MAX_RECVS];
        Ok(self
            .test(CommRef::Recv(comm), req, &mut sizes)?
            .then_some(sizes[0]))
    }
    /// The GPU consumed the data of a completed multi-receive (NCCL's optional
    /// `irecvConsumed`).
    fn irecv_consumed(&mut self, comm: Self::Recv, n: usize, req: Self::Req) -> Result<()> {
        let _ = (comm, n, req);
        Ok(())
    }
    /// Closes a send comm.
    fn close_send(&mut self, comm: Self::Send) -> Result<()>;
    /// Closes a receive comm.
    fn close_recv(&mut self, comm: Self::Recv) -> Result<()>;
    /// Closes a listening endpoint.
    fn close_listen(&mut self, listen: Self::Listen) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibnet_core::error::Error;

    /// A net whose only working operation is `test`: request 1 is done (sizes 8, 9), request 2
    /// is pending, request 3 fails; it records which comm `test` was asked about.
    struct TestOnly(Option<CommRef<u8, u8>>);

    impl Net for TestOnly {
        type Listen = u8;
        type Send = u8;
        type Recv = u8;
        type Mr = u8;
        type Req = u8;

        fn properties(&mut self, _: u32) -> Result<NetProps> {
            Err(Error::Missing { what: "test" })
        }
        fn listen(&mut self, _: u32, _: &mut NetHandle) -> Result<u8> {
            Err(Error::Missing { what: "test" })
        }
        fn connect(&mut self, _: u32, _: &NetHandle) -> Result<Option<u8>> {
            Err(Error::Missing { what: "test" })
        }
        fn accept(&mut self, _: u8) -> Result<Option<u8>> {
            Err(Error::Missing { what: "test" })
        }
        fn reg_mr(
            &mut self,
            _: CommRef<u8, u8>,
            _: u64,
            _: usize,
            _: PtrType,
            _: Option<(i32, u64)>,
        ) -> Result<u8> {
            Err(Error::Missing { what: "test" })
        }
        fn dereg_mr(&mut self, _: CommRef<u8, u8>, _: u8) -> Result<()> {
            Err(Error::Missing { what: "test" })
        }
        fn isend(&mut self, _: u8, _: u64, _: usize, _: u32, _: u8) -> Result<Option<u8>> {
            Err(Error::Missing { what: "test" })
        }
        fn irecv(&mut self, _: u8, _: &[NetBuf<u8>]) -> Result<Option<u8>> {
            Err(Error::Missing { what: "test" })
        }
        fn iflush(&mut self, _: u8, _: &[NetBuf<u8>]) -> Result<Option<u8>> {
            Err(Error::Missing { what: "test" })
        }
        fn test(
            &mut self,
            comm: CommRef<u8, u8>,
            req: u8,
            sizes: &mut [usize; MAX_RECVS],
        ) -> Result<bool> {
            self.0 = Some(comm);
            match req {
                1 => {
                    sizes[0] = 8;
                    sizes[1] = 9;
                    Ok(true)
                }
                2 => Ok(false),
                _ => Err(Error::Missing { what: "request" }),
            }
        }
        fn close_send(&mut self, _: u8) -> Result<()> {
            Ok(())
        }
        fn close_recv(&mut self, _: u8) -> Result<()> {
            Ok(())
        }
        fn close_listen(&mut self, _: u8) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn default_test_send_and_test_recv1_ask_test() {
        let mut n = TestOnly(None);
        assert!(n.test_send(4, 1).unwrap());
        assert_eq!(n.0, Some(CommRef::Send(4)));
        assert!(!n.test_send(4, 2).unwrap());
        assert!(matches!(n.test_send(4, 3), Err(Error::Missing { .. })));
        assert_eq!(n.test_recv1(5, 1).unwrap(), Some(8));
        assert_eq!(n.0, Some(CommRef::Recv(5)));
        assert_eq!(n.test_recv1(5, 2).unwrap(), None);
        assert!(matches!(n.test_recv1(5, 3), Err(Error::Missing { .. })));
    }
}
