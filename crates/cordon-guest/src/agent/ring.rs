//! A background exec's kept output: the last [`BACKGROUND_KEEP`] bytes of a stream, or
//! (held) every byte the host has not read yet.

use std::collections::VecDeque;

use cordon_core::BACKGROUND_KEEP;

/// The last [`BACKGROUND_KEEP`] bytes of a stream, and where they start in all it carried.
/// A held ring drops nothing: it is [`Ring::full`] at that many unread bytes (the agent then
/// stops reading the stream) and a read releases what lies before its offset.
#[derive(Default)]
pub(super) struct Ring {
    data: VecDeque<u8>,
    start: u64,
    held: bool,
}

impl Ring {
    pub(super) fn held() -> Self {
        Ring {
            held: true,
            ..Ring::default()
        }
    }

    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.data.extend(bytes);
        let over = self.data.len().saturating_sub(BACKGROUND_KEEP as usize);
        if over > 0 && !self.held {
            self.data.drain(..over);
            self.start += over as u64;
        }
    }

    /// Whether the agent stops reading this stream until the host reads.
    pub(super) fn full(&self) -> bool {
        self.held && self.data.len() as u64 >= BACKGROUND_KEEP
    }

    /// A held ring's bytes before `upto` were read by the host: they go.
    pub(super) fn release(&mut self, upto: u64) {
        if !self.held {
            return;
        }
        let n = upto.saturating_sub(self.start).min(self.data.len() as u64);
        self.data.drain(..n as usize);
        self.start += n;
    }

    /// Up to `max` bytes from offset `from` (or from the oldest kept byte, if `from` was
    /// dropped), and the offset they start at.
    pub(super) fn read(&self, from: u64, max: u64) -> (u64, Vec<u8>) {
        let at = from.clamp(self.start, self.end());
        let skip = (at - self.start) as usize;
        let take = (max as usize).min(self.data.len().saturating_sub(skip));
        (at, self.data.range(skip..skip + take).copied().collect())
    }

    pub(super) fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain ring keeps the last bytes; a held one drops nothing, says when it is full
    /// and lets go only of what the host read.
    #[test]
    fn a_held_ring_drops_nothing_and_releases_what_was_read() {
        let keep = BACKGROUND_KEEP as usize;
        let mut plain = Ring::default();
        plain.push(&vec![1u8; keep]);
        plain.push(&[2u8; 10]);
        assert!(!plain.full());
        assert_eq!(plain.read(0, 4).0, 10, "the oldest bytes were dropped");
        let mut held = Ring::held();
        held.push(&vec![1u8; keep - 1]);
        assert!(!held.full());
        held.push(&[2u8; 10]);
        assert!(held.full());
        let (at, data) = held.read(0, 4);
        assert_eq!((at, data), (0, vec![1u8; 4]), "nothing was dropped");
        let (at, data) = held.read(keep as u64 - 1, 20);
        assert_eq!((at, data), (keep as u64 - 1, vec![2u8; 10]));
        held.release(keep as u64);
        assert!(!held.full());
        assert_eq!(held.read(0, 100).0, keep as u64, "read bytes are let go");
        assert_eq!(held.read(0, 100).1.len(), 9);
        // A release past the end keeps the offsets true.
        held.release(u64::MAX);
        assert_eq!(held.read(0, 100), (keep as u64 + 9, Vec::new()));
    }
}
