//! Limits files (TOML or YAML, as `file://` rules sources and `tollgate limits apply` read
//! them). A file refused whole says why; an entry refused alone names its field; names come
//! back in order, once each; and the valid limits, exported by `render_limits` in either
//! format and read again, are the same limits.

use tollgate_rules::{FileFormat, RawRule, Validate, parse_limits, render_limits};

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(data: &[u8]) {
    let Some((&choice, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let format = if choice & 1 == 0 {
        FileFormat::Toml
    } else {
        FileFormat::Yaml
    };
    let rows = match parse_limits(text, format) {
        Ok(rows) => rows,
        Err(reason) => {
            assert!(!reason.is_empty());
            return;
        }
    };
    assert!(
        rows.windows(2).all(|pair| pair[0].name < pair[1].name),
        "names in order, once each"
    );
    let mut canonical: Vec<RawRule> = Vec::new();
    for row in &rows {
        let rule = row
            .rule
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|raw| raw.validate(&row.name));
        match rule {
            Ok(rule) => canonical.push(rule.canonical().clone()),
            Err(error) => {
                assert!(!error.field.is_empty(), "{}: {error}", row.name);
                assert!(!error.reason.is_empty(), "{}: {error}", row.name);
            }
        }
    }
    for format in [FileFormat::Toml, FileFormat::Yaml] {
        let exported = render_limits(&canonical, format)
            .unwrap_or_else(|error| panic!("{format:?} export of {canonical:?}: {error}"));
        let back: Vec<RawRule> = parse_limits(&exported, format)
            .unwrap_or_else(|error| panic!("{format:?} export read back: {error}\n{exported}"))
            .into_iter()
            .map(|row| {
                let raw = row
                    .rule
                    .unwrap_or_else(|error| panic!("{format:?} {}: {error}\n{exported}", row.name));
                raw.validate(&row.name)
                    .unwrap_or_else(|error| panic!("{format:?} {}: {error}\n{exported}", row.name))
                    .canonical()
                    .clone()
            })
            .collect();
        assert_eq!(back, canonical, "{format:?} export read back:\n{exported}");
    }
}
