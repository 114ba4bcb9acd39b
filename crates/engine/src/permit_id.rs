//! Permits: what an acquire grants. A `Permit` is a guard over one or more counter grants;
//! its `PermitId` is the opaque, tamper-evident text form that crosses process boundaries
//! (the HTTP API commits by id).
//!
//! The id carries everything needed to find the grants again (limit, key, reservation number
//! or fence, per counter) and a keyed tag over them, so a caller can neither forge an id nor
//! point one at another caller's lease.

use std::fmt::{self, Write as _};
use std::hash::Hasher;
use std::time::Duration;

use siphasher::sip::SipHasher13;

use crate::error::{Error, Result};

/// Longest permit id accepted, in characters.
pub const PERMIT_ID_CHARS_MAX: usize = 4096;
/// Shortest permit id that can be one: a version and a count of parts (2 bytes) and the
/// 8-byte tag, in hex.
pub const PERMIT_ID_CHARS_MIN: usize = 2 * (2 + 8);
const FORMAT_VERSION: u8 = 1;

/// One limit's part of a grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub(crate) limit: Box<str>,
    pub(crate) key: Option<Box<str>>,
    pub(crate) seq: u64,
    pub(crate) lease: bool,
}

/// What a caller sees of one limit after a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitStatus {
    pub name: String,
    /// Units still open to the request's priority.
    pub remaining: u64,
    /// Time until everything counted now stops counting.
    pub reset_after: Duration,
    /// For a lease: its fencing token. Tokens only grow; a holder whose lease expired holds a
    /// smaller one than the current holder.
    pub fence: Option<u64>,
    /// For a lease: time until it expires unless renewed.
    pub lease_expires_in: Option<Duration>,
}

/// The text form of a permit.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PermitId(String);

impl PermitId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// Ids are bearer capabilities: keep them out of debug logs.
impl fmt::Debug for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PermitId(..)")
    }
}

/// The key that tags permit ids. Every process that must accept another's ids (server
/// replicas on one store) needs the same secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PermitSecret {
    k0: u64,
    k1: u64,
}

impl fmt::Debug for PermitSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PermitSecret(..)")
    }
}

impl PermitSecret {
    pub fn from_bytes(bytes: [u8; 16]) -> PermitSecret {
        let (k0, k1) = bytes.split_at(8);
        PermitSecret {
            k0: u64::from_le_bytes(k0.try_into().unwrap_or_default()),
            k1: u64::from_le_bytes(k1.try_into().unwrap_or_default()),
        }
    }

    /// A secret drawn from the process's random hasher keys.
    pub fn random() -> PermitSecret {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        PermitSecret {
            k0: state.hash_one(0x746f_6c6c_u64),
            k1: state.hash_one(0x6761_7465_u64),
        }
    }

    fn tag(&self, body: &[u8]) -> u64 {
        let mut hasher = SipHasher13::new_with_keys(self.k0, self.k1);
        hasher.write(body);
        hasher.finish()
    }
}

fn push_text(buffer: &mut Vec<u8>, text: &str) {
    // Names and keys are at most a few hundred bytes (validated on the way in).
    buffer.extend_from_slice(&(text.len() as u16).to_le_bytes());
    buffer.extend_from_slice(text.as_bytes());
}

pub(crate) fn encode<'a>(
    secret: &PermitSecret,
    parts: impl ExactSizeIterator<Item = &'a Part>,
) -> PermitId {
    let mut body = Vec::with_capacity(16 + parts.len() * 32);
    body.push(FORMAT_VERSION);
    body.push(parts.len() as u8);
    for part in parts {
        body.push(u8::from(part.lease) | (u8::from(part.key.is_some()) << 1));
        push_text(&mut body, &part.limit);
        if let Some(key) = &part.key {
            push_text(&mut body, key);
        }
        body.extend_from_slice(&part.seq.to_le_bytes());
    }
    let tag = secret.tag(&body);
    body.extend_from_slice(&tag.to_le_bytes());
    let mut hex = String::with_capacity(body.len() * 2);
    for byte in body {
        let _ = write!(hex, "{byte:02x}");
    }
    PermitId(hex)
}

/// The value of a lower-case hex digit.
fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' | b'a'..=b'f' => char::from(byte)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok()),
        _ => None,
    }
}

fn malformed(reason: &str) -> Error {
    Error::invalid("permit", format!("malformed permit id: {reason}"))
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < count {
            return Err(malformed("truncated"));
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }

    fn text(&mut self) -> Result<&'a str> {
        let length = self.take(2)?;
        let length = usize::from(u16::from_le_bytes([length[0], length[1]]));
        std::str::from_utf8(self.take(length)?).map_err(|_| malformed("not UTF-8"))
    }

    fn u64(&mut self) -> Result<u64> {
        let bytes = self.take(8)?;
        Ok(u64::from_le_bytes(
            bytes.try_into().map_err(|_| malformed("truncated"))?,
        ))
    }
}

/// Parse and authenticate a permit id. Any alteration fails the tag check.
pub(crate) fn decode(secret: &PermitSecret, id: &str) -> Result<Vec<Part>> {
    if id.len() > PERMIT_ID_CHARS_MAX {
        return Err(malformed("too long"));
    }
    if !id.len().is_multiple_of(2) || id.len() < PERMIT_ID_CHARS_MIN {
        return Err(malformed("wrong length"));
    }
    let mut bytes = Vec::with_capacity(id.len() / 2);
    for pair in id.as_bytes().chunks_exact(2) {
        match (hex_value(pair[0]), hex_value(pair[1])) {
            (Some(high), Some(low)) => bytes.push((high << 4) | low),
            _ => return Err(malformed("not lower-case hex")),
        }
    }
    let (body, tag) = bytes.split_at(bytes.len() - 8);
    let tag = u64::from_le_bytes(tag.try_into().map_err(|_| malformed("truncated"))?);
    if secret.tag(body) != tag {
        return Err(Error::Permit {
            source: tollgate_core::PermitError::Unknown,
        });
    }
    let mut reader = Reader { bytes: body };
    if reader.take(1)?[0] != FORMAT_VERSION {
        return Err(malformed("unknown version"));
    }
    let count = reader.take(1)?[0];
    let mut parts = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let flags = reader.take(1)?[0];
        // Only the lease and key bits are written: any other would give one permit many ids.
        if flags & !3 != 0 {
            return Err(malformed("unknown flags"));
        }
        let limit = reader.text()?;
        let key = if flags & 2 != 0 {
            Some(reader.text()?.into())
        } else {
            None
        };
        parts.push(Part {
            limit: limit.into(),
            key,
            seq: reader.u64()?,
            lease: flags & 1 != 0,
        });
    }
    if !reader.bytes.is_empty() {
        return Err(malformed("trailing bytes"));
    }
    Ok(parts)
}

/// A permit id read as the limiter reads it and written again as it writes one: the parser and
/// the writer, for fuzzing (a valid id comes back unchanged).
#[doc(hidden)]
pub fn reencode_permit_id(secret: &PermitSecret, id: &str) -> Result<PermitId> {
    decode(secret, id).map(|parts| encode(secret, parts.iter()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Part> {
        vec![
            Part {
                limit: "vendor-x".into(),
                key: None,
                seq: 42,
                lease: false,
            },
            Part {
                limit: "pool".into(),
                key: Some("user:7".into()),
                seq: u64::MAX,
                lease: true,
            },
        ]
    }

    #[test]
    fn only_lower_case_hex_digits_have_a_value() {
        for byte in 0..=u8::MAX {
            let expected = match byte {
                b'0'..=b'9' => Some(byte - b'0'),
                b'a'..=b'f' => Some(byte - b'a' + 10),
                _ => None,
            };
            assert_eq!(hex_value(byte), expected, "{byte:#04x}");
        }
    }

    #[test]
    fn ids_round_trip() {
        let secret = PermitSecret::random();
        let id = encode(&secret, sample().iter());
        assert_eq!(decode(&secret, id.as_str()).expect("decodes"), sample());
    }

    #[test]
    fn flags_other_than_lease_and_key_are_refused() {
        let secret = PermitSecret::random();
        let mut body = vec![FORMAT_VERSION, 1, 0b101];
        push_text(&mut body, "vendor-x");
        body.extend_from_slice(&7u64.to_le_bytes());
        let tag = secret.tag(&body);
        body.extend_from_slice(&tag.to_le_bytes());
        let id: String = body.iter().map(|byte| format!("{byte:02x}")).collect();
        assert!(matches!(
            decode(&secret, &id),
            Err(Error::InvalidRequest {
                field: "permit",
                ..
            })
        ));
    }

    #[test]
    fn altered_or_foreign_ids_are_refused() {
        let secret = PermitSecret::random();
        let id = encode(&secret, sample().iter()).0;
        let mut altered = id.clone().into_bytes();
        altered[10] = if altered[10] == b'0' { b'1' } else { b'0' };
        let altered = String::from_utf8(altered).expect("ascii");
        assert!(matches!(
            decode(&secret, &altered),
            Err(Error::Permit { .. })
        ));
        assert!(decode(&PermitSecret::random(), &id).is_err());
        let not_hex = format!("{}g", &id[..id.len() - 1]);
        let upper_case = id.to_uppercase();
        for bad in [
            "",
            "zz",
            "0102",
            &"0".repeat(PERMIT_ID_CHARS_MAX + 2),
            &not_hex,
            &upper_case,
        ] {
            assert!(
                matches!(
                    decode(&secret, bad),
                    Err(Error::InvalidRequest {
                        field: "permit",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }
}
