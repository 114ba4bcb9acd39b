//! `tollgate-mock-vendor`: the judging mock vendor as a program, for the clients' tests in other
//! languages. It enforces N calls per period on its own clock, answers with one family of
//! rate-limit headers, and reports how the arrivals it saw measure against its limit.
//!
//! `tollgate-mock-vendor --listen 127.0.0.1:0 --limit 10 --period-ms 1000 --window sliding|fixed
//! --headers none|ietf|openai|anthropic|github|ietf-draft [--retry-after-s N]` prints
//! `listening on http://127.0.0.1:PORT` first, then serves any path as a call, and
//! `POST /_vendor/limit`, `GET /_vendor/report`, `POST /_vendor/reset`.

// Written once, with the dispatcher's tests that use it in-process.
#[allow(dead_code)]
#[path = "../../../dispatch/tests/common/judge.rs"]
mod judge;

fn main() {
    std::process::exit(judge::run_cli());
}
