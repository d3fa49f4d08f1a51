//! The control link between a pair of soak threads (one per process): newline-delimited JSON
//! [`Msg`]s over TCP on 127.0.0.1. It carries connect handles, the stop agreement and the
//! results, never data; [`Link::poll`] lets a thread look for a message without waiting.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::stats::Totals;
use crate::Error;

/// A control message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    /// Peer thread → driver: which thread this link belongs to.
    Join(u32),
    /// The connect handles of the sender's lanes: (lane, 128 bytes).
    Handles(Vec<(u32, Vec<u8>)>),
    /// Stop: requests started so far on each lane; both sides then run to the larger count.
    Stop(Vec<u64>),
    /// This thread's totals, once its lanes are drained.
    Done(Totals),
    /// Fatal error, described.
    Fail(String),
}

/// One end of a control link.
pub struct Link {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Link {
    /// Wraps a connected stream; `timeout` bounds every blocking receive.
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
            .map_err(|e| Error(format!("control link to the peer lost: {e}")))
    }

    /// Receives one message (waits up to the timeout); a `Fail` becomes an error.
    pub fn recv(&mut self) -> Result<Msg, Error> {
        let mut line = String::new();
        let n = self
            .r
            .read_line(&mut line)
            .map_err(|e| Error(format!("no answer from the peer: {e}")))?;
        if n == 0 {
            return Err(Error("the peer closed the control link".into()));
        }
        match serde_json::from_str(&line)? {
            Msg::Fail(why) => Err(Error(format!("peer: {why}"))),
            m => Ok(m),
        }
    }

    /// A message if one has begun to arrive, else `None` at once. A message is one `write`
    /// of a short line, so once its first byte is here the rest follows without a wait.
    pub fn poll(&mut self) -> Result<Option<Msg>, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn poll_sees_nothing_then_a_message_then_eof() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let t = Duration::from_secs(5);
        let (mut a, mut b) = (Link::new(a, t).unwrap(), Link::new(b, t).unwrap());
        assert_eq!(b.poll().unwrap(), None);
        a.send(&Msg::Stop(vec![3, 4])).unwrap();
        a.send(&Msg::Join(2)).unwrap();
        assert_eq!(b.recv().unwrap(), Msg::Stop(vec![3, 4]));
        assert_eq!(b.poll().unwrap(), Some(Msg::Join(2)));
        a.send(&Msg::Fail("boom".into())).unwrap();
        assert!(b.recv().unwrap_err().0.contains("boom"));
        drop(a);
        assert!(b.poll().is_err(), "EOF is an error");
    }
}
