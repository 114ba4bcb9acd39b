//! `tollgate-mock-model`: the judging mock model server as a program, for the fleet test and
//! the clients' tests in other languages. OpenAI- and Anthropic-style calls, JSON or streamed,
//! its own requests, input and output tokens per period on its own clock, 429 past them.
//!
//! `tollgate-mock-model --listen 127.0.0.1:0 --rpm N --itpm N --otpm N --period-ms N
//! [--token-us N] [--chunk-tokens N]` prints `listening on http://127.0.0.1:PORT` first, then
//! serves `/v1/chat/completions`, `/v1/responses`, `/v1/messages`, `GET /_model/report` and
//! `POST /_model/reset`.

// Written once, beside the dispatcher's judging mock vendor.
#[allow(dead_code)]
#[path = "../../../dispatch/tests/common/model.rs"]
mod model;

fn main() {
    std::process::exit(model::run_cli());
}
