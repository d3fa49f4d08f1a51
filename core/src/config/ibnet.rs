//! ibnet's own `IBNET_*` variables: the plugin's knobs (stored in `Params`), the libibverbs
//! loader's, the logger's and the tools'.

use super::var::Kind::{Flag, Int, Path, Word};
use super::var::Reader::{Loader, Log, Tools};
use super::var::Since::Ibnet;
use super::var::Var;

/// ibnet's own variables, in README's order.
pub const VARS: &[Var] = &[
    Var::new(
        "IBNET_PROVIDER",
        Word(&["auto", "verbs", "soft"]),
        "auto",
        Ibnet,
        "`auto` (verbs devices, never soft), `verbs`, `soft` (same-host software RDMA)",
    ),
    Var::new(
        "IBNET_HANDSHAKE_TIMEOUT",
        Int { min: 1, max: 86_400 },
        "60",
        Ibnet,
        "seconds a connect/accept handshake may stall",
    ),
    Var::new(
        "IBNET_STALL_WARN",
        Int { min: 0, max: 86_400 * 365 },
        "60",
        Ibnet,
        "seconds `isend`/`test` may wait on a live peer before one WARN names it (socket address, GID, comm, tag, what is awaited); 0: never. A stall is not an error. A dead peer (its bootstrap socket closed, or silent for 25 s: TCP keepalive 10 s idle + 3 × 5 s probes) is an error on the next call that waits",
    ),
    Var::new(
        "IBNET_FORCE_FLUSH",
        Int { min: 0, max: 1 },
        "0",
        Ibnet,
        "test/diagnosis: flush host-memory receives with the RDMA READ too",
    ),
    Var::new(
        "IBNET_FAULT_RO_EINVAL",
        Int { min: 0, max: 1 },
        "0",
        Ibnet,
        "tests only: act as if relaxed-ordering registration were refused (EINVAL)",
    ),
    Var::new(
        "IBNET_FAULT_MQP_ETIMEDOUT",
        Int { min: 0, max: 1000 },
        "0",
        Ibnet,
        "tests only: the first N `ibv_modify_qp` calls of each process fail with ETIMEDOUT",
    ),
    Var::new(
        "IBNET_IBVERBS_PATH",
        Path,
        "",
        Ibnet,
        "the libibverbs to `dlopen`; when set, the only one tried (and it wins over `NCCL_IBVERBS_LIB`): unlike `NCCL_IBVERBS_LIB`, one that cannot be loaded is never replaced by the system's; it is one WARN and 0 verbs devices",
    )
    .shown("`libibverbs.so.1`, then `libibverbs.so`")
    .by(Loader),
    Var::new(
        "IBNET_LOG_STDERR",
        Flag,
        "0",
        Ibnet,
        "non-zero: log to stderr when NCCL gave no logger; malformed: one WARN (through NCCL's logger at plugin creation, else once on stderr) and off",
    )
    .by(Log),
    Var::new(
        "IBNET_PLUGIN",
        Path,
        "",
        Ibnet,
        "ibnet-perf/ibnet-info/ibnet-soak: default plugin file",
    )
    .shown("next to the binary")
    .by(Tools),
    Var::new(
        "IBNET_FONT",
        Path,
        "",
        Ibnet,
        "ibnet-perf `--png`: TrueType font file",
    )
    .shown("DejaVu Sans")
    .by(Tools),
];
