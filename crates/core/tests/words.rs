//! A counter's words (`Counter::to_words`, what a store saves across a restart) read back only
//! when some counter could have written them: every bound is refused one past it and accepted
//! at it. The layout is the saved format: paused until, next number, the reservations (count,
//! then number, units, time each), then the body's kind and its fields.

use tollgate_core::{
    Counter, LEASES_MAX, RESERVATIONS_TRACKED_MAX, SLIDING_BUCKETS_MAX, UNITS_MAX,
};

const NEXT_SEQ: u64 = 1_000_000;
const SLIDING: u64 = 1;
const FIXED: u64 = 2;
const LEASES: u64 = 4;
const EMPTY: u64 = 0;

/// Words of a counter with these reservations `(seq, units, at)` and this body.
fn words(reservations: &[(u64, u64, u64)], body: &[u64]) -> Vec<u64> {
    let mut words = vec![0, NEXT_SEQ, reservations.len() as u64];
    for &(seq, units, at) in reservations {
        words.extend([seq, units, at]);
    }
    words.extend_from_slice(body);
    words
}

#[track_caller]
fn reads_back(words: &[u64]) {
    let counter = Counter::from_words(words).expect("a counter could have written these");
    assert_eq!(counter.to_words(), words);
}

#[track_caller]
fn refused(words: &[u64], why: &str) {
    let error = Counter::from_words(words).expect_err(why);
    assert!(error.to_string().contains(why), "{error}, not {why}");
}

#[test]
fn reservations_are_bounded_ordered_numbered_and_sized() {
    let many = |count: u64| (1..=count).map(|seq| (seq, 1, 0)).collect::<Vec<_>>();
    let tracked_max = RESERVATIONS_TRACKED_MAX as u64;
    reads_back(&words(&many(tracked_max), &[EMPTY]));
    refused(
        &words(&many(tracked_max + 1), &[EMPTY]),
        "too many reservations",
    );
    // Numbers strictly ascending, below the next one to be handed out.
    refused(&words(&[(5, 1, 0), (5, 1, 0)], &[EMPTY]), "out of order");
    refused(&words(&[(6, 1, 0), (5, 1, 0)], &[EMPTY]), "out of order");
    reads_back(&words(&[(NEXT_SEQ - 1, 1, 0)], &[EMPTY]));
    refused(&words(&[(NEXT_SEQ, 1, 0)], &[EMPTY]), "out of order");
    // Units within what any cost can be.
    reads_back(&words(&[(5, UNITS_MAX, 0)], &[EMPTY]));
    refused(&words(&[(5, UNITS_MAX + 1, 0)], &[EMPTY]), "out of order");
}

#[test]
fn a_sliding_log_holds_one_bucket_past_its_cap_at_most() {
    let log = |count: u64| {
        let mut body = vec![SLIDING, count];
        for at in 0..count {
            body.extend([at, at, 1]);
        }
        words(&[], &body)
    };
    reads_back(&log(SLIDING_BUCKETS_MAX + 1));
    refused(&log(SLIDING_BUCKETS_MAX + 2), "too many sliding buckets");
}

/// A bucket opens at or before its stamp (grants join it at later instants only), and stamps
/// ascend; a grant's decision to join the newest bucket relies on both.
#[test]
fn a_sliding_bucket_opens_no_later_than_its_stamp() {
    reads_back(&words(&[], &[SLIDING, 1, 7, 7, 1]));
    reads_back(&words(&[], &[SLIDING, 2, 3, 7, 1, 7, 9, 1]));
    refused(&words(&[], &[SLIDING, 1, 8, 7, 1]), "out of order");
    refused(&words(&[], &[SLIDING, 2, 3, 9, 1, 7, 8, 1]), "out of order");
}

#[test]
fn a_fixed_window_has_a_length_and_counts_at_most_any_limit() {
    reads_back(&words(&[], &[FIXED, 3, 1_000, UNITS_MAX]));
    refused(&words(&[], &[FIXED, 3, 0, 1]), "fixed window out of range");
    refused(
        &words(&[], &[FIXED, 3, 1_000, UNITS_MAX + 1]),
        "fixed window out of range",
    );
}

#[test]
fn a_lease_was_handed_out_before_and_holds_at_most_any_limit() {
    reads_back(&words(&[], &[LEASES, 1, NEXT_SEQ - 1, LEASES_MAX, 5_000]));
    refused(
        &words(&[], &[LEASES, 1, NEXT_SEQ, 1, 5_000]),
        "lease out of range",
    );
    refused(
        &words(&[], &[LEASES, 1, 7, LEASES_MAX + 1, 5_000]),
        "lease out of range",
    );
}
