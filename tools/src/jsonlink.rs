//! A control link: one TCP stream carrying newline-delimited JSON messages, shared by
//! `ibnet-perf` ([`crate::ctrl`]) and `ibnet-soak` ([`crate::soak::link`]). It carries
//! configuration, connect handles and results, never data.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::marker::PhantomData;
use std::net::TcpStream;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::Error;

/// A message type of a control link: JSON on the wire, one variant meaning "the peer failed".
pub trait ControlMsg: Serialize + DeserializeOwned {
    /// The peer's description of its fatal error if this message reports one.
    fn failure(&self) -> Option<&str>;
}

/// One end of a control link carrying messages of type `M`.
pub struct JsonLink<M> {
    r: BufReader<TcpStream>,
    w: TcpStream,
    msg: PhantomData<fn() -> M>,
}

impl<M: ControlMsg> JsonLink<M> {
    /// Wraps a connected stream; `timeout` bounds every blocking receive.
    pub fn new(s: TcpStream, timeout: Duration) -> Result<Self, Error> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        Ok(Self {
            r: BufReader::new(s.try_clone()?),
            w: s,
            msg: PhantomData,
        })
    }

    /// Sends one message.
    pub fn send(&mut self, m: &M) -> Result<(), Error> {
        let mut line = serde_json::to_vec(m)?;
        line.push(b'\n');
        self.w
            .write_all(&line)
            .map_err(|e| Error(format!("control link to the peer lost: {e}")))
    }

    /// Receives one message (waits up to the timeout); a failure report becomes an error.
    pub fn recv(&mut self) -> Result<M, Error> {
        let mut line = String::new();
        let n = self
            .r
            .read_line(&mut line)
            .map_err(|e| Error(format!("no answer from the peer: {e}")))?;
        if n == 0 {
            return Err(Error("the peer closed the control link".into()));
        }
        let m: M = serde_json::from_str(&line)?;
        match m.failure() {
            Some(why) => Err(Error(format!("peer: {why}"))),
            None => Ok(m),
        }
    }

    /// A message if one has begun to arrive, else `None` at once. A message is one `write`
    /// of a short line, so once its first byte is here the rest follows without a wait.
    pub fn poll(&mut self) -> Result<Option<M>, Error> {
        if self.r.buffer().is_empty() {
            self.w.set_nonblocking(true)?;
            let ready = match self.r.fill_buf() {
                Ok(_) => Ok(true), // bytes, or EOF (which `recv` reports)
                Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
                Err(e) => Err(Error(format!("control link to the peer lost: {e}"))),
            };
            self.w.set_nonblocking(false)?;
            if !ready? {
                return Ok(None);
            }
        }
        self.recv().map(Some)
    }
}
