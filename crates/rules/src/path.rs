//! Path normalisation and request matching for inbound throttling (seed 002): a path is
//! brought to the form the application routes, and ids in it become `#`, so that one rule
//! covers `/entity/123/bundle`, `/entity/456/bundle` and `/entity/%34%35%36/bundle` alike.

use std::borrow::Cow;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

/// Longest `match.path` accepted in a rule, in bytes.
pub const MATCH_PATH_BYTES_MAX: usize = 1024;
/// Longest `match.method` accepted in a rule, in bytes.
pub const MATCH_METHOD_BYTES_MAX: usize = 16;
/// Shortest run of hex digits taken for an id. Shorter runs are too often words ("cafe", "bad").
const HEX_ID_CHARS_MIN: usize = 16;

/// What a normalized segment keeps percent-encoded: what a second normalization would
/// otherwise read differently (`%` as an escape, `/` as a separator, `?` as the query, `#` as
/// the id placeholder), and what cannot stand in a path as it is (controls, space). The
/// encoder also encodes every byte outside ASCII.
const KEPT_ENCODED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'/').add(b'?').add(b'#');

/// Why a path cannot be normalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// A `%` that does not start a `%XX` escape.
    #[error("the '%' at byte {offset} is not followed by two hex digits")]
    BadEscape { offset: usize },
    /// A segment whose percent-decoded bytes are not UTF-8.
    #[error("the segment at byte {offset} is not UTF-8 once percent-decoded")]
    NotUtf8 { offset: usize },
}

/// The normalized form of a request path: the path the application routes, with ids as `#`.
///
/// - The query (from the first `?`) is dropped.
/// - Each segment is percent-decoded once (`%65ntity` is `entity`). An encoded slash (`%2F`)
///   stays part of its segment: `/a%2Fb` is one segment, not `/a/b`.
/// - Dot segments `.` and `..` (also spelled `%2E`) are resolved as RFC 3986's
///   remove_dot_segments does: `..` removes the segment before it, even an empty one
///   (`/a//../c` is `/a/c`), and at the root stays at the root.
/// - Empty segments (doubled or trailing slashes) are dropped; the empty path is `/`.
/// - A segment that is an id becomes `#`: a number (an optional `+` or `-`, then decimal
///   digits: `123`, `+123`, `0123` are one id), a UUID, or a run of at least 16 hex digits.
///   Ids are told on the decoded segment, so `%31%32%33` is an id too.
/// - A segment written exactly `#` stays `#`, the id placeholder of rule paths
///   (`/entity/#/bundle`); an encoded `%23` is a `#` character, not the placeholder.
/// - In the result, `%`, `/`, `?`, `#`, space, control characters and bytes outside ASCII
///   are percent-encoded in upper case, so normalizing a normalized path gives it back
///   unchanged.
///
/// A path with a `%` not followed by two hex digits, or whose decoded bytes are not UTF-8,
/// has no meaning to match and is an error. A path already in normal form (most paths
/// without ids) is returned borrowed.
///
/// ```
/// use tollgate_rules::normalize_path;
/// let normal = |path| normalize_path(path).expect("decodable");
/// assert_eq!(normal("/repo/v1/entity/123/bundle?mask=1"), "/repo/v1/entity/#/bundle");
/// assert_eq!(normal("/repo/v1/entity/%2B0123/./bundle/"), "/repo/v1/entity/#/bundle");
/// assert_eq!(normal("/files/0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00"), "/files/#");
/// assert_eq!(normal("/blob/9f86d081884c7d659a2feaa0c55ad015"), "/blob/#");
/// assert_eq!(normal("/a/b/../c%2fd"), "/a/c%2Fd");
/// assert_eq!(normal("/v2/users"), "/v2/users");
/// assert!(normalize_path("/entity/%ZZ").is_err());
/// ```
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    let path = path.split_once('?').map_or(path, |(before, _)| before);
    if is_normalized(path) {
        return Ok(Cow::Borrowed(path));
    }
    rewrite(path).map(Cow::Owned)
}

/// Whether `rewrite(path)` would give `path` back unchanged: `/`, or `/`-separated segments
/// none of which is empty, a dot segment or an id, each exactly `#` or printable ASCII
/// without `%` or `#`. (A path outside ASCII may be in normal form too; it is rewritten.)
fn is_normalized(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let Some(segments) = path.strip_prefix('/') else {
        return false;
    };
    segments.split('/').all(|segment| {
        let plain = segment == "#"
            || segment
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'%' && b != b'#');
        plain && !segment.is_empty() && segment != "." && segment != ".." && !is_id(segment)
    })
}

/// `normalize_path`'s work, on a path without its query.
fn rewrite(path: &str) -> Result<String, PathError> {
    let mut normalized = String::with_capacity(path.len() + 1);
    // Where each segment kept so far starts in `normalized`, empty ones included (they are
    // written as nothing), so that `..` removes the segment before it, even an empty one, as
    // remove_dot_segments does.
    let mut starts: Vec<usize> = Vec::new();
    let rooted = path.strip_prefix('/').unwrap_or(path);
    let mut offset = path.len() - rooted.len();
    for raw in rooted.split('/') {
        let at = offset;
        offset += raw.len() + 1;
        if raw == "#" {
            starts.push(normalized.len());
            normalized.push_str("/#");
            continue;
        }
        let segment = decode(raw, at)?;
        match &*segment {
            "." => {}
            ".." => {
                if let Some(start) = starts.pop() {
                    normalized.truncate(start);
                }
            }
            "" => starts.push(normalized.len()),
            segment => {
                starts.push(normalized.len());
                normalized.push('/');
                if is_id(segment) {
                    normalized.push('#');
                } else {
                    normalized.extend(utf8_percent_encode(segment, KEPT_ENCODED));
                }
            }
        }
    }
    if normalized.is_empty() {
        normalized.push('/');
    }
    Ok(normalized)
}

/// `segment` percent-decoded, refused if an escape is malformed (the decoder would keep it as
/// it is) or the bytes are not UTF-8. `offset`: where the segment starts in the path.
fn decode(segment: &str, offset: usize) -> Result<Cow<'_, str>, PathError> {
    let bytes = segment.as_bytes();
    for (index, _) in segment.match_indices('%') {
        let escape = bytes.get(index + 1..index + 3);
        if !escape.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
            return Err(PathError::BadEscape {
                offset: offset + index,
            });
        }
    }
    percent_decode_str(segment)
        .decode_utf8()
        .map_err(|_| PathError::NotUtf8 { offset })
}

/// Whether a decoded segment is an id: a number in any spelling, a UUID, a long hex run.
fn is_id(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    let digits = bytes
        .strip_prefix(b"+")
        .or_else(|| bytes.strip_prefix(b"-"))
        .unwrap_or(bytes);
    (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
        || is_uuid(bytes)
        || (bytes.len() >= HEX_ID_CHARS_MIN && bytes.iter().all(u8::is_ascii_hexdigit))
}

fn is_uuid(bytes: &[u8]) -> bool {
    // 8-4-4-4-12 hex digits.
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(index, byte)| match index {
            8 | 13 | 18 | 23 => *byte == b'-',
            _ => byte.is_ascii_hexdigit(),
        })
}

/// Which requests a rule applies to: a method (or any) and a normalized path (or any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// Upper-case method; `None` for `*`.
    method: Option<Box<str>>,
    /// Normalized path; `None` for `*`.
    path: Option<Box<str>>,
}

impl Match {
    /// Validate and normalize a method and path; errors name the field.
    pub(crate) fn new(method: &str, path: &str) -> Result<Match, (&'static str, String)> {
        let method = match method {
            "*" => None,
            _ => {
                if method.is_empty()
                    || method.len() > MATCH_METHOD_BYTES_MAX
                    || !method.bytes().all(|b| b.is_ascii_alphabetic())
                {
                    return Err((
                        "match.method",
                        format!(
                            "must be an HTTP method (letters, at most {MATCH_METHOD_BYTES_MAX}) or \"*\""
                        ),
                    ));
                }
                Some(method.to_ascii_uppercase().into())
            }
        };
        let path = match path {
            "*" => None,
            _ => {
                if !path.starts_with('/') {
                    return Err(("match.path", "must start with '/' or be \"*\"".into()));
                }
                if path.len() > MATCH_PATH_BYTES_MAX {
                    return Err((
                        "match.path",
                        format!("must be at most {MATCH_PATH_BYTES_MAX} bytes"),
                    ));
                }
                if path.chars().any(char::is_control) {
                    return Err(("match.path", "must not contain control characters".into()));
                }
                let normalized =
                    normalize_path(path).map_err(|error| ("match.path", error.to_string()))?;
                // Stored normalized and validated again on every reload: what is stored must
                // pass this check too.
                if normalized.len() > MATCH_PATH_BYTES_MAX {
                    return Err((
                        "match.path",
                        format!("must be at most {MATCH_PATH_BYTES_MAX} bytes once normalized"),
                    ));
                }
                Some(normalized.into())
            }
        };
        Ok(Match { method, path })
    }

    /// `*` or the upper-case method.
    pub fn method(&self) -> &str {
        self.method.as_deref().unwrap_or("*")
    }

    /// `*` or the normalized path.
    pub fn path(&self) -> &str {
        self.path.as_deref().unwrap_or("*")
    }

    /// Whether a request with `method` on `normalized_path` (see [`normalize_path`]) matches.
    pub fn matches(&self, method: &str, normalized_path: &str) -> bool {
        let method_ok = self
            .method
            .as_deref()
            .is_none_or(|wanted| wanted.eq_ignore_ascii_case(method));
        let path_ok = self
            .path
            .as_deref()
            .is_none_or(|wanted| wanted == normalized_path);
        method_ok && path_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `normalize_path`'s answer, owned, or why it refused.
    fn normalized(path: &str) -> Result<String, String> {
        normalize_path(path)
            .map(Cow::into_owned)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn ids_become_hashes_and_words_stay() {
        let cases = [
            ("", "/"),
            ("/", "/"),
            ("//a//b/", "/a/b"),
            ("/entity/123/bundle", "/entity/#/bundle"),
            ("/entity/syn123/bundle", "/entity/syn123/bundle"),
            ("/a/0/b/18446744073709551616", "/a/#/b/#"),
            ("/x/0B2F7A4E-91C4-4F57-9D6A-3E1C2B9A8F00", "/x/#"),
            ("/x/0b2f7a4e91c44f579d6a3e1c2b9a8f00", "/x/#"),
            ("/x/deadbeef", "/x/deadbeef"),
            ("/x/507f1f77bcf86cd799439011/y", "/x/#/y"),
            ("/search?q=123", "/search"),
            ("/entity/#/bundle", "/entity/#/bundle"),
        ];
        for (input, expected) in cases {
            assert_eq!(normalized(input).as_deref(), Ok(expected), "{input:?}");
        }
    }

    #[test]
    fn every_spelling_of_a_path_normalizes_alike() {
        let cases = [
            // Numbers, whatever their spelling.
            (
                "/repo/v1/entity/%31%32%33/bundle",
                "/repo/v1/entity/#/bundle",
            ),
            ("/repo/v1/entity/+123/bundle", "/repo/v1/entity/#/bundle"),
            ("/repo/v1/entity/0123/bundle", "/repo/v1/entity/#/bundle"),
            ("/repo/v1/entity/%2B123/bundle", "/repo/v1/entity/#/bundle"),
            ("/repo/v1/entity/%2b123/bundle", "/repo/v1/entity/#/bundle"),
            ("/x/-7", "/x/#"),
            ("/x/+", "/x/+"),
            ("/x/1.5", "/x/1.5"),
            ("/x/%30b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00", "/x/#"),
            // Letters, encoded or not.
            ("/repo/v1/%65ntity/1/bundle", "/repo/v1/entity/#/bundle"),
            ("/x/%7e%7E", "/x/~~"),
            ("/x/caf%c3%a9", "/x/caf%C3%A9"),
            ("/x/caf\u{e9}", "/x/caf%C3%A9"),
            // An encoded slash is part of its segment, not a separator.
            ("/a%2Fb", "/a%2Fb"),
            ("/a%2fb", "/a%2Fb"),
            ("/a/%2F/b", "/a/%2F/b"),
            ("/a/%2F1", "/a/%2F1"),
            // Dot segments, plain or encoded.
            ("/a/./b", "/a/b"),
            ("/a/../b", "/b"),
            ("/a/b/..", "/a"),
            ("/../a", "/a"),
            ("/..", "/"),
            ("/a/%2E%2E/b", "/b"),
            ("/a/%2e/b", "/a/b"),
            ("/a/.%2E/b", "/b"),
            ("/repo/v1/entity/./123/bundle", "/repo/v1/entity/#/bundle"),
            ("/a/b/./../c", "/a/c"),
            ("/a//../c", "/a/c"),
            ("/a/b//../c", "/a/b/c"),
            ("/a/..b/.c", "/a/..b/.c"),
            // What would be read differently the second time stays encoded.
            ("/x/%23", "/x/%23"),
            ("/x/a#b", "/x/a%23b"),
            ("/x/%25", "/x/%25"),
            ("/x/%2523", "/x/%2523"),
            ("/x/%3F", "/x/%3F"),
            ("/x/a%20b", "/x/a%20b"),
            ("/x/a b", "/x/a%20b"),
            ("/x/%0a", "/x/%0A"),
            ("/x/%C2%85", "/x/%C2%85"),
            // The query is not part of the path, and is not decoded.
            ("/x/%31?q=%ZZ", "/x/#"),
        ];
        for (input, expected) in cases {
            assert_eq!(normalized(input).as_deref(), Ok(expected), "{input:?}");
            assert_eq!(
                normalized(expected).as_deref(),
                Ok(expected),
                "{expected:?}"
            );
        }
        assert_ne!(normalized("/a%2Fb"), normalized("/a/b"));
    }

    #[test]
    fn paths_that_cannot_be_decoded_are_refused() {
        for path in [
            "/x/%ZZ",
            "/x/%",
            "/x/%2",
            "/x/%2/y",
            "/x/%G1",
            "/x/%C3",
            "/x/%FF",
            "/x/%C3%28",
            "/%ED%A0%80",
        ] {
            assert!(normalized(path).is_err(), "{path:?}");
        }
    }

    /// Every character of `path` outside `/`, `#` and escapes percent-encoded, in upper case
    /// or lower, the query left as it is: the same path to whoever decodes it.
    fn encode_all(path: &str, upper: bool) -> String {
        let (path, query) = match path.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (path, None),
        };
        let mut encoded = String::new();
        let mut escape = 0;
        for c in path.chars() {
            match c {
                _ if escape > 0 => {
                    escape -= 1;
                    encoded.push(c);
                }
                '%' => {
                    escape = 2;
                    encoded.push(c);
                }
                '/' | '#' => encoded.push(c),
                c if upper => encoded.push_str(&format!("%{:02X}", u32::from(c))),
                c => encoded.push_str(&format!("%{:02x}", u32::from(c))),
            }
        }
        if let Some(query) = query {
            encoded.push('?');
            encoded.push_str(query);
        }
        encoded
    }

    #[test]
    fn paths_in_normal_form_are_borrowed_and_agree_with_the_rewrite() {
        let borrowed = [
            "/",
            "/v2/users",
            "/entity/#/bundle",
            "/x/deadbeef",
            "/a/syn1",
        ];
        for path in borrowed {
            assert!(
                matches!(normalize_path(path), Ok(Cow::Borrowed(_))),
                "{path:?}"
            );
        }
        assert!(matches!(
            normalize_path("/v2/users?page=2"),
            Ok(Cow::Borrowed("/v2/users"))
        ));
        // Every path over a small alphabet up to 6 characters: the fast path and the rewrite
        // give the same answer, a normal form is a fixed point, and the path spelled with
        // every character encoded normalizes alike.
        let alphabet = ['/', 'a', '1', '?', '#', 'f', '%', '2', 'F', '.', '+'];
        let mut paths = vec![String::new()];
        for _ in 0..6 {
            let longer: Vec<String> = paths
                .iter()
                .filter(|path| path.len() == paths.last().map_or(0, String::len))
                .flat_map(|path| alphabet.iter().map(move |c| format!("{path}{c}")))
                .collect();
            paths.extend(longer);
        }
        for path in &paths {
            let without_query = path
                .split_once('?')
                .map_or(path.as_str(), |(before, _)| before);
            let rewritten = rewrite(without_query);
            match normalize_path(path) {
                Ok(Cow::Borrowed(borrowed)) => {
                    assert_eq!(borrowed, without_query, "{path:?}");
                    assert_eq!(rewritten.as_deref(), Ok(borrowed), "{path:?}");
                }
                owned => assert_eq!(owned.map(Cow::into_owned), rewritten, "{path:?}"),
            }
            let Ok(normal) = normalized(path) else {
                continue;
            };
            assert_eq!(normalized(&normal).as_ref(), Ok(&normal), "{path:?}");
            for upper in [true, false] {
                let spelled = encode_all(path, upper);
                assert_eq!(normalized(&spelled).as_ref(), Ok(&normal), "{spelled:?}");
            }
        }
    }

    #[test]
    fn matches_method_and_path_or_any() {
        let rule = Match::new("get", "/entity/42/bundle").expect("valid");
        assert_eq!(rule.method(), "GET");
        assert_eq!(rule.path(), "/entity/#/bundle");
        assert!(rule.matches("GET", "/entity/#/bundle"));
        assert!(rule.matches("get", "/entity/#/bundle"));
        assert!(!rule.matches("POST", "/entity/#/bundle"));
        assert!(!rule.matches("GET", "/entity/#"));
        let any = Match::new("*", "*").expect("valid");
        assert!(any.matches("DELETE", "/whatever"));
        let spelled = Match::new("GET", "/entity/%2B42/./bundle").expect("valid");
        assert_eq!(spelled.path(), "/entity/#/bundle");
    }

    #[test]
    fn bad_matches_name_their_field() {
        assert_eq!(Match::new("", "/").map_err(|e| e.0), Err("match.method"));
        assert_eq!(
            Match::new("G ET", "/").map_err(|e| e.0),
            Err("match.method")
        );
        assert_eq!(
            Match::new("GET", "relative").map_err(|e| e.0),
            Err("match.path")
        );
        let long = format!("/{}", "a".repeat(MATCH_PATH_BYTES_MAX));
        assert_eq!(Match::new("GET", &long).map_err(|e| e.0), Err("match.path"));
        assert_eq!(
            Match::new("GET", "/entity/%ZZ").map_err(|e| e.0),
            Err("match.path")
        );
    }
}
