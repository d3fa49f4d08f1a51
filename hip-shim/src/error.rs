//! The one error type of `ibnet-hip`.
//!
//! Every fallible call returns [`Error`]; each variant names what failed and carries enough
//! context for a log line. Nothing in this crate panics on bad input or missing libraries.

use std::fmt;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong in a GPU-runtime call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No usable GPU runtime was found; `reason` says what was tried and why each attempt failed.
    NotPresent {
        /// Human-readable account of every library or call that was tried.
        reason: String,
    },
    /// A library loaded but lacks a required symbol.
    MissingSymbol {
        /// Library file name.
        lib: &'static str,
        /// The symbol that was looked up.
        symbol: &'static str,
    },
    /// A driver/runtime call returned a non-success status.
    Call {
        /// The C function that failed.
        call: &'static str,
        /// Its raw status code (`CUresult`, `hipError_t` or `hsa_status_t`).
        code: i32,
        /// The runtime's name for the code, if it could be looked up.
        name: String,
    },
    /// An argument was rejected before any runtime call was made.
    InvalidArgument {
        /// What was wrong.
        what: &'static str,
    },
    /// The operation is not available with this runtime, driver or kernel.
    Unsupported {
        /// Why.
        what: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPresent { reason } => write!(f, "no GPU runtime: {reason}"),
            Self::MissingSymbol { lib, symbol } => write!(f, "{lib} lacks symbol {symbol}"),
            Self::Call { call, code, name } if name.is_empty() => {
                write!(f, "{call} failed (status {code})")
            }
            Self::Call { call, code, name } => write!(f, "{call} failed (status {code}, {name})"),
            Self::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            Self::Unsupported { what } => write!(f, "unsupported: {what}"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_call_and_code() {
        let e = Error::Call {
            call: "cuInit",
            code: 100,
            name: "CUDA_ERROR_NO_DEVICE".into(),
        };
        assert_eq!(
            e.to_string(),
            "cuInit failed (status 100, CUDA_ERROR_NO_DEVICE)"
        );
        let e = Error::Call {
            call: "hipFree",
            code: 1,
            name: String::new(),
        };
        assert_eq!(e.to_string(), "hipFree failed (status 1)");
        let e = Error::MissingSymbol {
            lib: "libcuda.so.1",
            symbol: "cuInit",
        };
        assert_eq!(e.to_string(), "libcuda.so.1 lacks symbol cuInit");
    }
}
