//! The Redis store: shared counters for many processes, decided atomically in Lua on Redis's clock.
