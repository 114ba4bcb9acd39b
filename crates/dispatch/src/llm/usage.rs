//! An answer read as it passes, never held back: what the vendor reports it used (a JSON
//! body's `usage`; in a stream, OpenAI's final usage chunk, the Responses API's
//! `response.completed`, Anthropic's `message_start` and `message_delta`), what text has
//! streamed so far, and whether the answer ended as the vendor ends a complete one.

use serde_json::Value;

use super::Api;
use super::estimate::{count, present};

/// Longest JSON body, or server-sent event, kept to be read, in bytes; a longer one passes
/// unread (its usage is then unknown, and the stream's policy applies).
const KEPT_BYTES_MAX: usize = 8 * 1024 * 1024;

/// What an answer said of its cost, so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input tokens the vendor reported.
    pub input: Option<u64>,
    /// Output tokens the vendor reported (in a stream, the latest cumulative figure).
    pub output: Option<u64>,
    /// Bytes of generated text streamed so far: never fewer than the tokens they hold.
    pub streamed: u64,
    /// The vendor ended the answer as it ends a complete one.
    pub finished: bool,
    /// The vendor reported an error inside the answer.
    pub failed: bool,
}

/// Reads one answer chunk by chunk.
#[derive(Debug)]
pub struct UsageReader {
    events: bool,
    line: Vec<u8>,
    data: Vec<u8>,
    /// Whether the event being read has a data line yet: its lines are joined with a line feed,
    /// an empty one included, as server-sent events join them.
    has_data: bool,
    kept: Vec<u8>,
    over: bool,
    usage: Usage,
}

fn number(value: &Value, field: &str) -> Option<u64> {
    value.get(field).and_then(count)
}

/// A `usage` object of either family: (input, output).
fn read_usage(usage: &Value) -> (Option<u64>, Option<u64>) {
    if !usage.is_object() {
        return (None, None);
    }
    let input = number(usage, "prompt_tokens").or_else(|| {
        number(usage, "input_tokens").map(|input| {
            // Cached input counts too: erring high.
            input
                .saturating_add(number(usage, "cache_creation_input_tokens").unwrap_or(0))
                .saturating_add(number(usage, "cache_read_input_tokens").unwrap_or(0))
        })
    });
    let output = number(usage, "completion_tokens").or_else(|| number(usage, "output_tokens"));
    (input, output)
}

fn text_len(value: Option<&Value>) -> u64 {
    value
        .and_then(Value::as_str)
        .map_or(0, |text| text.len() as u64)
}

impl UsageReader {
    /// `events`: the answer is `text/event-stream`.
    pub fn new(_api: Api, events: bool) -> UsageReader {
        UsageReader {
            events,
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            kept: Vec::new(),
            over: false,
            usage: Usage::default(),
        }
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    fn note(&mut self, input: Option<u64>, output: Option<u64>) {
        if input.is_some() {
            self.usage.input = input;
        }
        if output.is_some() {
            self.usage.output = output;
        }
    }

    /// The next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.events {
            if self.kept.len() + chunk.len() > KEPT_BYTES_MAX {
                self.over = true;
                self.kept = Vec::new();
            }
            if !self.over {
                self.kept.extend_from_slice(chunk);
            }
            return;
        }
        for &byte in chunk {
            if byte != b'\n' {
                if self.line.len() < KEPT_BYTES_MAX {
                    self.line.push(byte);
                }
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            if line.is_empty() {
                self.dispatch();
            } else if let Some(data) = line.strip_prefix(b"data:") {
                if std::mem::replace(&mut self.has_data, true) {
                    self.data.push(b'\n');
                }
                let data = data.strip_prefix(b" ").unwrap_or(data);
                if self.data.len() + data.len() <= KEPT_BYTES_MAX {
                    self.data.extend_from_slice(data);
                }
            }
        }
    }

    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.has_data = false;
        self.event(&data);
    }

    /// The body ended (cleanly or not).
    pub fn end(&mut self) {
        if self.events {
            self.dispatch();
            return;
        }
        if self.over {
            return;
        }
        let kept = std::mem::take(&mut self.kept);
        // Anything but a JSON object is no answer: nothing is read.
        if let Ok(json @ Value::Object(_)) = serde_json::from_slice::<Value>(&kept) {
            let (input, output) = read_usage(json.get("usage").unwrap_or(&Value::Null));
            self.note(input, output);
            self.usage.failed = present(&json, "error").is_some();
            self.usage.finished = !self.usage.failed;
        }
    }

    fn event(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if data == b"[DONE]" {
            self.usage.finished = true;
            return;
        }
        let Ok(json) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        match json.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                let usage = json.pointer("/message/usage").unwrap_or(&Value::Null);
                let (input, output) = read_usage(usage);
                self.note(input, output);
            }
            "message_delta" => {
                let (input, output) = read_usage(json.get("usage").unwrap_or(&Value::Null));
                self.note(input, output);
            }
            "content_block_delta" => {
                let delta = json.get("delta").unwrap_or(&Value::Null);
                self.usage.streamed += text_len(delta.get("text"))
                    + text_len(delta.get("partial_json"))
                    + text_len(delta.get("thinking"));
            }
            "message_stop" => self.usage.finished = true,
            "error" | "response.failed" | "response.error" => {
                self.usage.failed = true;
                if let Some(response) = json.get("response") {
                    let (input, output) = read_usage(response.get("usage").unwrap_or(&Value::Null));
                    self.note(input, output);
                }
            }
            kind if kind.starts_with("response.") && kind.ends_with(".delta") => {
                self.usage.streamed += text_len(json.get("delta"));
            }
            "response.completed" | "response.incomplete" => {
                let usage = json.pointer("/response/usage").unwrap_or(&Value::Null);
                let (input, output) = read_usage(usage);
                self.note(input, output);
                self.usage.finished = true;
            }
            _ => {
                if present(&json, "error").is_some() {
                    self.usage.failed = true;
                }
                if let Some(choices) = json.get("choices").and_then(Value::as_array) {
                    for choice in choices {
                        let delta = choice.get("delta").unwrap_or(&Value::Null);
                        self.usage.streamed +=
                            text_len(delta.get("content")) + text_len(delta.get("refusal"));
                        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                            for call in calls {
                                self.usage.streamed +=
                                    text_len(call.pointer("/function/arguments"));
                            }
                        }
                    }
                }
                let (input, output) = read_usage(json.get("usage").unwrap_or(&Value::Null));
                self.note(input, output);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(api: Api, events: bool, chunks: &[&str]) -> Usage {
        let mut reader = UsageReader::new(api, events);
        for chunk in chunks {
            reader.feed(chunk.as_bytes());
        }
        reader.end();
        reader.usage()
    }

    #[test]
    fn an_openai_stream_reports_its_final_usage_chunk() {
        let usage = read(
            Api::OpenAiChat,
            true,
            &[
                "data: {\"choices\":[{\"delta\":{\"content\":\"hel",
                "lo\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
                "data: [DONE]\n\n",
            ],
        );
        assert_eq!(
            usage,
            Usage {
                input: Some(5),
                output: Some(2),
                streamed: 5,
                finished: true,
                failed: false
            }
        );
    }

    #[test]
    fn an_anthropic_stream_reports_at_start_and_delta() {
        let usage = read(
            Api::AnthropicMessages,
            true,
            &[
                "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\r\n\r\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"abc\"}}\n\n",
            ],
        );
        assert_eq!(
            (usage.input, usage.output, usage.streamed),
            (Some(9), Some(1), 3)
        );
        assert!(!usage.finished);
    }

    #[test]
    fn a_json_answer_reports_its_usage() {
        let usage = read(
            Api::OpenAiResponses,
            false,
            &["{\"usage\":{\"input_tokens\":3,", "\"output_tokens\":4}}"],
        );
        assert_eq!(
            (usage.input, usage.output, usage.finished),
            (Some(3), Some(4), true)
        );
    }
}
