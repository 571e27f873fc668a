//! [`AckTracker`]: which deliveries of a channel are settled, and the fewest acks that tell the
//! broker so.
//!
//! Delivery tags on a channel count up from 1. An ack with `multiple` acknowledges every
//! outstanding tag up to its own, so it is only sent for a run of settled tags with no pending
//! one among them; a settled tag beyond a pending one (a slow handler holds an earlier tag) is
//! acked on its own, so that it does not hold its prefetch slot for as long as the slow one.

use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Settled,
    /// To be given back to the queue after a call that started (`reject` with `requeue`: the
    /// broker counts it), before any `multiple` ack covers it: a `multiple` ack would
    /// acknowledge it too, and the message would be lost.
    Requeue,
    /// To be given back to the queue without a call (`nack` with `requeue`, which RabbitMQ 4.3
    /// and later do not count as a delivery), before any `multiple` ack covers it.
    Return,
    /// Acked, rejected or nacked already.
    Done,
}

/// The acks to send, in this order: the requeues and returns first.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Acks {
    /// Give these back to the queue one by one, counted (`reject`, `requeue = true`).
    pub(crate) requeue: Vec<u64>,
    /// Give these back to the queue one by one, never started (`nack`, `requeue = true`).
    pub(crate) give_back: Vec<u64>,
    /// Ack everything up to this tag (`multiple = true`).
    pub(crate) up_to: Option<u64>,
    /// Ack these tags one by one (`multiple = false`).
    pub(crate) singles: Vec<u64>,
}

impl Acks {
    pub(crate) fn is_empty(&self) -> bool {
        self.requeue.is_empty()
            && self.give_back.is_empty()
            && self.up_to.is_none()
            && self.singles.is_empty()
    }
}

/// Settled-but-unacked and pending tags of one channel.
#[derive(Debug, Default)]
pub(crate) struct AckTracker {
    /// Every tag not yet acked, and the acked ones above the lowest pending tag.
    tags: BTreeMap<u64, State>,
    /// Settled tags not yet acked.
    settled: usize,
}

impl AckTracker {
    /// A delivery arrived.
    pub(crate) fn received(&mut self, tag: u64) {
        self.tags.insert(tag, State::Pending);
    }

    /// A delivery's outcome is settled: it may be acked.
    pub(crate) fn settle(&mut self, tag: u64) {
        if let Some(state) = self.tags.get_mut(&tag) {
            if *state == State::Pending {
                *state = State::Settled;
                self.settled += 1;
            }
        }
    }

    /// A delivery is to be delivered again after a call that started (given up on at
    /// shutdown, or its retry could not be published): rejected with `requeue`, never acked.
    pub(crate) fn requeue(&mut self, tag: u64) {
        self.mark(tag, State::Requeue);
    }

    /// A delivery is to be delivered again without having been started (the worker stopped
    /// first): nacked with `requeue`, never acked.
    pub(crate) fn give_back(&mut self, tag: u64) {
        self.mark(tag, State::Return);
    }

    fn mark(&mut self, tag: u64, to: State) {
        if let Some(state) = self.tags.get_mut(&tag) {
            if *state == State::Settled {
                self.settled -= 1;
            }
            *state = to;
        }
    }

    /// Settled deliveries not yet acked.
    pub(crate) fn settled(&self) -> usize {
        self.settled
    }

    /// Deliveries received and not settled yet.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.tags
            .values()
            .filter(|state| **state == State::Pending)
            .count()
    }

    /// The acks that cover every settled tag, marking them acked. With `singles_too` false,
    /// settled tags beyond a pending one wait (the common case: the pending one will settle
    /// soon and one `multiple` ack then covers all).
    pub(crate) fn take(&mut self, singles_too: bool) -> Acks {
        let mut acks = Acks::default();
        // The run from the lowest tag up to the first pending one.
        let mut run_end = None;
        let mut last_settled = None;
        for (tag, state) in &self.tags {
            match state {
                State::Pending => break,
                State::Settled => last_settled = Some(*tag),
                State::Requeue => acks.requeue.push(*tag),
                State::Return => acks.give_back.push(*tag),
                State::Done => {}
            }
            run_end = Some(*tag);
        }
        if let Some(end) = run_end {
            // Every tag up to `end` is settled, to be requeued first, or done: `multiple` up to
            // the last settled one acks exactly the settled ones (a tag acked or nacked before
            // is no longer outstanding).
            acks.up_to = last_settled;
            let rest = self.tags.split_off(&(end + 1));
            let covered = std::mem::replace(&mut self.tags, rest);
            self.settled -= covered
                .values()
                .filter(|state| **state == State::Settled)
                .count();
        }
        for (tag, state) in self.tags.iter_mut() {
            match state {
                State::Settled if singles_too => {
                    *state = State::Done;
                    self.settled -= 1;
                    acks.singles.push(*tag);
                }
                State::Requeue => {
                    *state = State::Done;
                    acks.requeue.push(*tag);
                }
                State::Return => {
                    *state = State::Done;
                    acks.give_back.push(*tag);
                }
                _ => {}
            }
        }
        acks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(tags: std::ops::RangeInclusive<u64>) -> AckTracker {
        let mut tracker = AckTracker::default();
        for tag in tags {
            tracker.received(tag);
        }
        tracker
    }

    #[test]
    fn a_run_of_settled_tags_is_one_multiple_ack() {
        let mut acks = tracker(1..=8);
        for tag in [3, 1, 2, 4] {
            acks.settle(tag);
        }
        assert_eq!(acks.settled(), 4);
        assert_eq!(
            acks.take(false),
            Acks {
                up_to: Some(4),
                ..Acks::default()
            }
        );
        assert_eq!(acks.settled(), 0);
        assert_eq!(acks.pending(), 4);
        assert!(acks.take(true).is_empty());
    }

    #[test]
    fn settled_tags_behind_a_pending_one_are_acked_singly_only_when_asked() {
        let mut acks = tracker(1..=5);
        for tag in [1, 3, 4] {
            acks.settle(tag);
        }
        assert_eq!(
            acks.take(false),
            Acks {
                up_to: Some(1),
                ..Acks::default()
            }
        );
        assert_eq!(
            acks.take(true),
            Acks {
                singles: vec![3, 4],
                ..Acks::default()
            }
        );
        // When the slow one settles, `multiple` must not name an already acked tag.
        acks.settle(2);
        assert_eq!(
            acks.take(false),
            Acks {
                up_to: Some(2),
                ..Acks::default()
            }
        );
        acks.settle(5);
        assert_eq!(acks.take(false).up_to, Some(5));
        assert_eq!(acks.pending(), 0);
    }

    #[test]
    fn a_requeued_tag_is_nacked_before_a_multiple_ack_could_cover_it() {
        let mut acks = tracker(1..=4);
        acks.requeue(1);
        acks.settle(2);
        assert_eq!(
            acks.take(false),
            Acks {
                requeue: vec![1],
                up_to: Some(2),
                ..Acks::default()
            }
        );
        // Beyond a pending tag, a requeue is sent at once, an ack only when asked.
        acks.requeue(4);
        assert_eq!(
            acks.take(false),
            Acks {
                requeue: vec![4],
                ..Acks::default()
            }
        );
        acks.settle(3);
        assert_eq!(acks.take(false).up_to, Some(3));
        assert!(acks.take(true).is_empty());
        assert_eq!(acks.pending(), 0);
    }

    #[test]
    fn deliveries_never_started_are_given_back_apart_from_requeued_ones() {
        let mut acks = tracker(1..=3);
        acks.give_back(1);
        acks.requeue(2);
        acks.settle(3);
        assert_eq!(
            acks.take(true),
            Acks {
                requeue: vec![2],
                give_back: vec![1],
                up_to: Some(3),
                singles: vec![]
            }
        );
    }
}
