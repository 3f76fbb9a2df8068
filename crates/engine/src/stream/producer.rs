//! Idempotent producer validation (Durable Streams §5.2.1): the pure decision of what
//! an `(id, epoch, seq)` stamp means against a producer's current state.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerState {
    pub epoch: u64,
    pub last_seq: u64,
    /// Sequencer op number of the last accepted batch: a duplicate is answered only
    /// once that op is durable.
    pub last_op: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Append it; the producer's state becomes `(epoch, seq)`.
    Accept,
    /// Already written: answer success without writing. Carries the highest accepted seq.
    Duplicate {
        last_seq: u64,
        last_op: u64,
    },
    StaleEpoch {
        current: u64,
    },
    EpochMustStartAtZero,
    Gap {
        expected: u64,
        received: u64,
    },
}

/// `seq` is the stamp of an append; a stamp that covers several sequence numbers
/// (a Kafka batch: `first..=seq`) is accepted when `first` follows the last one
/// accepted and is a duplicate when `seq` does not pass it.
pub fn validate(state: Option<&ProducerState>, epoch: u64, seq: u64) -> Verdict {
    validate_span(state, epoch, seq, seq)
}

/// [`validate`] for a stamp covering `first..=seq`.
pub fn validate_span(state: Option<&ProducerState>, epoch: u64, first: u64, seq: u64) -> Verdict {
    let Some(state) = state else {
        return if first == 0 {
            Verdict::Accept
        } else {
            Verdict::Gap {
                expected: 0,
                received: first,
            }
        };
    };
    if epoch < state.epoch {
        return Verdict::StaleEpoch {
            current: state.epoch,
        };
    }
    if epoch > state.epoch {
        return if first == 0 {
            Verdict::Accept
        } else {
            Verdict::EpochMustStartAtZero
        };
    }
    if seq <= state.last_seq {
        Verdict::Duplicate {
            last_seq: state.last_seq,
            last_op: state.last_op,
        }
    } else if first == state.last_seq + 1 {
        Verdict::Accept
    } else {
        Verdict::Gap {
            expected: state.last_seq + 1,
            received: first,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(epoch: u64, last_seq: u64) -> ProducerState {
        ProducerState {
            epoch,
            last_seq,
            last_op: 0,
        }
    }

    #[test]
    fn follows_the_protocol_table() {
        assert_eq!(validate(None, 0, 0), Verdict::Accept);
        assert_eq!(
            validate(None, 3, 1),
            Verdict::Gap {
                expected: 0,
                received: 1
            }
        );
        assert_eq!(
            validate(Some(&st(2, 5)), 1, 0),
            Verdict::StaleEpoch { current: 2 }
        );
        assert_eq!(validate(Some(&st(2, 5)), 3, 0), Verdict::Accept);
        assert_eq!(
            validate(Some(&st(2, 5)), 3, 1),
            Verdict::EpochMustStartAtZero
        );
        assert_eq!(
            validate(Some(&st(2, 5)), 2, 5),
            Verdict::Duplicate {
                last_seq: 5,
                last_op: 0
            }
        );
        assert_eq!(validate(Some(&st(2, 5)), 2, 6), Verdict::Accept);
        assert_eq!(
            validate(Some(&st(2, 5)), 2, 8),
            Verdict::Gap {
                expected: 6,
                received: 8
            }
        );
    }

    #[test]
    fn a_span_follows_the_last_and_repeats_as_a_duplicate() {
        // Kafka batches: 0..=9, then 10..=14.
        assert_eq!(validate_span(None, 0, 0, 9), Verdict::Accept);
        assert_eq!(validate_span(Some(&st(0, 9)), 0, 10, 14), Verdict::Accept);
        // The same batch again (a retry after a lost answer).
        assert!(matches!(
            validate_span(Some(&st(0, 14)), 0, 10, 14),
            Verdict::Duplicate { last_seq: 14, .. }
        ));
        // Overlapping the last batch, or leaving a hole: out of order.
        assert_eq!(
            validate_span(Some(&st(0, 14)), 0, 12, 20),
            Verdict::Gap {
                expected: 15,
                received: 12
            }
        );
        assert_eq!(
            validate_span(Some(&st(0, 14)), 0, 16, 20),
            Verdict::Gap {
                expected: 15,
                received: 16
            }
        );
        assert_eq!(
            validate_span(None, 0, 3, 5),
            Verdict::Gap {
                expected: 0,
                received: 3
            }
        );
    }
}
