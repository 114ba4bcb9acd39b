//! Path normalisation and request matching for inbound throttling (the throttle-table scenario,
//! docs/guarantees.md): a path is brought to the form the application routes, and ids in it become
//! `#`, so that one rule covers `/entity/123/bundle`, `/entity/456/bundle` and
//! `/entity/%34%35%36/bundle` alike.
//!
//! What "the form the application routes" is depends on the router behind: whether letter case
//! matters and whether `;` starts a segment's parameters are [`PathMatching`], a setting of the
//! rule set that `/v1/check` and the tower layer both apply. A rule on GET matches HEAD too
//! ([`method_matches`]): routers serve HEAD with the GET handler.

use std::borrow::Cow;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

pub use tollgate_api::rule::{MATCH_METHOD_BYTES_MAX, MATCH_PATH_BYTES_MAX};
/// Shortest run of hex digits taken for an id. Shorter runs are too often words ("cafe", "bad").
const HEX_ID_CHARS_MIN: usize = 16;

/// What a normalized segment keeps percent-encoded: what a second normalization would
/// otherwise read differently (`%` as an escape, `/` as a separator, `?` as the query, `#` as
/// the id placeholder), and what cannot stand in a path as it is (controls, space). The
/// encoder also encodes every byte outside ASCII.
const KEPT_ENCODED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'/').add(b'?').add(b'#');
/// `KEPT_ENCODED` when `;` starts parameters: an encoded `%3B` is a `;` character, which a
/// second normalization would otherwise take for the start of parameters.
const KEPT_ENCODED_PARAMS: &AsciiSet = &KEPT_ENCODED.add(b';');

/// Whether letter case tells paths apart, as the router behind reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PathCase {
    /// `/Users` and `/users` are different paths (axum, actix-web, Express's strict routing,
    /// most routers).
    #[default]
    Sensitive,
    /// Letters compare without case (ASP.NET, Spring with a case-insensitive matcher): every
    /// segment is matched lower-cased (Unicode lower case), rule paths alike.
    Insensitive,
}

/// What a `;` in a path segment is, as the router behind reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PathParams {
    /// An ordinary character: `/a;v=1` is the segment `a;v=1` (axum, actix-web, most routers).
    #[default]
    Keep,
    /// It starts the segment's parameters (RFC 3986 §3.3), which are dropped before matching:
    /// `/entity/12;jsessionid=x/bundle` is `/entity/#/bundle`, and `/a/..;/b` is `/b` (Java
    /// servlet containers, Spring). An encoded `%3B` stays a `;` character.
    Strip,
}

impl PathCase {
    /// `sensitive` or `insensitive`.
    pub fn parse(text: &str) -> Result<PathCase, String> {
        match text {
            "sensitive" => Ok(PathCase::Sensitive),
            "insensitive" => Ok(PathCase::Insensitive),
            other => Err(format!(
                "must be \"sensitive\" or \"insensitive\", got {other:?}"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PathCase::Sensitive => "sensitive",
            PathCase::Insensitive => "insensitive",
        }
    }
}

impl PathParams {
    /// `keep` or `strip`.
    pub fn parse(text: &str) -> Result<PathParams, String> {
        match text {
            "keep" => Ok(PathParams::Keep),
            "strip" => Ok(PathParams::Strip),
            other => Err(format!("must be \"keep\" or \"strip\", got {other:?}")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PathParams::Keep => "keep",
            PathParams::Strip => "strip",
        }
    }
}

/// How request paths are read before they are matched: the choices of the router behind the
/// rules. The default (case-sensitive, `;` an ordinary character) is how axum and most routers
/// read a path. A setting of the rule set: `/v1/check` and the tower layer normalize requests
/// with the rule set's, and read rule paths the same way, so both match alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PathMatching {
    pub case: PathCase,
    pub params: PathParams,
}

impl PathMatching {
    /// [`normalize_path`], read as this router reads paths.
    pub fn normalize(self, path: &str) -> Result<Cow<'_, str>, PathError> {
        let path = path.split_once('?').map_or(path, |(before, _)| before);
        if is_normalized(path, self) {
            return Ok(Cow::Borrowed(path));
        }
        rewrite(path, self).map(Cow::Owned)
    }

    /// A rule's normalized path (`Match::path`) as requests read this way are compared with
    /// it: lower-cased, or its parameters dropped, as this router would read it.
    pub fn rule_path(self, normalized: &str) -> Cow<'_, str> {
        // A rule's path is in normal form, which decodes whatever the options: the fallback
        // is never taken.
        self.normalize(normalized)
            .unwrap_or(Cow::Borrowed(normalized))
    }
}

/// Whether a rule on `wanted` (`*`, or a method as the rule names it) applies to a request
/// with `method`. Methods compare without case, and a rule on GET also applies to HEAD: axum,
/// hyper's services and most routers answer HEAD with the GET handler, so a HEAD runs what a
/// GET runs and spends what it spends. A rule on HEAD applies to HEAD alone.
pub fn method_matches(wanted: &str, method: &str) -> bool {
    wanted == "*"
        || wanted.eq_ignore_ascii_case(method)
        || (wanted.eq_ignore_ascii_case("GET") && method.eq_ignore_ascii_case("HEAD"))
}

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
///   digits: `123`, `+123`, `0123` are one id), a UUID in any form a UUID parser reads
///   (`0b2f7a4e-91c4-…`, braced `{0b2f7a4e-91c4-…}`, `urn:uuid:0b2f7a4e-91c4-…`, 32 hex
///   digits, braced or not), or a run of at least 16 hex digits. Ids are told on the decoded
///   segment, so `%31%32%33` and `%7B…%7D` are ids too.
/// - `\` is an ordinary character, never a separator: `/a\b` is one segment, as axum and
///   RFC 3986 read it.
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
///
/// This is the default reading ([`PathMatching::default`]): see [`PathMatching::normalize`]
/// for routers that ignore case or take `;` for parameters.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    PathMatching::default().normalize(path)
}

/// `path` (its query cut) as a server that decodes the whole path before routing it reads
/// its separators: every `%2F` a `/` and every `%2E` a `.`, other escapes left as they are for
/// [`PathMatching::normalize`] to decode. `None` when the path has neither escape, so that it
/// reads the same either way.
///
/// [`normalize_path`] keeps an encoded slash inside its segment, as axum and RFC 3986 do; but
/// WSGI and ASGI servers (Flask, Django, FastAPI, Starlette) route on the decoded path, and
/// nginx's `proxy_pass` with a URI sends the decoded, normalised path on. Matched as this
/// returns it, `/items%2F1` is `/items/#` and `/x/..%2Fitems/1` is `/items/#`.
///
/// ```
/// use tollgate_rules::{decoded_separators, normalize_path};
/// let decoded = decoded_separators("/x/..%2fitems%2F1?q=%2F").expect("escapes");
/// assert_eq!(decoded, "/x/../items/1");
/// assert_eq!(normalize_path(&decoded).expect("decodable"), "/items/#");
/// assert_eq!(decoded_separators("/items/%31"), None);
/// ```
pub fn decoded_separators(path: &str) -> Option<String> {
    let path = path.split_once('?').map_or(path, |(before, _)| before);
    let bytes = path.as_bytes();
    let escape_at = |index: usize| -> Option<u8> {
        match (bytes.get(index + 1), bytes.get(index + 2)) {
            (Some(b'2'), Some(b'f' | b'F')) => Some(b'/'),
            (Some(b'2'), Some(b'e' | b'E')) => Some(b'.'),
            _ => None,
        }
    };
    // Escapes are read left to right, three bytes each, as a decoder reads them: `%252F` is
    // `%25` then `2F`, not an encoded slash.
    let mut decoded: Option<Vec<u8>> = None;
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte != b'%' {
            if let Some(out) = decoded.as_mut() {
                out.push(byte);
            }
            index += 1;
            continue;
        }
        match escape_at(index) {
            Some(separator) => {
                decoded
                    .get_or_insert_with(|| bytes[..index].to_vec())
                    .push(separator);
            }
            None => {
                if let Some(out) = decoded.as_mut() {
                    out.extend_from_slice(&bytes[index..(index + 3).min(bytes.len())]);
                }
            }
        }
        index += 3;
    }
    // Only ASCII bytes were put in place of ASCII escapes: still UTF-8.
    decoded.and_then(|bytes| String::from_utf8(bytes).ok())
}

/// Whether `rewrite(path, matching)` would give `path` back unchanged: `/`, or `/`-separated
/// segments none of which is empty, a dot segment or an id, each exactly `#` or printable
/// ASCII without `%` or `#` (nor `;` when it starts parameters, nor upper case when case is
/// ignored). (A path outside ASCII may be in normal form too; it is rewritten.)
fn is_normalized(path: &str, matching: PathMatching) -> bool {
    if path == "/" {
        return true;
    }
    let Some(segments) = path.strip_prefix('/') else {
        return false;
    };
    let strip = matching.params == PathParams::Strip;
    let lower = matching.case == PathCase::Insensitive;
    segments.split('/').all(|segment| {
        let plain = segment == "#"
            || segment.bytes().all(|b| {
                b.is_ascii_graphic()
                    && b != b'%'
                    && b != b'#'
                    && !(strip && b == b';')
                    && !(lower && b.is_ascii_uppercase())
            });
        plain && !segment.is_empty() && segment != "." && segment != ".." && !is_id(segment)
    })
}

/// `segment` lower-cased (Unicode lower case), borrowed when it has no upper case.
fn lower_case(segment: Cow<'_, str>) -> Cow<'_, str> {
    if segment.is_ascii() {
        if !segment.bytes().any(|b| b.is_ascii_uppercase()) {
            return segment;
        }
        return Cow::Owned(segment.to_ascii_lowercase());
    }
    let lowered = segment.to_lowercase();
    if lowered == *segment {
        segment
    } else {
        Cow::Owned(lowered)
    }
}

/// `normalize_path`'s work, on a path without its query.
fn rewrite(path: &str, matching: PathMatching) -> Result<String, PathError> {
    let kept = match matching.params {
        PathParams::Keep => KEPT_ENCODED,
        PathParams::Strip => KEPT_ENCODED_PARAMS,
    };
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
        // Parameters are cut before decoding: an encoded `%3B` is not their start.
        let raw = match matching.params {
            PathParams::Keep => raw,
            PathParams::Strip => raw.split_once(';').map_or(raw, |(segment, _)| segment),
        };
        if raw == "#" {
            starts.push(normalized.len());
            normalized.push_str("/#");
            continue;
        }
        let mut segment = decode(raw, at)?;
        if matching.case == PathCase::Insensitive {
            segment = lower_case(segment);
        }
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
                    normalized.extend(utf8_percent_encode(segment, kept));
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

/// Whether a decoded segment is an id: a number in any spelling, a UUID in any of its forms,
/// a long hex run.
fn is_id(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    let digits = bytes
        .strip_prefix(b"+")
        .or_else(|| bytes.strip_prefix(b"-"))
        .unwrap_or(bytes);
    (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
        || is_uuid(bytes)
        || is_hex_run(bytes)
        || bytes
            .strip_prefix(b"{")
            .and_then(|inner| inner.strip_suffix(b"}"))
            .is_some_and(|inner| is_uuid(inner) || is_simple_uuid(inner))
        || bytes
            .get(..URN_UUID.len())
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case(URN_UUID))
            && is_uuid(&bytes[URN_UUID.len()..])
}

/// The URN form of a UUID (RFC 9562) starts with this, in any case.
const URN_UUID: &[u8] = b"urn:uuid:";

fn is_hex_run(bytes: &[u8]) -> bool {
    bytes.len() >= HEX_ID_CHARS_MIN && bytes.iter().all(u8::is_ascii_hexdigit)
}

/// 32 hex digits: a UUID without its hyphens.
fn is_simple_uuid(bytes: &[u8]) -> bool {
    bytes.len() == 32 && bytes.iter().all(u8::is_ascii_hexdigit)
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

    /// Whether a request with `method` on `normalized_path` (see [`normalize_path`]) matches:
    /// the method as [`method_matches`] compares it, the path equal to the rule's.
    pub fn matches(&self, method: &str, normalized_path: &str) -> bool {
        self.matches_method(method)
            && self
                .path
                .as_deref()
                .is_none_or(|wanted| wanted == normalized_path)
    }

    /// Whether a request with `method` matches the rule's method (see [`method_matches`]).
    pub fn matches_method(&self, method: &str) -> bool {
        method_matches(self.method(), method)
    }

    /// The rule's path as requests normalized with `matching` are compared with it; `None`
    /// for `*`.
    pub fn path_key(&self, matching: PathMatching) -> Option<Cow<'_, str>> {
        self.path.as_deref().map(|path| matching.rule_path(path))
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
        // Under each reading, a path already in its normal form is borrowed, not rewritten:
        // `;` is plain unless parameters are stripped, upper case unless case is ignored.
        for (case, params, path) in [
            (PathCase::Sensitive, PathParams::Keep, "/Users/a;v=1"),
            (PathCase::Insensitive, PathParams::Keep, "/users/a;v=1"),
            (PathCase::Sensitive, PathParams::Strip, "/Users/a"),
            (PathCase::Insensitive, PathParams::Strip, "/users/a"),
        ] {
            let matching = PathMatching { case, params };
            assert!(
                matches!(matching.normalize(path), Ok(Cow::Borrowed(_))),
                "{path:?} under {matching:?}"
            );
        }
        // Every path over a small alphabet up to 6 characters: the fast path and the rewrite
        // give the same answer, a normal form is a fixed point, and the path spelled with
        // every character encoded normalizes alike.
        let paths = every_path(&['/', 'a', '1', '?', '#', 'f', '%', '2', 'F', '.', '+'], 6);
        for path in &paths {
            let without_query = path
                .split_once('?')
                .map_or(path.as_str(), |(before, _)| before);
            let rewritten = rewrite(without_query, PathMatching::default());
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
    fn uuids_are_ids_in_every_form_a_uuid_parser_reads() {
        for segment in [
            "0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00",
            "{0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00}",
            "%7B0B2F7A4E-91C4-4F57-9D6A-3E1C2B9A8F00%7D",
            "%7b0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00%7d",
            "{0b2f7a4e91c44f579d6a3e1c2b9a8f00}",
            "0b2f7a4e91c44f579d6a3e1c2b9a8f00",
            "urn:uuid:0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00",
            "URN:UUID:0B2F7A4E-91C4-4F57-9D6A-3E1C2B9A8F00",
            "urn%3Auuid%3A0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00",
        ] {
            let path = format!("/files/{segment}/meta");
            assert_eq!(normalized(&path).as_deref(), Ok("/files/#/meta"), "{path}");
        }
        // Braces or a prefix around something else are not an id.
        for (path, expected) in [
            ("/x/{}", "/x/{}"),
            ("/x/{cafe}", "/x/{cafe}"),
            (
                "/x/{0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00",
                "/x/{0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00",
            ),
            (
                "/x/{{0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00}}",
                "/x/{{0b2f7a4e-91c4-4f57-9d6a-3e1c2b9a8f00}}",
            ),
            ("/x/urn:uuid:", "/x/urn:uuid:"),
            ("/x/urn:uuid:12", "/x/urn:uuid:12"),
            ("/x/{id}", "/x/{id}"),
        ] {
            assert_eq!(normalized(path).as_deref(), Ok(expected), "{path}");
        }
    }

    #[test]
    fn a_backslash_is_an_ordinary_character() {
        for (path, expected) in [
            ("/a\\b", "/a\\b"),
            ("/a%5Cb", "/a\\b"),
            ("/entity\\12/bundle", "/entity\\12/bundle"),
            ("/a/..\\b", "/a/..\\b"),
        ] {
            assert_eq!(normalized(path).as_deref(), Ok(expected), "{path}");
        }
    }

    const INSENSITIVE: PathMatching = PathMatching {
        case: PathCase::Insensitive,
        params: PathParams::Keep,
    };
    const STRIP: PathMatching = PathMatching {
        case: PathCase::Sensitive,
        params: PathParams::Strip,
    };
    const BOTH: PathMatching = PathMatching {
        case: PathCase::Insensitive,
        params: PathParams::Strip,
    };
    const EVERY_READING: [PathMatching; 4] = [
        PathMatching {
            case: PathCase::Sensitive,
            params: PathParams::Keep,
        },
        INSENSITIVE,
        STRIP,
        BOTH,
    ];

    #[test]
    fn case_and_parameters_are_read_as_the_router_reads_them() {
        let cases = [
            // Case: kept by default, lower-cased when ignored (escapes stay upper case).
            (
                PathMatching::default(),
                "/Repo/V1/Entity/12/Bundle",
                "/Repo/V1/Entity/#/Bundle",
            ),
            (
                INSENSITIVE,
                "/Repo/V1/Entity/12/Bundle",
                "/repo/v1/entity/#/bundle",
            ),
            (INSENSITIVE, "/%52epo/x", "/repo/x"),
            (INSENSITIVE, "/CAF%C3%89", "/caf%C3%A9"),
            (INSENSITIVE, "/\u{130}", "/i%CC%87"),
            (
                INSENSITIVE,
                "/x/0B2F7A4E-91C4-4F57-9D6A-3E1C2B9A8F00",
                "/x/#",
            ),
            (INSENSITIVE, "/a;B=1", "/a;b=1"),
            // `;`: an ordinary character by default, parameters when stripped.
            (
                PathMatching::default(),
                "/entity/12;jsessionid=X/bundle",
                "/entity/12;jsessionid=X/bundle",
            ),
            (STRIP, "/entity/12;jsessionid=X/bundle", "/entity/#/bundle"),
            (STRIP, "/entity;v=2/12/bundle;x", "/entity/#/bundle"),
            (STRIP, "/a/;x/b", "/a/b"),
            (STRIP, "/a/..;x/b", "/b"),
            (STRIP, "/a/%2E%2E;/b", "/b"),
            (STRIP, "/a/#;x", "/a/#"),
            (STRIP, "/a%3Bb", "/a%3Bb"),
            (STRIP, "/a%3bb;c", "/a%3Bb"),
            (PathMatching::default(), "/a%3Bb", "/a;b"),
            (BOTH, "/Entity/12;JSESSIONID=X/Bundle", "/entity/#/bundle"),
        ];
        for (matching, input, expected) in cases {
            let normal = matching.normalize(input).map(Cow::into_owned);
            assert_eq!(normal.as_deref(), Ok(expected), "{matching:?} {input:?}");
            assert_eq!(
                matching.normalize(expected).as_deref(),
                Ok(expected),
                "{matching:?} {expected:?} is a fixed point"
            );
        }
        assert_eq!(
            INSENSITIVE.normalize("/x/%ZZ"),
            Err(PathError::BadEscape { offset: 3 })
        );
        assert_eq!(
            STRIP.normalize("/x/a;%ZZ/%ZZ"),
            Err(PathError::BadEscape { offset: 9 })
        );
    }

    /// Every string over `alphabet` of at most `length_max` characters, the empty one first.
    fn every_path(alphabet: &[char], length_max: usize) -> Vec<String> {
        let mut paths = vec![String::new()];
        let mut last = paths.clone();
        for _ in 0..length_max {
            last = last
                .iter()
                .flat_map(|path| alphabet.iter().map(move |c| format!("{path}{c}")))
                .collect();
            paths.extend(last.iter().cloned());
        }
        paths
    }

    /// Every reading over a small alphabet: the fast path agrees with the rewrite, a normal
    /// form is a fixed point, and a normal form (by default) read as a rule path is the path's
    /// own normal form under that reading.
    #[test]
    fn every_reading_agrees_with_its_rewrite_and_is_a_fixed_point() {
        let paths = every_path(&['/', 'a', 'A', '1', ';', '%', '3', 'B', '.', '#'], 5);
        for matching in EVERY_READING {
            for path in &paths {
                let rewritten = rewrite(path, matching);
                let normal = match matching.normalize(path) {
                    Ok(Cow::Borrowed(borrowed)) => {
                        assert_eq!(borrowed, path, "{matching:?} {path:?}");
                        assert_eq!(rewritten.as_deref(), Ok(borrowed), "{matching:?} {path:?}");
                        borrowed.to_owned()
                    }
                    Ok(Cow::Owned(owned)) => {
                        assert_eq!(Ok(&owned), rewritten.as_ref(), "{matching:?} {path:?}");
                        owned
                    }
                    Err(error) => {
                        assert_eq!(Err(error), rewritten, "{matching:?} {path:?}");
                        continue;
                    }
                };
                assert_eq!(
                    matching.normalize(&normal).as_deref(),
                    Ok(normal.as_str()),
                    "{matching:?} {path:?}"
                );
                assert_eq!(matching.rule_path(&normal), normal, "{matching:?} {path:?}");
            }
        }
    }

    #[test]
    fn a_get_rule_applies_to_head_and_nothing_else_widens() {
        for (wanted, method, expected) in [
            ("*", "DELETE", true),
            ("GET", "GET", true),
            ("GET", "get", true),
            ("get", "HEAD", true),
            ("GET", "head", true),
            ("HEAD", "HEAD", true),
            ("HEAD", "GET", false),
            ("GET", "POST", false),
            ("POST", "HEAD", false),
            ("GET", "OPTIONS", false),
        ] {
            assert_eq!(
                method_matches(wanted, method),
                expected,
                "{wanted} {method}"
            );
        }
        let rule = Match::new("GET", "/entity/#").expect("valid");
        assert!(rule.matches("HEAD", "/entity/#"));
        assert!(!rule.matches("HEAD", "/entity/x"));
    }

    #[test]
    fn rule_paths_are_read_as_requests_are() {
        let rule = Match::new("GET", "/Entity/12;v=1/Bundle").expect("valid");
        assert_eq!(rule.path(), "/Entity/12;v=1/Bundle");
        let key = |matching| rule.path_key(matching).map(Cow::into_owned);
        assert_eq!(
            key(PathMatching::default()).as_deref(),
            Some("/Entity/12;v=1/Bundle")
        );
        assert_eq!(key(INSENSITIVE).as_deref(), Some("/entity/12;v=1/bundle"));
        assert_eq!(key(STRIP).as_deref(), Some("/Entity/#/Bundle"));
        assert_eq!(key(BOTH).as_deref(), Some("/entity/#/bundle"));
        assert_eq!(Match::new("*", "*").expect("valid").path_key(BOTH), None);
    }

    #[test]
    fn readings_parse_by_name() {
        assert_eq!(PathCase::parse("insensitive"), Ok(PathCase::Insensitive));
        assert_eq!(PathCase::parse("sensitive"), Ok(PathCase::Sensitive));
        assert_eq!(PathParams::parse("strip"), Ok(PathParams::Strip));
        assert_eq!(PathParams::parse("keep"), Ok(PathParams::Keep));
        let refused = PathCase::parse("Insensitive").expect_err("names are lower case");
        assert!(refused.contains("\"insensitive\""), "{refused}");
        assert!(PathParams::parse("drop").is_err());
        for case in [PathCase::Sensitive, PathCase::Insensitive] {
            assert_eq!(PathCase::parse(case.name()), Ok(case));
        }
        for params in [PathParams::Keep, PathParams::Strip] {
            assert_eq!(PathParams::parse(params.name()), Ok(params));
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
