//! Path normalisation and request matching for inbound throttling (seed 002): ids in a path
//! become `#`, so that one rule covers `/entity/123/bundle` and `/entity/456/bundle` alike.

use std::borrow::Cow;

/// Longest `match.path` accepted in a rule, in bytes.
pub const MATCH_PATH_BYTES_MAX: usize = 1024;
/// Longest `match.method` accepted in a rule, in bytes.
pub const MATCH_METHOD_BYTES_MAX: usize = 16;
/// Shortest run of hex digits taken for an id. Shorter runs are too often words ("cafe", "bad").
const HEX_ID_CHARS_MIN: usize = 16;

/// The normalized form of a request path: the query is dropped, empty segments (doubled or
/// trailing slashes) are dropped, and every segment that is an id — all decimal digits, a UUID,
/// or a run of at least 16 hex digits — becomes `#`.
///
/// A path that is already in normal form (most paths without ids) is returned borrowed, so
/// matching a request against the rules costs no allocation.
///
/// ```
/// use tollgate_rules::normalize_path;
/// assert_eq!(normalize_path("/repo/v1/entity/123/bundle?mask=1"), "/repo/v1/entity/#/bundle");
/// assert_eq!(
///     normalize_path("/files/0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00/"),
///     "/files/#"
/// );
/// assert_eq!(normalize_path("/blob/9f86d081884c7d659a2feaa0c55ad015"), "/blob/#");
/// assert_eq!(normalize_path("/v2/users"), "/v2/users");
/// ```
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    let path = path.split_once('?').map_or(path, |(before, _)| before);
    if is_normalized(path) {
        return Cow::Borrowed(path);
    }
    let mut normalized = String::with_capacity(path.len() + 1);
    for segment in path.split('/').filter(|segment| !segment.is_empty()) {
        normalized.push('/');
        if is_id(segment) {
            normalized.push('#');
        } else {
            normalized.push_str(segment);
        }
    }
    if normalized.is_empty() {
        normalized.push('/');
    }
    Cow::Owned(normalized)
}

/// Whether rewriting `path` (query already dropped) would give it back unchanged: `/`, or
/// `/`-separated segments none of which is empty or an id.
fn is_normalized(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let Some(segments) = path.strip_prefix('/') else {
        return false;
    };
    segments
        .split('/')
        .all(|segment| !segment.is_empty() && !is_id(segment))
}

fn is_id(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    bytes.iter().all(u8::is_ascii_digit)
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
                Some(normalize_path(path).into())
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
            assert_eq!(normalize_path(input), expected, "{input:?}");
        }
    }

    /// The rewrite as it was before paths in normal form were borrowed: the reference the
    /// borrowing fast path must agree with.
    fn normalize_by_rewriting(path: &str) -> String {
        let path = path.split_once('?').map_or(path, |(before, _)| before);
        let mut normalized = String::new();
        for segment in path.split('/').filter(|segment| !segment.is_empty()) {
            normalized.push('/');
            normalized.push_str(if is_id(segment) { "#" } else { segment });
        }
        if normalized.is_empty() {
            normalized.push('/');
        }
        normalized
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
            assert!(matches!(normalize_path(path), Cow::Borrowed(_)), "{path:?}");
        }
        assert!(matches!(
            normalize_path("/v2/users?page=2"),
            Cow::Borrowed("/v2/users")
        ));
        // Every path over a small alphabet up to 6 characters: the fast path and the rewrite
        // give the same answer, and a normal form is a fixed point.
        let alphabet = ['/', 'a', '1', '?', '#', 'f'];
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
            let normalized = normalize_path(path);
            assert_eq!(normalized, normalize_by_rewriting(path), "{path:?}");
            assert_eq!(normalize_path(&normalized), normalized, "{path:?}");
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
    }
}
