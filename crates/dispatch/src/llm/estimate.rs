//! What a request may cost, read from its body before it is sent.
//!
//! Output is bounded by the request's own cap (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`), else by the model's documented maximum as configured. Input is
//! estimated so that it errs high: one token per byte of the request body, plus a fixed
//! allowance per message and per request. Tokenisers of the byte-pair kind that OpenAI and
//! Anthropic use never make a token of less than one byte, so text cannot hold more tokens than
//! bytes; the allowances cover what the vendor's chat template adds. A caller that counted the
//! input itself passes its count instead.

use serde_json::Value;

use crate::error::DispatchError;

/// The APIs recognised by their path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI-style `/v1/chat/completions`.
    OpenAiChat,
    /// OpenAI-style `/v1/responses`.
    OpenAiResponses,
    /// Anthropic-style `/v1/messages`.
    AnthropicMessages,
}

impl Api {
    /// The API a request path speaks, if one of the three.
    pub fn recognise(path: &str) -> Option<Api> {
        let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Some(Api::OpenAiChat)
        } else if path.ends_with("/responses") {
            Some(Api::OpenAiResponses)
        } else if path.ends_with("/messages") {
            Some(Api::AnthropicMessages)
        } else {
            None
        }
    }
}

/// How requests are estimated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EstimateConfig {
    /// Output estimate of a request that sets no cap, unless its model is listed in `models`:
    /// the model's documented maximum output. A lower figure is allowed, and then a stream can
    /// outrun it (see `docs/llm.md`, *The bound*).
    pub output_default: u64,
    /// Documented maximum output by model name prefix, longest prefix first wins.
    pub models: Vec<(String, u64)>,
    /// Input tokens allowed per message for the chat template (default 8).
    pub per_message: u64,
    /// Input tokens allowed per request (default 16).
    pub per_request: u64,
}

impl Default for EstimateConfig {
    fn default() -> EstimateConfig {
        EstimateConfig {
            output_default: 32_768,
            models: Vec::new(),
            per_message: 8,
            per_request: 16,
        }
    }
}

/// A request's estimated cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub input: u64,
    pub output: u64,
    /// Whether the request set its own output cap (then the vendor never outruns `output`).
    pub bounded: bool,
    /// Whether the request asked for server-sent events.
    pub stream: bool,
}

/// The largest count read: the largest whole number every client's language holds exactly.
const COUNT_MAX: u64 = (1 << 53) - 1;

/// A whole number of tokens from 0 to 2^53 - 1 (`50.0` is 50, as a JavaScript client cannot
/// tell them apart), else `None`: the one reading of a count the clients share.
pub(crate) fn count(value: &Value) -> Option<u64> {
    let whole = match value.as_u64() {
        Some(whole) => whole,
        None => {
            let float = value.as_f64()?;
            if float.fract() != 0.0 || !(0.0..=COUNT_MAX as f64).contains(&float) {
                return None;
            }
            float as u64
        }
    };
    (whole <= COUNT_MAX).then_some(whole)
}

/// A JSON field, with null as if absent.
pub(crate) fn present<'a>(json: &'a Value, field: &str) -> Option<&'a Value> {
    json.get(field).filter(|value| !value.is_null())
}

fn cap(body: &Value, fields: &[&'static str]) -> Result<Option<u64>, DispatchError> {
    for &field in fields {
        match present(body, field) {
            None => {}
            Some(value) => {
                return count(value).map(Some).ok_or_else(|| {
                    DispatchError::config(field, "must be a whole number of tokens")
                });
            }
        }
    }
    Ok(None)
}

/// Estimate a request of `api` from its body. `input_tokens`: the caller's own count, used
/// instead of the estimate. Errors name the field.
pub fn estimate(
    api: Api,
    body: &[u8],
    input_tokens: Option<u64>,
    config: &EstimateConfig,
) -> Result<Estimate, DispatchError> {
    let json: Value = serde_json::from_slice(body)
        .map_err(|error| DispatchError::config("body", format!("not JSON: {error}")))?;
    if !json.is_object() {
        return Err(DispatchError::config("body", "must be a JSON object"));
    }
    let output = match api {
        Api::OpenAiChat => cap(&json, &["max_completion_tokens", "max_tokens"])?,
        Api::OpenAiResponses => cap(&json, &["max_output_tokens"])?,
        Api::AnthropicMessages => cap(&json, &["max_tokens"])?,
    };
    let bounded = output.is_some();
    let output = output.unwrap_or_else(|| {
        let model = json.get("model").and_then(Value::as_str).unwrap_or("");
        config
            .models
            .iter()
            .filter(|(prefix, _)| model.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(config.output_default, |(_, most)| *most)
    });
    let messages = ["messages", "input"]
        .iter()
        .filter_map(|field| present(&json, field))
        .map(|value| value.as_array().map_or(1, |list| list.len() as u64))
        .sum::<u64>()
        + u64::from(present(&json, "system").is_some() || present(&json, "instructions").is_some());
    let input = input_tokens.unwrap_or(
        (body.len() as u64)
            .saturating_add(config.per_message.saturating_mul(messages))
            .saturating_add(config.per_request),
    );
    let stream = json.get("stream").and_then(Value::as_bool) == Some(true);
    Ok(Estimate {
        input: input.max(1),
        output: output.max(1),
        bounded,
        stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_recognised() {
        assert_eq!(
            Api::recognise("/v1/chat/completions"),
            Some(Api::OpenAiChat)
        );
        assert_eq!(
            Api::recognise("/openai/v1/responses?x=1"),
            Some(Api::OpenAiResponses)
        );
        assert_eq!(Api::recognise("/v1/messages"), Some(Api::AnthropicMessages));
        assert_eq!(Api::recognise("/v1/embeddings"), None);
    }

    #[test]
    fn the_output_is_the_cap_or_the_models_maximum() {
        let config = EstimateConfig {
            models: vec![("big".into(), 100), ("big-2".into(), 200)],
            ..EstimateConfig::default()
        };
        let body = br#"{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#;
        let found = estimate(Api::AnthropicMessages, body, None, &config).expect("estimate");
        assert_eq!((found.output, found.bounded), (50, true));
        assert_eq!(found.input, body.len() as u64 + 8 + 16);
        let body = br#"{"model":"big-2-x","messages":[]}"#;
        let found = estimate(Api::OpenAiChat, body, Some(7), &config).expect("estimate");
        assert_eq!((found.output, found.bounded, found.input), (200, false, 7));
        let error = estimate(Api::OpenAiChat, br#"{"max_tokens":"x"}"#, None, &config)
            .expect_err("refused");
        assert!(error.to_string().starts_with("max_tokens:"), "{error}");
    }
}
