//! Permit ids, read by the limiter's own parser. Any text is either refused, naming the field
//! `permit`, or read and written back unchanged; the input is also sealed with the secret's tag
//! (as only the server can), so that the parser behind the tag check is reached, and a sealed id
//! is never refused for its tag.

use std::hash::Hasher;
use std::sync::Once;

use siphasher::sip::SipHasher13;
use tollgate::{Error, PermitError, PermitSecret, reencode_permit_id};

const SECRET: [u8; 16] = *b"tollgate-fuzzing";

/// `body` as an id: hex, after its tag (SipHash-1-3 keyed by the secret, as the limiter tags).
fn seal(body: &[u8]) -> String {
    let k0 = u64::from_le_bytes(SECRET[..8].try_into().expect("8 bytes"));
    let k1 = u64::from_le_bytes(SECRET[8..].try_into().expect("8 bytes"));
    let mut hasher = SipHasher13::new_with_keys(k0, k1);
    hasher.write(body);
    let mut sealed = body.to_vec();
    sealed.extend_from_slice(&hasher.finish().to_le_bytes());
    sealed.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn refused_as_permit(error: &Error) -> bool {
    matches!(error, Error::InvalidRequest { field: "permit", reason } if !reason.is_empty())
}

/// One input of the target, as libFuzzer hands it over.
pub fn run_input(data: &[u8]) {
    let secret = PermitSecret::from_bytes(SECRET);
    static TAG_AGREES: Once = Once::new();
    TAG_AGREES.call_once(|| {
        // Version 1, one part: no flags, the limit "a", reservation 1.
        let body = [1, 1, 0, 1, 0, b'a', 1, 0, 0, 0, 0, 0, 0, 0];
        let id = seal(&body);
        let again = reencode_permit_id(&secret, &id)
            .expect("this harness seals ids as the limiter does; update seal() if the tag changed");
        assert_eq!(again.as_str(), id);
    });
    if let Ok(text) = std::str::from_utf8(data) {
        match reencode_permit_id(&secret, text) {
            Ok(again) => assert_eq!(again.as_str(), text, "an id read is written back unchanged"),
            Err(error) => assert!(
                refused_as_permit(&error)
                    || matches!(
                        error,
                        Error::Permit {
                            source: PermitError::Unknown
                        }
                    ),
                "{error:?}"
            ),
        }
    }
    let id = seal(data);
    match reencode_permit_id(&secret, &id) {
        Ok(again) => assert_eq!(
            again.as_str(),
            id,
            "a sealed id read is written back unchanged"
        ),
        Err(error) => assert!(
            refused_as_permit(&error),
            "a sealed id refused as {error:?}"
        ),
    }
}
