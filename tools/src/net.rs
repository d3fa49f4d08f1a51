//! An NCCL net plugin `.so` as the tools drive it: ibnet-ffi's one loader
//! ([`ibnet_nccl::foreign::ForeignPlugin`]: newest table of v12 … v6, as NCCL 2.30 prefers
//! them) with the tools' types and one-line errors.
//!
//! Every pointer handed to the plugin is either one it gave us (comm, mhandle, request) or
//! memory we own that outlives the call (the `unsafe fn`s say so); every result is checked; a
//! NULL member of the table is an error, not a call.

use core::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};

use ibnet_nccl::foreign::calls::Buf;
use ibnet_nccl::foreign::{CallError, ForeignPlugin, LoadError};
use ibnet_nccl::types::{NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_HOST};

pub use ibnet_nccl::foreign::Version;

use crate::Error;

/// One device's properties, version-independent.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DevProps {
    /// Device name.
    pub name: String,
    /// PCI path (None for virtual devices).
    pub pci_path: Option<String>,
    /// GUID.
    pub guid: u64,
    /// `NCCL_PTR_*` mask.
    pub ptr_support: i32,
    /// Port speed, Mbps.
    pub speed_mbps: i32,
    /// Port number.
    pub port: i32,
    /// Max comms.
    pub max_comms: i32,
    /// Max receives in one multi-receive.
    pub max_recvs: i32,
    /// `regIsGlobal` (false for v6/v7, which have none).
    pub reg_is_global: bool,
    /// The physical devices behind this device, rail order (v9+ `vProps`: one for a plain
    /// device, 2 to 4 for a virtual NIC made by `makeVDevice`, 8 through v12; empty before v9).
    pub rails: Vec<i32>,
    /// v12 `railId` (-1: unset, or a table older than v12).
    pub rail_id: i16,
    /// v12 `planeId` (-1: unset, or a table older than v12).
    pub plane_id: i16,
}

/// A comm or listen comm handed out by the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comm(pub *mut c_void);
/// A memory registration handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr(pub *mut c_void);
/// An outstanding request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req(pub *mut c_void);

/// One receive buffer of a (multi-)receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvSpec {
    /// Address.
    pub data: *mut u8,
    /// Posted size.
    pub size: usize,
    /// Tag.
    pub tag: i32,
    /// Registration.
    pub mr: Mr,
}

/// Most receives in one `irecv` (`NCCL_NET_IB_MAX_RECVS`).
pub const MAX_RECVS: usize = ibnet_nccl::foreign::calls::MAX_RECVS;

/// The `commId` passed to a v11/v12 `init` (any value; NCCL passes its communicator's hash).
const COMM_ID: u64 = 0x1b4e_7065_7266;

/// A loaded plugin.
pub struct Plugin {
    plugin: ForeignPlugin,
    path: PathBuf,
    name: String,
}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        Error(e.to_string())
    }
}

/// A C string the plugin owns, copied.
fn owned(p: *const core::ffi::c_char) -> Option<String> {
    // SAFETY: a non-NULL string pointer in the props is a NUL-terminated string owned by the
    // plugin, valid at least until the next call; it is copied out at once.
    (!p.is_null()).then(|| {
        unsafe { core::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    })
}

impl Plugin {
    /// Opens `path` as NCCL does (`RTLD_NOW | RTLD_LOCAL`) and finds the newest table it exports.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let plugin = ForeignPlugin::open(path).map_err(|e| match e {
            LoadError::NoTable => Error(format!(
                "{} exports none of ncclNetPlugin_v12/v11/v10/v9/v8/v7/v6: not an NCCL net plugin ibnet-perf can drive",
                path.display()
            )),
            LoadError::Dlopen(why) => {
                Error(format!("cannot load plugin {}: {why}", path.display()))
            }
            LoadError::Path => Error(format!("cannot load plugin {}: NUL in path", path.display())),
        })?;
        let name = plugin.name().map_or("(unnamed)".to_string(), |n| {
            n.to_string_lossy().into_owned()
        });
        Ok(Self {
            plugin,
            path: path.to_path_buf(),
            name,
        })
    }

    /// The table's `name` (e.g. `IBNet`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The ABI version found.
    pub fn version(&self) -> Version {
        self.plugin.version()
    }
    /// The file loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Whether this is ibnet's own plugin.
    pub fn is_ibnet(&self) -> bool {
        self.name.eq_ignore_ascii_case("IBNet")
    }

    /// `init` with the stderr logger.
    pub fn init(&mut self) -> Result<(), Error> {
        Ok(self
            .plugin
            .init(Some(crate::log::ibnet_tools_logger), COMM_ID)?)
    }

    /// `finalize` (v11, v12; older versions have none). Idempotent.
    pub fn finalize(&mut self) -> Result<(), Error> {
        Ok(self.plugin.finalize()?)
    }

    /// `devices`.
    pub fn devices(&self) -> Result<i32, Error> {
        Ok(self.plugin.devices()?)
    }

    /// `getProperties(dev)`.
    pub fn properties(&self, dev: i32) -> Result<DevProps, Error> {
        let p = self.plugin.properties(dev)?;
        Ok(DevProps {
            name: owned(p.name).unwrap_or_default(),
            pci_path: owned(p.pci_path),
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed_mbps: p.speed,
            port: p.port,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            reg_is_global: p.reg_is_global,
            rails: p
                .vprops
                .devs
                .iter()
                .take(usize::try_from(p.vprops.ndevs).unwrap_or(0))
                .copied()
                .collect(),
            rail_id: p.rail,
            plane_id: p.plane,
        })
    }

    /// `makeVDevice(devs)` (v9+): the device number of the virtual NIC that fuses `devs`.
    pub fn make_vdevice(&self, devs: &[i32]) -> Result<i32, Error> {
        self.plugin.make_vdevice(devs).map_err(|e| match e {
            CallError::Null { .. } => Error(format!(
                "plugin {} ({}) has no makeVDevice (NCCL net ABI v9 or newer needed to fuse devices)",
                self.name,
                self.version().symbol()
            )),
            e => Error(format!("fusing devices {devs:?}: {e}")),
        })
    }

    /// `listen(dev)`: the connect handle and the listen comm.
    pub fn listen(&self, dev: i32) -> Result<([u8; NCCL_NET_HANDLE_MAXSIZE], Comm), Error> {
        let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        let l = self.plugin.listen(dev, &mut h)?;
        if l.is_null() {
            return Err(Error("plugin listen returned a NULL listen comm".into()));
        }
        Ok((h, Comm(l)))
    }

    /// One `connect` attempt: `Ok(None)` means "call again".
    pub fn connect(
        &self,
        dev: i32,
        handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE],
    ) -> Result<Option<Comm>, Error> {
        Ok(self.plugin.connect(dev, handle)?.map(Comm))
    }

    /// One `accept` attempt: `Ok(None)` means "call again".
    pub fn accept(&self, listen: Comm) -> Result<Option<Comm>, Error> {
        Ok(self.plugin.accept(listen.0)?.map(Comm))
    }

    /// `regMr` of host memory.
    ///
    /// # Safety
    /// `data..data+size` must stay allocated until [`Plugin::dereg_mr`].
    pub unsafe fn reg_mr(&self, comm: Comm, data: *mut u8, size: usize) -> Result<Mr, Error> {
        // SAFETY: the caller's contract.
        let m = unsafe { self.plugin.reg_mr(comm.0, data.cast(), size, NCCL_PTR_HOST) }?;
        Ok(Mr(m))
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: Comm, mr: Mr) -> Result<(), Error> {
        Ok(self.plugin.dereg_mr(comm.0, mr.0)?)
    }

    /// One `isend` attempt: `Ok(None)` means "the receiver is not ready; call again".
    ///
    /// # Safety
    /// `data..data+size` must lie inside the registration `mr` and stay untouched until the
    /// request completes.
    pub unsafe fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Mr,
    ) -> Result<Option<Req>, Error> {
        // SAFETY: the caller's contract.
        let r = unsafe { self.plugin.isend(comm.0, data.cast(), size, tag, mr.0) }?;
        Ok(r.map(Req))
    }

    /// One `irecv` attempt over `bufs` (1..=[`MAX_RECVS`]): `Ok(None)` means "call again".
    ///
    /// # Safety
    /// Every buffer must lie inside its registration and stay untouched until completion.
    pub unsafe fn irecv(&self, comm: Comm, bufs: &[RecvSpec]) -> Result<Option<Req>, Error> {
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error(format!("irecv of {n} buffers (1..={MAX_RECVS})")));
        }
        let mut b = [Buf {
            data: core::ptr::null_mut(),
            size: 0,
            tag: 0,
            mh: core::ptr::null_mut(),
        }; MAX_RECVS];
        for (o, s) in b.iter_mut().zip(bufs) {
            *o = Buf {
                data: s.data.cast(),
                size: s.size,
                tag: s.tag as c_int,
                mh: s.mr.0,
            };
        }
        // SAFETY: the caller's contract.
        let r = unsafe { self.plugin.irecv(comm.0, &b[..n]) }?;
        Ok(r.map(Req))
    }

    /// `test`: `Ok(Some(sizes))` once done (the request is then freed by the plugin).
    pub fn test(&self, req: Req) -> Result<Option<[i32; MAX_RECVS]>, Error> {
        Ok(self.plugin.test(req.0)?)
    }

    /// `closeSend`.
    pub fn close_send(&self, c: Comm) -> Result<(), Error> {
        Ok(self.plugin.close_send(c.0)?)
    }
    /// `closeRecv`.
    pub fn close_recv(&self, c: Comm) -> Result<(), Error> {
        Ok(self.plugin.close_recv(c.0)?)
    }
    /// `closeListen`.
    pub fn close_listen(&self, c: Comm) -> Result<(), Error> {
        Ok(self.plugin.close_listen(c.0)?)
    }
}
