//! The control channel between driver and responder: one TCP stream carrying newline-delimited
//! JSON [`Msg`]s (configuration, connect handles, per-size steps and results). Never data.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sweep::{RunConfig, Step};
use crate::Error;

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

/// One end of the control stream.
pub struct Ctrl {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Ctrl {
    /// Wraps a connected stream; `timeout` bounds every receive.
    pub fn new(s: TcpStream, timeout: Duration) -> Result<Self, Error> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        Ok(Self {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    /// Sends one message.
    pub fn send(&mut self, m: &Msg) -> Result<(), Error> {
        let mut line = serde_json::to_vec(m)?;
        line.push(b'\n');
        self.w
            .write_all(&line)
            .map_err(|e| Error(format!("control connection to the peer lost: {e}")))
    }

    /// Receives one message; a `Fail` from the peer becomes an error.
    pub fn recv(&mut self) -> Result<Msg, Error> {
        let mut line = String::new();
        let n = self
            .r
            .read_line(&mut line)
            .map_err(|e| Error(format!("no answer from the peer: {e}")))?;
        if n == 0 {
            return Err(Error("the peer closed the control connection".into()));
        }
        match serde_json::from_str(&line)? {
            Msg::Fail(why) => Err(Error(format!("peer: {why}"))),
            m => Ok(m),
        }
    }
}
