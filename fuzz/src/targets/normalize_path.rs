//! Path normalisation, as `/v1/check`, the throttle layer and rules' `match.path` use it. A path
//! is refused only for a malformed escape (pointing at its `%`) or bytes that are not UTF-8;
//! otherwise its normal form starts with `/`, holds no query, no empty, `.` or `..` segment and
//! nothing but printable ASCII, normalizes to itself, is what the same path spelled
//! with every character percent-encoded normalizes to, and is what a rule with that `match.path`
//! stores and validates again unchanged.

use std::borrow::Cow;

use tollgate_rules::{
    MATCH_PATH_BYTES_MAX, PathError, RawMatch, RawRule, Validate, normalize_path,
};

/// `path` (no query) with every byte percent-encoded but `/`, `#` and the escapes already there.
fn encode_all(path: &str) -> String {
    let mut encoded = String::new();
    let mut escape = 0;
    for byte in path.bytes() {
        match byte {
            _ if escape > 0 => {
                escape -= 1;
                encoded.push(char::from(byte));
            }
            b'%' => {
                escape = 2;
                encoded.push('%');
            }
            b'/' | b'#' => encoded.push(char::from(byte)),
            _ => encoded.push_str(&format!("%{byte:02x}")),
        }
    }
    encoded
}

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let without_query = path.split_once('?').map_or(path, |(before, _)| before);
    let normal = match normalize_path(path) {
        Ok(normal) => normal,
        Err(PathError::BadEscape { offset }) => {
            assert_eq!(
                without_query.as_bytes().get(offset),
                Some(&b'%'),
                "{path:?}"
            );
            return;
        }
        Err(PathError::NotUtf8 { offset }) => {
            assert!(offset < without_query.len().max(1), "{path:?}");
            return;
        }
        Err(other) => panic!("{other:?}"),
    };
    if let Cow::Borrowed(borrowed) = normal {
        assert_eq!(borrowed, without_query);
    }
    assert!(normal.starts_with('/'), "{normal:?}");
    assert!(!normal.contains('?'), "{normal:?}");
    assert!(normal.bytes().all(|b| b.is_ascii_graphic()), "{normal:?}");
    if normal != "/" {
        for segment in normal[1..].split('/') {
            assert!(
                !segment.is_empty() && segment != "." && segment != "..",
                "segment {segment:?} in {normal:?} from {path:?}"
            );
        }
    }
    let again = normalize_path(&normal).expect("a normal form normalizes");
    assert_eq!(again, normal, "normalized twice");
    let spelled = encode_all(without_query);
    assert_eq!(
        normalize_path(&spelled).as_deref(),
        Ok(&*normal),
        "{spelled:?}, the same path as {path:?}"
    );
    // A rule matching this path stores its normal form, which validates again unchanged.
    if path.starts_with('/')
        && path.len() <= MATCH_PATH_BYTES_MAX
        && !path.chars().any(char::is_control)
    {
        let rule = RawRule {
            kind: Some("rate".into()),
            limit: Some(1),
            period_ms: Some(1_000),
            matcher: Some(RawMatch {
                method: Some("get".into()),
                path: Some(path.into()),
            }),
            ..RawRule::default()
        };
        match rule.validate("paths") {
            Ok(valid) => {
                let canonical = valid.canonical();
                let stored = canonical.matcher.as_ref().and_then(|m| m.path.as_deref());
                assert_eq!(stored, Some(&*normal));
                let reloaded = canonical
                    .validate("paths")
                    .expect("a stored rule validates");
                assert_eq!(reloaded.canonical(), canonical);
                assert!(valid.matcher().is_some_and(|m| m.matches("GET", &normal)));
            }
            Err(error) => {
                assert_eq!(error.field, "match.path");
                assert!(normal.len() > MATCH_PATH_BYTES_MAX, "{error}");
            }
        }
    }
}
