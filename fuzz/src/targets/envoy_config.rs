//! envoyproxy/ratelimit's YAML, read as `tollgate serve --envoy-config` reads it (a NUL byte
//! separates files of one directory). A refusal names its file and says why; a configuration
//! read is read the same again, and every limit in it is a counter the store and the restart
//! bookkeeping accept, named apart from every other limit's.

use std::collections::HashMap;

use tollgate_envoy::Config;

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let files: Vec<(String, &str)> = text
        .split('\0')
        .take(4)
        .enumerate()
        .map(|(index, text)| (format!("{index}.yaml"), text))
        .collect();
    let read = || Config::parse(files.iter().map(|(name, text)| (name.as_str(), *text)));
    let config = match read() {
        Ok(config) => config,
        Err(error) => {
            assert!(files.iter().any(|(name, _)| *name == error.file), "{error}");
            assert!(!error.reason.is_empty(), "{error}");
            return;
        }
    };
    assert_eq!(read().as_ref(), Ok(&config), "read twice");
    for domain in config.domains() {
        assert!(!domain.is_empty());
        assert!(config.domain(domain).is_some());
    }
    let mut names = HashMap::new();
    for (name, policy) in config.counters() {
        assert!(name.starts_with("envoy."), "{name}");
        tollgate::Limit::new(&name, policy, Some("descriptor"))
            .unwrap_or_else(|error| panic!("counter {name}: {error}"));
        if let Some(other) = names.insert(name.clone(), policy) {
            panic!("two limits of the tree are counted as {name} ({other:?} and {policy:?})");
        }
    }
}
