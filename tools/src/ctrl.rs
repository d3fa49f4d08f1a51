//! The control channel between driver and responder: one TCP stream carrying newline-delimited
//! JSON [`Msg`]s (configuration, connect handles, per-size steps and results). Never data.

use serde::{Deserialize, Serialize};

use crate::jsonlink::{ControlMsg, JsonLink};
use crate::sweep::{RunConfig, Step};

/// A control message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    /// Driver → responder: the run's configuration.
    Hello(RunConfig),
    /// Responder → driver: what it loaded (plugin name, device name).
    Info {
        /// Plugin table name.
        plugin: String,
        /// Device name.
        device: String,
    },
    /// The sender's 128-byte connect handle.
    Handle(Vec<u8>),
    /// Driver → responder: run one size.
    Step(Step),
    /// Responder → driver: buffers registered.
    Ready,
    /// Responder → driver: the size is done; messages that failed verification.
    Done {
        /// Bad messages (wrong size or content).
        bad: u64,
        /// The first failure, described.
        first: Option<String>,
    },
    /// Driver → responder: finished.
    Bye,
    /// Either side: fatal error, described.
    Fail(String),
}

impl ControlMsg for Msg {
    fn failure(&self) -> Option<&str> {
        match self {
            Msg::Fail(why) => Some(why),
            _ => None,
        }
    }
}

/// One end of the control stream.
pub type Ctrl = JsonLink<Msg>;
