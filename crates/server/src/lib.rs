//! The HTTP API v1, admin, metrics and health endpoints.
