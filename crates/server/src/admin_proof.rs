//! `GET /v1/admin-token/proof`: how a server shows that it holds an admin token without
//! sending it, so that a client holding a kept copy sends the token only to the server that
//! made it. Owns the proof's constants and its one computation, which the `tollgate` commands
//! and the Python and TypeScript clients repeat (tied together by
//! `crates/cli/tests/vectors/kept_token.json`).
//!
//! The client sends a fresh random nonce; the server answers
//! `HMAC-SHA256(HMAC-SHA256(token, LABEL), LISTEN "\n" NONCE)` in hex, where LISTEN is the
//! address it listens on, as its token file records it. The key is derived under a fixed label
//! so that the answer is no HMAC of the token usable elsewhere and reveals nothing of it; the
//! nonce makes an old answer useless; the address makes a relayed one useless: a listener that
//! passes the challenge on to the real server elsewhere gets an answer for the real server's
//! address, not for the one the client reached.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use tollgate_api::admin::AdminProof;
use tollgate_api::schema::BadRequest;
use utoipa::IntoParams;

use crate::api::ApiResult;
use crate::error::ApiError;
use crate::state::AppState;

/// The endpoint's path.
pub const ADMIN_PROOF_PATH: &str = "/v1/admin-token/proof";
/// The query parameter that carries the nonce.
pub const ADMIN_PROOF_NONCE: &str = "nonce";
/// What the proof's key is derived under: the answer is an HMAC of this exchange alone.
pub const ADMIN_PROOF_LABEL: &str = "tollgate admin-token proof v1";
/// Fewest hex digits of a nonce: 128 bits, so that no answer is ever asked for twice.
pub const ADMIN_PROOF_NONCE_HEX_MIN: usize = 32;
/// Most hex digits of a nonce.
pub const ADMIN_PROOF_NONCE_HEX_MAX: usize = 128;

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], message: &[&[u8]]) -> [u8; 32] {
    // An HMAC takes a key of any length: `new_from_slice` cannot fail.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    for part in message {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// The proof, in lowercase hex, that the holder of `token`, listening on `listen` (written as
/// its token file's `listen` line writes it), answers to `nonce`.
pub fn admin_proof(token: &str, listen: &str, nonce: &str) -> String {
    let key = hmac(token.as_bytes(), &[ADMIN_PROOF_LABEL.as_bytes()]);
    let proof = hmac(&key, &[listen.as_bytes(), b"\n", nonce.as_bytes()]);
    proof.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Whether `proof` is the one `admin_proof` gives, compared in time that does not depend on
/// where they differ.
pub fn admin_proof_matches(proof: &str, token: &str, listen: &str, nonce: &str) -> bool {
    crate::extract::constant_time_eq(
        proof.as_bytes(),
        admin_proof(token, listen, nonce).as_bytes(),
    )
}

/// Why `nonce` cannot be proved: not 32 to 128 hex digits.
pub fn check_nonce(nonce: &str) -> Result<(), String> {
    if !(ADMIN_PROOF_NONCE_HEX_MIN..=ADMIN_PROOF_NONCE_HEX_MAX).contains(&nonce.len()) {
        return Err(format!(
            "must be {ADMIN_PROOF_NONCE_HEX_MIN} to {ADMIN_PROOF_NONCE_HEX_MAX} hex digits, got {}",
            nonce.len()
        ));
    }
    if !nonce.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err("must be hex digits (0-9, a-f) only".into());
    }
    Ok(())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProofQuery {
    /// A fresh random nonce: 32 to 128 hex digits.
    #[param(pattern = "^[0-9a-fA-F]{32,128}$", min_length = 32, max_length = 128)]
    nonce: String,
}

/// `GET /v1/admin-token/proof?nonce=HEX`. It needs no token: it is asked before a client
/// decides whether to send one.
#[utoipa::path(get, path = "/v1/admin-token/proof", tag = "admin",
    params(ProofQuery),
    responses(
        (status = 200, description = "the proof that this server holds the admin token, for \
            this nonce and the address it listens on: hex of HMAC-SHA256(HMAC-SHA256(admin \
            token, \"tollgate admin-token proof v1\"), LISTEN + \"\\n\" + nonce), LISTEN being \
            the address this server listens on as its token file records it (`127.0.0.1:7070`, \
            `[::1]:7070`). Clients holding a kept admin token ask this with a fresh nonce and \
            send the token only if the answer matches; it reveals nothing of the token",
            body = AdminProof),
        (status = 400, response = BadRequest),
        (status = 404, description = "this server has no admin token", body = tollgate_api::schema::NotFoundError)))]
pub(crate) async fn prove(
    State(state): State<AppState>,
    query: Result<Query<ProofQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let Query(query) = query.map_err(|rejection| {
        crate::stats::query_error(&rejection.body_text(), ADMIN_PROOF_NONCE)
    })?;
    check_nonce(&query.nonce).map_err(|reason| ApiError::bad_field(ADMIN_PROOF_NONCE, reason))?;
    let Some(token) = state.config().admin_token.as_deref() else {
        return Err(ApiError::not_found(
            "this server has no admin token (TOLLGATE_ADMIN_TOKEN), so it has nothing to prove",
        ));
    };
    let listen = state.listening().to_string();
    let mut response = Json(AdminProof {
        proof: admin_proof(token, &listen, &query.nonce),
    })
    .into_response();
    // Each answer is for one nonce: nothing may keep it.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proof_depends_on_token_address_and_nonce() {
        let nonce = "00112233445566778899aabbccddeeff";
        let proof = admin_proof("t", "127.0.0.1:7070", nonce);
        assert_eq!(proof.len(), 64);
        assert!(admin_proof_matches(&proof, "t", "127.0.0.1:7070", nonce));
        assert!(!admin_proof_matches(&proof, "u", "127.0.0.1:7070", nonce));
        assert!(!admin_proof_matches(&proof, "t", "127.0.0.1:7071", nonce));
        assert!(!admin_proof_matches(
            &proof,
            "t",
            "127.0.0.1:7070",
            "00112233445566778899aabbccddeef0"
        ));
        assert!(!proof.contains('t'));
    }

    #[test]
    fn a_nonce_is_32_to_128_hex_digits() {
        assert!(check_nonce(&"a".repeat(32)).is_ok());
        assert!(check_nonce(&"F".repeat(128)).is_ok());
        assert!(check_nonce(&"a".repeat(31)).is_err());
        assert!(check_nonce(&"a".repeat(129)).is_err());
        assert!(check_nonce(&format!("{}g", "a".repeat(31))).is_err());
    }
}
