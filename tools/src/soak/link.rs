//! The control link between a pair of soak threads (one per process): newline-delimited JSON
//! [`Msg`]s over TCP on 127.0.0.1. It carries connect handles, the stop agreement and the
//! results, never data; [`JsonLink::poll`] lets a thread look for a message without waiting.

use serde::{Deserialize, Serialize};

use super::stats::Totals;
use crate::jsonlink::{ControlMsg, JsonLink};

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

impl ControlMsg for Msg {
    fn failure(&self) -> Option<&str> {
        match self {
            Msg::Fail(why) => Some(why),
            _ => None,
        }
    }
}

/// One end of a soak control link.
pub type Link = JsonLink<Msg>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

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
