//! One process of a fleet sharing a host quota, for the multi-process tests (filled in below).

fn main() {}
