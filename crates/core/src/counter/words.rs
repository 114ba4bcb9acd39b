//! A counter's state as plain numbers (`Counter::to_words`, `Counter::from_words`): the layout
//! a store keeps across a restart of its process, and the checks that refuse words no counter
//! could have written.

use std::collections::VecDeque;

use crate::policy::UNITS_MAX;

use super::leases::{LEASES_MAX, Lease};
use super::reservations::{RESERVATIONS_TRACKED_MAX, Reservation, Reservations};
use super::sliding::{Bucket, SLIDING_BUCKETS_MAX};
use super::{Body, Counter};

/// Why a counter's words (`Counter::to_words`) cannot be read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterWordsError(&'static str);

impl std::fmt::Display for CounterWordsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "counter state: {}", self.0)
    }
}

impl std::error::Error for CounterWordsError {}

const BODY_EMPTY: u64 = 0;
const BODY_SLIDING: u64 = 1;
const BODY_FIXED: u64 = 2;
const BODY_GCRA: u64 = 3;
const BODY_LEASES: u64 = 4;

/// Reads words in order, refusing a short input.
struct Words<'a>(std::slice::Iter<'a, u64>);

impl Words<'_> {
    fn next(&mut self) -> Result<u64, CounterWordsError> {
        self.0.next().copied().ok_or(CounterWordsError("too short"))
    }

    /// A length, refused above `max` before anything is allocated for it.
    fn len(&mut self, max: u64, what: &'static str) -> Result<usize, CounterWordsError> {
        let len = self.next()?;
        if len > max {
            return Err(CounterWordsError(what));
        }
        usize::try_from(len).map_err(|_| CounterWordsError(what))
    }
}

impl Counter {
    /// The whole state as plain numbers, times as they are (on the deciding clock), so a store
    /// can keep it across a restart of its process (`from_words` reads it back).
    pub fn to_words(&self) -> Vec<u64> {
        let mut words = vec![
            self.paused_until,
            self.next_seq,
            self.reservations.len() as u64,
        ];
        if let Some(list) = &self.reservations.0 {
            for r in list.iter() {
                words.extend([r.seq, r.units, r.at]);
            }
        }
        match &self.body {
            Body::Empty => words.push(BODY_EMPTY),
            Body::Sliding { buckets, .. } => {
                words.extend([BODY_SLIDING, buckets.len() as u64]);
                for b in buckets {
                    words.extend([b.opened_at, b.stamp, b.units]);
                }
            }
            Body::Fixed {
                window,
                window_us,
                used,
            } => words.extend([BODY_FIXED, *window, *window_us, *used]),
            Body::Gcra {
                tat,
                emission_us,
                last_seq,
            } => words.extend([BODY_GCRA, *tat, *emission_us, *last_seq]),
            Body::Leases { leases } => {
                words.extend([BODY_LEASES, leases.len() as u64]);
                for l in leases {
                    words.extend([l.fence, l.slots, l.expires_at]);
                }
            }
        }
        words
    }

    /// A counter from `to_words`. Words that no counter could have written (from another
    /// version, or edited by hand) are refused rather than trusted: a decision on an
    /// inconsistent state could overdraw.
    pub fn from_words(words: &[u64]) -> Result<Counter, CounterWordsError> {
        let mut input = Words(words.iter());
        let paused_until = input.next()?;
        let next_seq = input.next()?;
        let count = input.len(RESERVATIONS_TRACKED_MAX as u64, "too many reservations")?;
        let mut reservations = Reservations::default();
        for _ in 0..count {
            let reservation = Reservation {
                seq: input.next()?,
                units: input.next()?,
                at: input.next()?,
            };
            let ordered = reservations
                .back()
                .is_none_or(|last| last.seq < reservation.seq);
            if !ordered || reservation.seq >= next_seq || reservation.units > UNITS_MAX {
                return Err(CounterWordsError("reservations out of order"));
            }
            reservations.push_back(reservation);
        }
        let body = match input.next()? {
            BODY_EMPTY => Body::Empty,
            BODY_SLIDING => {
                // The log holds at most one bucket past its cap while it merges.
                let count = input.len(SLIDING_BUCKETS_MAX + 1, "too many sliding buckets")?;
                let mut buckets = VecDeque::with_capacity(count);
                let mut units: u64 = 0;
                for _ in 0..count {
                    let bucket = Bucket {
                        opened_at: input.next()?,
                        stamp: input.next()?,
                        units: input.next()?,
                    };
                    let ordered = bucket.opened_at <= bucket.stamp
                        && buckets
                            .back()
                            .is_none_or(|last: &Bucket| last.stamp <= bucket.stamp);
                    if !ordered {
                        return Err(CounterWordsError("sliding buckets out of order"));
                    }
                    units = units
                        .checked_add(bucket.units)
                        .ok_or(CounterWordsError("sliding units out of range"))?;
                    buckets.push_back(bucket);
                }
                Body::Sliding { buckets, units }
            }
            BODY_FIXED => {
                let (window, window_us, used) = (input.next()?, input.next()?, input.next()?);
                if window_us == 0 || used > UNITS_MAX {
                    return Err(CounterWordsError("fixed window out of range"));
                }
                Body::Fixed {
                    window,
                    window_us,
                    used,
                }
            }
            BODY_GCRA => {
                let (tat, emission_us, last_seq) = (input.next()?, input.next()?, input.next()?);
                if emission_us == 0 {
                    return Err(CounterWordsError("GCRA interval out of range"));
                }
                Body::Gcra {
                    tat,
                    emission_us,
                    last_seq,
                }
            }
            BODY_LEASES => {
                let count = input.len(LEASES_MAX, "too many leases")?;
                let mut leases = Vec::with_capacity(count);
                for _ in 0..count {
                    let lease = Lease {
                        fence: input.next()?,
                        slots: input.next()?,
                        expires_at: input.next()?,
                    };
                    if lease.fence >= next_seq || lease.slots > LEASES_MAX {
                        return Err(CounterWordsError("lease out of range"));
                    }
                    leases.push(lease);
                }
                Body::Leases { leases }
            }
            _ => return Err(CounterWordsError("unknown kind")),
        };
        if input.0.next().is_some() {
            return Err(CounterWordsError("too long"));
        }
        Ok(Counter {
            paused_until,
            next_seq,
            reservations,
            body,
        })
    }
}
