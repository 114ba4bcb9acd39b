//! The tollgate binary: serve, limits, acquire, simulate.
