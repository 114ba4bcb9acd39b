//! The shared test vectors of estimating a language-model request (`vectors/llm_estimate.json`)
//! and of reading its answer's usage (`vectors/llm_usage.json`), which the Python and
//! TypeScript clients read too, so that every implementation charges a call alike.

use serde_json::{Value, json};
use tollgate_dispatch::llm::{Api, EstimateConfig, Usage, UsageReader, estimate};

const ESTIMATE: &str = include_str!("vectors/llm_estimate.json");
const USAGE: &str = include_str!("vectors/llm_usage.json");

fn api_name(api: Api) -> &'static str {
    match api {
        Api::OpenAiChat => "chat",
        Api::OpenAiResponses => "responses",
        Api::AnthropicMessages => "messages",
    }
}

fn api_of(name: &str) -> Api {
    match name {
        "chat" => Api::OpenAiChat,
        "responses" => Api::OpenAiResponses,
        "messages" => Api::AnthropicMessages,
        other => panic!("unknown api {other:?}"),
    }
}

/// The top-level config with a case's fields laid over it.
fn config_of(base: &Value, case: &Value) -> EstimateConfig {
    let mut fields = base.as_object().expect("config").clone();
    if let Some(over) = case["config"].as_object() {
        fields.extend(over.clone());
    }
    let number = |name: &str| fields[name].as_u64().expect("a config number");
    EstimateConfig {
        output_default: number("output_default"),
        models: fields["models"]
            .as_object()
            .expect("models")
            .iter()
            .map(|(prefix, most)| (prefix.clone(), most.as_u64().expect("a model's maximum")))
            .collect(),
        per_message: number("per_message"),
        per_request: number("per_request"),
    }
}

#[test]
fn requests_are_estimated_as_the_vectors_say() {
    let vectors: Value = serde_json::from_str(ESTIMATE).expect("the vectors file is JSON");
    let cases = vectors["cases"].as_array().expect("cases");
    assert!(cases.len() >= 30, "the vectors were read");
    // Every case is tried, and every disagreement listed.
    let mut wrong = Vec::new();
    for case in cases {
        let name = &case["name"];
        let path = case["path"].as_str().expect("path");
        let expect = &case["expect"];
        let api = Api::recognise(path);
        if api.map(api_name) != expect["api"].as_str() {
            wrong.push(format!(
                "{name}: the API of {path}: {:?}",
                api.map(api_name)
            ));
            continue;
        }
        let Some(api) = api else { continue };
        let body = case["body"].as_str().expect("body").as_bytes();
        let config = config_of(&vectors["config"], case);
        let found = estimate(api, body, case["input_tokens"].as_u64(), &config);
        match expect["error"].as_str() {
            Some(field) => match found {
                Err(error) if error.to_string().starts_with(&format!("{field}: ")) => {}
                other => wrong.push(format!("{name}: {other:?}, not an error naming {field}")),
            },
            None => match found {
                Ok(found) => {
                    let got = json!({"api": api_name(api), "input": found.input,
                        "output": found.output, "bounded": found.bounded, "stream": found.stream});
                    if &got != expect {
                        wrong.push(format!("{name}: {got}, not {expect}"));
                    }
                }
                Err(error) => wrong.push(format!("{name}: {error}")),
            },
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn as_json(usage: Usage) -> Value {
    json!({"input": usage.input, "output": usage.output, "streamed": usage.streamed,
        "finished": usage.finished, "failed": usage.failed})
}

fn read(api: Api, events: bool, chunks: &[&[u8]]) -> Usage {
    let mut reader = UsageReader::new(api, events);
    for chunk in chunks {
        reader.feed(chunk);
    }
    reader.end();
    reader.usage()
}

#[test]
fn answers_are_read_as_the_vectors_say_however_they_are_cut() {
    let vectors: Value = serde_json::from_str(USAGE).expect("the vectors file is JSON");
    let cases = vectors["cases"].as_array().expect("cases");
    assert!(cases.len() >= 30, "the vectors were read");
    let mut wrong = Vec::new();
    for case in cases {
        let name = &case["name"];
        let api = api_of(case["api"].as_str().expect("api"));
        let events = case["events"].as_bool().expect("events");
        let body = case["body"].as_str().expect("body").as_bytes();
        let whole = read(api, events, &[body]);
        if as_json(whole) != case["expect"] {
            wrong.push(format!(
                "{name}: {}, not {}",
                as_json(whole),
                case["expect"]
            ));
            continue;
        }
        // Chunks split anywhere, mid-line or mid-character, read the same.
        for at in 0..=body.len() {
            let (head, tail) = body.split_at(at);
            assert_eq!(
                read(api, events, &[head, tail]),
                whole,
                "{name}: split at {at}"
            );
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(read(api, events, &bytes), whole, "{name}: byte by byte");
        // Cut at any byte: read without fault, never more text than the whole.
        for at in 0..body.len() {
            let cut = read(api, events, &[&body[..at]]);
            assert!(cut.streamed <= whole.streamed, "{name}: cut at {at}");
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
