//! `GET /openapi.json`: the OpenAPI document, derived from the handlers' annotations and the
//! wire types themselves, exact enough for a fuzzer to hold the server to it
//! (`scripts/api-fuzz`): every status each operation answers, the error body of each (a 400
//! always names its `field`), the headers sent with them, the token each operation needs, and
//! links from the answers that name a resource to the operations on it.
//!
//! The wire types and the schemas the derives cannot express (error bodies by status, names,
//! keys, permit ids, one schema per kind of rule) are `tollgate_api`'s. This module puts them
//! together with the handlers' paths, the security schemes and the last touches (`document`):
//! objects closed to undocumented properties, headers marked required, links and optional
//! bodies written as OpenAPI reads them (utoipa 5.5 does not), and the data plane's token
//! dropped when none is configured.

use serde_json::{Value, json};
use tollgate_api::schema::{
    BadRequest, BadRequestError, ConcurrencyLimitBody, ConflictError, Forbidden, ForbiddenError,
    Key, LimitBody, LimitName, LimitPattern, MatchBody, NotFound, NotFoundError, PermitText,
    PriorityName, RateLimitBody, ReserveBody, UiAsset, Unauthorized, UnauthorizedError,
    Unavailable, UnavailableError, UnsupportedMediaType,
};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api;

/// The security scheme of the admin API.
pub(crate) const ADMIN: &str = "admin";
/// The security scheme of the data plane, required only when a data token is configured.
pub(crate) const DATA: &str = "data";
/// The data plane's token as `/v1/forward-auth` takes it, in `X-Tollgate-Token`.
pub(crate) const FORWARD: &str = "forward";

/// Headers whose response always carries them. utoipa's header object has no `required`, so
/// `document` adds it.
const REQUIRED_HEADERS: [&str; 2] = ["Retry-After", "WWW-Authenticate"];

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                ADMIN,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "The admin token (admin_token). With none configured, every admin \
                             call is refused with 401.",
                        ))
                        .build(),
                ),
            );
            components.add_security_scheme(
                DATA,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "The data token (data_token), or a scoped data token made through \
                             POST /v1/tokens, which is held to its limits, its priority_max and \
                             its may_pause (403 beyond them). A server with no data token \
                             configured serves this document without it: its data plane is open.",
                        ))
                        .build(),
                ),
            );
            components.add_security_scheme(
                FORWARD,
                SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                    "X-Tollgate-Token",
                    "The data token or a scoped data token, as for `data`, in the header a \
                     reverse proxy sets on /v1/forward-auth: there `Authorization` is the end \
                     user's, passed on by the proxy, and is not read.",
                ))),
            );
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Tollgate HTTP API", version = "1",
        description = "Rate-limit and quota coordination. Every error answer is \
            {\"error\": {\"code\", \"message\"}}; a 400 also names the request field at fault in \
            `error.field` (dotted for nested fields, `body` for the body as a whole). A method \
            an endpoint does not serve is answered 405 with an `Allow` header, and an unknown \
            path 404."),
    paths(
        api::admin::list_limits, api::admin::get_limit, api::admin::put_limit,
        api::admin::delete_limit, api::admin::resume, api::admin::reset,
        api::data::acquire, api::data::commit, api::data::renew, api::data::pause,
        api::data::learn, api::data::charge,
        api::inbound::check,
        crate::forward::forward_auth, crate::stats::stats,
        api::ops::healthz, api::ops::readyz, api::ops::metrics, openapi_json, crate::ui::index,
        crate::ui::asset, crate::tokens::create_token, crate::tokens::list_tokens,
        crate::tokens::delete_token, crate::admin_proof::prove,
    ),
    components(
        schemas(
            BadRequestError, UnauthorizedError, ForbiddenError, NotFoundError, ConflictError,
            UnavailableError,
            LimitName, LimitPattern, Key, PermitText, PriorityName, UiAsset, LimitBody, RateLimitBody,
            ConcurrencyLimitBody, ReserveBody, MatchBody, tollgate_api::RawRule,
            tollgate_api::RawReserve, tollgate_api::RawMatch,
        ),
        responses(BadRequest, Unauthorized, Forbidden, NotFound, Unavailable,
            UnsupportedMediaType),
    ),
    modifiers(&Security),
)]
pub(crate) struct ApiDoc;

/// The document a server serves: with `data_token` false (no data token configured), the data
/// plane's operations need no token and never answer 401, and the document says so.
pub(crate) fn document(data_token: bool) -> Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    if let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        for schema in schemas.values_mut() {
            close_objects(schema);
        }
    }
    if let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut().filter_map(Value::as_object_mut) {
            for operation in item.values_mut() {
                finish_operation(operation, data_token);
            }
        }
    }
    if let Some(responses) = document
        .pointer_mut("/components/responses")
        .and_then(Value::as_object_mut)
    {
        for response in responses.values_mut() {
            require_headers(response);
        }
    }
    document
}

/// Every object schema without `additionalProperties` takes no other property: the server
/// refuses unknown fields, and answers with exactly the fields documented.
fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let is_object = object.get("type").is_some_and(|kind| {
                kind == "object"
                    || kind
                        .as_array()
                        .is_some_and(|kinds| kinds.contains(&json!("object")))
            });
            if is_object && object.contains_key("properties") {
                object
                    .entry("additionalProperties")
                    .or_insert(Value::Bool(false));
            }
            for value in object.values_mut() {
                close_objects(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

fn finish_operation(operation: &mut Value, data_token: bool) {
    optional_body_is_absent_not_null(operation);
    let has_body = operation.get("requestBody").is_some();
    if let Some(responses) = operation
        .get_mut("responses")
        .and_then(Value::as_object_mut)
    {
        // The HTTP layer's refusals (`guard.rs`) apply to every operation alike.
        responses.insert(
            "403".into(),
            json!({"$ref": "#/components/responses/Forbidden"}),
        );
        if has_body {
            responses.insert(
                "415".into(),
                json!({"$ref": "#/components/responses/UnsupportedMediaType"}),
            );
        }
        for response in responses.values_mut() {
            require_headers(response);
            spell_links(response);
        }
    }
    let data_plane = operation
        .get("security")
        .and_then(Value::as_array)
        .is_some_and(|alternatives| {
            alternatives.iter().any(|requirement| {
                requirement.get(DATA).is_some() || requirement.get(FORWARD).is_some()
            })
        });
    if data_plane
        && !data_token
        && let Some(operation) = operation.as_object_mut()
    {
        operation.remove("security");
        if let Some(responses) = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
        {
            responses.remove("401");
        }
    }
}

/// utoipa makes a body optional by making its schema nullable; the server reads an absent body
/// as `{}` and refuses `null`, so an optional body's schema is the object alone.
fn optional_body_is_absent_not_null(operation: &mut Value) {
    let Some(body) = operation.get_mut("requestBody") else {
        return;
    };
    if body.get("required") == Some(&Value::Bool(true)) {
        return;
    }
    if let Some(schema) = body.pointer_mut("/content/application~1json/schema") {
        let object = schema
            .get("oneOf")
            .and_then(Value::as_array)
            .and_then(|alternatives| match alternatives.as_slice() {
                [null, object] | [object, null] if null == &json!({"type": "null"}) => {
                    Some(object.clone())
                }
                _ => None,
            });
        if let Some(object) = object {
            *schema = object;
        }
    }
}

/// utoipa 5.5 writes a link's fields as Rust spells them (`operation_id`); OpenAPI spells them
/// `operationId`, `operationRef` and `requestBody`, and tools ignore a link without them.
fn spell_links(response: &mut Value) {
    let Some(links) = response.get_mut("links").and_then(Value::as_object_mut) else {
        return;
    };
    for link in links.values_mut().filter_map(Value::as_object_mut) {
        for (rust, openapi) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(value) = link.remove(rust) {
                link.insert(openapi.to_owned(), value);
            }
        }
    }
}

fn require_headers(response: &mut Value) {
    if let Some(headers) = response.get_mut("headers").and_then(Value::as_object_mut) {
        for (name, header) in headers.iter_mut() {
            if REQUIRED_HEADERS.contains(&name.as_str())
                && let Some(header) = header.as_object_mut()
            {
                header.insert("required".into(), Value::Bool(true));
            }
        }
    }
}

/// `GET /openapi.json`.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "this document",
        content_type = "application/json", body = Object)))]
pub(crate) async fn openapi_json(
    axum::extract::State(state): axum::extract::State<crate::state::AppState>,
) -> axum::Json<Value> {
    axum::Json(document(state.config().data_token.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_object_is_closed_and_every_error_header_required() {
        let document = document(true);
        let text = document.to_string();
        assert!(!text.contains("\"bearer\":[]"), "the old scheme name");
        assert_eq!(
            document.pointer("/components/schemas/AcquireBody/additionalProperties"),
            Some(&Value::Bool(false))
        );
        assert_eq!(
            document
                .pointer("/components/responses/Unauthorized/headers/WWW-Authenticate/required"),
            Some(&Value::Bool(true))
        );
        assert_eq!(
            document
                .pointer("/paths/~1v1~1acquire/post/responses/429/headers/Retry-After/required"),
            Some(&Value::Bool(true))
        );
        assert!(
            document
                .pointer("/paths/~1v1~1acquire/post/responses/401")
                .is_some()
        );
        // An optional body may be absent, never null.
        assert_eq!(
            document.pointer(
                "/paths/~1v1~1permits~1{permit}~1renew/post/requestBody/content/application~1json/schema"
            ),
            Some(&json!({"$ref": "#/components/schemas/RenewBody"}))
        );
        // The parameters of /v1/stats are in its query, and optional.
        let parameters = document
            .pointer("/paths/~1v1~1stats/get/parameters")
            .and_then(Value::as_array)
            .expect("parameters");
        for parameter in parameters {
            assert_eq!(parameter["in"], "query", "{parameter}");
            assert_eq!(parameter["required"], false, "{parameter}");
        }
    }

    #[test]
    fn the_schemas_written_as_json_survive_utoipa() {
        let document = document(true);
        for name in [
            "RateLimitBody",
            "ConcurrencyLimitBody",
            "ReserveBody",
            "MatchBody",
        ] {
            let schema = document
                .pointer(&format!("/components/schemas/{name}"))
                .unwrap_or_else(|| panic!("{name} missing"));
            assert!(schema.get("properties").is_some(), "{name}: {schema}");
            assert_eq!(schema["additionalProperties"], Value::Bool(false), "{name}");
        }
        let rate = &document["components"]["schemas"]["RateLimitBody"];
        assert_eq!(rate["required"], json!(["kind", "limit", "period_ms"]));
        assert_eq!(rate["properties"]["kind"]["enum"], json!(["rate"]));
        assert_eq!(
            document["components"]["schemas"]["LimitBody"]["oneOf"][1]["$ref"],
            "#/components/schemas/ConcurrencyLimitBody"
        );
    }

    #[test]
    fn without_a_data_token_the_data_plane_needs_none() {
        let document = document(false);
        let acquire = document
            .pointer("/paths/~1v1~1acquire/post")
            .expect("acquire");
        assert!(acquire.get("security").is_none());
        assert!(acquire.pointer("/responses/401").is_none());
        // The admin API keeps its token.
        assert!(
            document
                .pointer("/paths/~1v1~1limits/get/security")
                .is_some()
        );
    }
}
