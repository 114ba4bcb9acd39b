//! `GET /openapi.json`: the OpenAPI document, derived from the handlers' annotations and the
//! wire types themselves, exact enough for a fuzzer to hold the server to it
//! (`scripts/api-fuzz`): every status each operation answers, the error body of each (a 400
//! always names its `field`), the headers sent with them, the token each operation needs, and
//! links from the answers that name a resource to the operations on it.
//!
//! This module owns the parts the derives cannot express: the error bodies by status, the
//! shared error responses and their headers, the constraints on names, keys and permit ids, and
//! the last touches (`document`): objects closed to undocumented properties, headers marked
//! required, links and optional bodies written as OpenAPI reads them (utoipa 5.5 does not),
//! and the data plane's token dropped when none is configured.

use std::borrow::Cow;

use serde_json::{Value, json};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToResponse, ToSchema};

use crate::api;
use crate::error::Code;

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
        api::list_limits, api::get_limit, api::put_limit, api::delete_limit, api::resume,
        api::acquire, api::commit, api::renew, api::pause, api::check,
        crate::forward::forward_auth, crate::stats::stats,
        api::healthz, api::readyz, api::metrics, openapi_json, crate::ui::index,
        crate::ui::asset, crate::tokens::create_token, crate::tokens::list_tokens,
        crate::tokens::delete_token,
    ),
    components(
        schemas(
            BadRequestError, UnauthorizedError, ForbiddenError, NotFoundError, ConflictError,
            UnavailableError,
            LimitName, Key, PermitText, PriorityName, UiAsset, LimitBody, RateLimitBody,
            ConcurrencyLimitBody, ReserveBody, MatchBody, tollgate_rules::RawRule,
            tollgate_rules::RawReserve, tollgate_rules::RawMatch,
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

// ---- Error bodies --------------------------------------------------------------------------

/// The `error` object: `code` one of `codes`, a `message`, and `field` required when `field`
/// is true (absent otherwise).
fn error_detail(codes: &[Code], field: bool) -> ObjectBuilder {
    let mut detail = ObjectBuilder::new()
        .property(
            "code",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(codes.iter().map(|code| code.as_str()))),
        )
        .required("code")
        .property(
            "message",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .description(Some("What went wrong, for people.")),
        )
        .required("message");
    if field {
        detail = detail
            .property(
                "field",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .description(Some(
                        "The request field at fault: a body field (dotted for nested fields, \
                         `limits[0]` for an item), a path or query parameter, `body` for the \
                         body as a whole, or `query` for the query string as a whole.",
                    )),
            )
            .required("field");
    }
    detail.additional_properties(Some(AdditionalProperties::FreeForm(false)))
}

/// `{"error": {...}}`, as `error_detail` describes it.
fn error_body(description: &str, codes: &[Code], field: bool) -> RefOr<Schema> {
    ObjectBuilder::new()
        .description(Some(description))
        .property("error", error_detail(codes, field))
        .required("error")
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .into()
}

/// The `error` object of a 429 answer.
pub(crate) fn rate_limited_detail() -> RefOr<Schema> {
    error_detail(&[Code::RateLimited], false).into()
}

macro_rules! error_schema {
    ($name:ident, $description:literal, [$($code:expr),+], $field:literal) => {
        #[doc = $description]
        pub(crate) struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                error_body($description, &[$($code),+], $field)
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

error_schema!(
    BadRequestError,
    "A request refused as malformed or out of range, naming the field at fault.",
    [Code::BadRequest],
    true
);
error_schema!(
    UnauthorizedError,
    "No bearer token, a wrong one, or an admin call with no admin token configured.",
    [Code::Unauthorized],
    false
);
error_schema!(
    ForbiddenError,
    "A scoped data token used beyond its scope: a limit outside its limits, a priority above \
     its priority_max, or a pause it may not make. The message names which.",
    [Code::Unauthorized],
    false
);
error_schema!(
    NotFoundError,
    "An unknown limit, permit or file.",
    [Code::NotFound],
    false
);
error_schema!(
    ConflictError,
    "The operation does not apply to the resource as it is now.",
    [Code::Conflict],
    false
);
error_schema!(
    UnavailableError,
    "The store or the rules database cannot answer, the server is shutting down, or the \
     memory store tracks as many counters as it may.",
    [Code::StoreUnavailable, Code::TooManyKeys],
    false
);

// ---- Error responses -----------------------------------------------------------------------

fn json_response(description: &str, schema: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(schema)))
            .build(),
    )
}

macro_rules! error_response {
    ($name:ident, $schema:literal, $description:literal) => {
        error_response!($name, $schema, $description, |response| response);
    };
    ($name:ident, $schema:literal, $description:literal, $extra:expr) => {
        #[doc = $description]
        pub(crate) struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                let extra: fn(ResponseBuilder) -> ResponseBuilder = $extra;
                (
                    stringify!($name),
                    extra(json_response($description, $schema)).build().into(),
                )
            }
        }
    };
}

error_response!(
    BadRequest,
    "BadRequestError",
    "Refused: `error.field` names the field at fault."
);
error_response!(
    Unauthorized,
    "UnauthorizedError",
    "The bearer token is missing or wrong.",
    |response| response.header(
        "WWW-Authenticate",
        HeaderBuilder::new()
            .schema(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["Bearer"]))
            )
            .description(Some("Always `Bearer`."))
            .build(),
    )
);
error_response!(
    Forbidden,
    "ForbiddenError",
    "Refused before any handler (`bad_request`, `error.field` `Host`: a name this server does \
     not answer to, e.g. a DNS name rebound to loopback, see allowed_hosts; or `Origin`: a \
     browser page from an origin that is neither this server's own nor in allowed_origins), or \
     a valid token whose scope does not allow this (`unauthorized`, with `WWW-Authenticate`).",
    |response| response
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(
                    OneOfBuilder::new()
                        .item(Ref::from_schema_name("BadRequestError"))
                        .item(Ref::from_schema_name("ForbiddenError")),
                ))
                .build(),
        )
        .header(
            "WWW-Authenticate",
            HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some([r#"Bearer error="insufficient_scope""#]))
                )
                .description(Some(
                    "With a scope refusal: `Bearer error=\"insufficient_scope\"`.",
                ))
                .build(),
        )
);
error_response!(
    NotFound,
    "NotFoundError",
    "The limit or permit named is unknown."
);
error_response!(
    UnsupportedMediaType,
    "BadRequestError",
    "A request with a body must say `Content-Type: application/json` (parameters such as \
     charset allowed); `error.field` is `Content-Type`."
);
error_response!(
    Unavailable,
    "UnavailableError",
    "Transient: `store_unavailable` (the store or the rules database cannot answer, or the \
     server is shutting down) or `too_many_keys` (the memory store tracks keys_tracked_max \
     counters); the same request may succeed later."
);

// ---- Constrained strings -------------------------------------------------------------------

macro_rules! string_schema {
    ($name:ident, $description:literal, $build:expr) => {
        #[doc = $description]
        pub(crate) struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                let build: fn(ObjectBuilder) -> ObjectBuilder = $build;
                build(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .description(Some($description)),
                )
                .into()
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

string_schema!(
    LimitName,
    "A limit's name: lower-case letters, digits, '.', '_', ':' and '-', starting with a \
     letter or a digit, at most 128 bytes.",
    |schema| schema
        .min_length(Some(1))
        .max_length(Some(tollgate::LIMIT_NAME_BYTES_MAX))
        .pattern(Some("^[a-z0-9][a-z0-9._:-]*$"))
        .examples(["vendor-x"])
);
string_schema!(
    Key,
    "A counter's key, for limits counted `per` key: 1 to 256 bytes of UTF-8, no control \
     characters.",
    |schema| schema
        .min_length(Some(1))
        .max_length(Some(tollgate::KEY_BYTES_MAX))
        .examples(["user-42"])
);
string_schema!(
    PermitText,
    "A permit id as /v1/acquire hands it out: lower-case hex, opaque, tagged so that it \
     cannot be forged.",
    |schema| schema
        .min_length(Some(2))
        .max_length(Some(tollgate::PERMIT_ID_CHARS_MAX))
        .pattern(Some("^([0-9a-f]{2})+$"))
);
string_schema!(UiAsset, "A file the dashboard's page loads.", |schema| {
    schema.enum_values(Some(["app.js", "style.css", "favicon.svg"]))
});
string_schema!(
    PriorityName,
    "A request's priority: a lower level never delays a higher one.",
    |schema| schema.enum_values(Some(["high", "normal", "low"]))
);

// ---- The body of PUT /v1/limits/{name} ----------------------------------------------------

/// A schema written as JSON, for the shapes the derives cannot express. utoipa reads back what
/// it writes, so a shape it cannot read is a bug caught by the tests below.
fn from_json(schema: Value) -> RefOr<Schema> {
    serde_json::from_value(schema).unwrap_or_else(|_| ObjectBuilder::new().into())
}

/// The fields both kinds of limit take; `null` reads as absent.
fn common_rule_fields() -> Value {
    json!({
        "name": {"oneOf": [{"$ref": "#/components/schemas/LimitName"}, {"type": "null"}],
            "description": "Optional; when given, the name in the path."},
        "limit": {"type": "integer", "minimum": 1, "maximum": tollgate::core::UNITS_MAX,
            "description": "Units per period (rate) or leases outstanding (concurrency)."},
        "reserve": {"oneOf": [{"$ref": "#/components/schemas/ReserveBody"}, {"type": "null"}]},
        "per": {"oneOf": [{"$ref": "#/components/schemas/Key"}, {"type": "null"}],
            "description": "A label (`user`): each key given at acquire gets its own counter."},
        "keys_max": {"type": ["integer", "null"], "minimum": 1,
            "description": "With `per`: keys tracked at once at most; past it a new key is \
                refused (503 `too_many_keys`) and no other limit is affected (default: the \
                server's `keys_per_limit_max`)."},
        "match": {"oneOf": [{"$ref": "#/components/schemas/MatchBody"}, {"type": "null"}]},
    })
}

fn rule_schema(description: &str, kind: &str, fields: Value, required: &[&str]) -> RefOr<Schema> {
    let mut properties = common_rule_fields();
    if let (Some(properties), Value::Object(fields)) = (properties.as_object_mut(), fields) {
        properties.insert("kind".into(), json!({"type": "string", "enum": [kind]}));
        properties.extend(fields);
    }
    let mut required_fields = vec!["kind", "limit"];
    required_fields.extend_from_slice(required);
    from_json(json!({
        "type": "object",
        "description": description,
        "properties": properties,
        "required": required_fields,
        "additionalProperties": false,
    }))
}

macro_rules! json_schema {
    ($name:ident, $description:literal, $schema:expr) => {
        #[doc = $description]
        pub(crate) struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                $schema
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

json_schema!(
    LimitBody,
    "The body of `PUT /v1/limits/{name}`: a rate or a concurrency limit. Each takes only its \
     own fields; what the schema cannot say is refused with a 400 naming the field (reserves \
     that leave a priority nothing, a `burst` without `gcra`, a gcra `limit` above the period \
     in microseconds, a `match` that would let one request match more than 8 limits).",
    from_json(json!({
        "oneOf": [
            {"$ref": "#/components/schemas/RateLimitBody"},
            {"$ref": "#/components/schemas/ConcurrencyLimitBody"},
        ],
        "examples": [
            {"kind": "rate", "limit": 10, "period_ms": 1000, "reserve": {"high": 2}},
            {"kind": "concurrency", "limit": 5, "lease_ttl_ms": 30000},
        ],
    }))
);
json_schema!(
    RateLimitBody,
    "At most `limit` units per `period_ms`.",
    rule_schema(
        "At most `limit` units per `period_ms`.",
        "rate",
        json!({
            "period_ms": {"type": "integer", "minimum": 1},
            "algorithm": {"type": ["string", "null"], "enum": ["sliding", "fixed", "gcra", null],
                "description": "`sliding` (default), `fixed` or `gcra`."},
            "burst": {"type": ["integer", "null"], "minimum": 1,
                "description": "`gcra` only: the largest burst (default: `limit`)."},
            "margin_ms": {"type": ["integer", "null"], "minimum": 0,
                "description": "Time added to the period to absorb delivery jitter."},
        }),
        &["period_ms"],
    )
);
json_schema!(
    ConcurrencyLimitBody,
    "At most `limit` leases at once; a lease not renewed within `lease_ttl_ms` expires.",
    rule_schema(
        "At most `limit` leases at once; a lease not renewed within `lease_ttl_ms` expires.",
        "concurrency",
        json!({"lease_ttl_ms": {"type": "integer", "minimum": 1}}),
        &["lease_ttl_ms"],
    )
);
json_schema!(
    ReserveBody,
    "Units kept for `high` (and for `normal` and higher).",
    from_json(json!({
        "type": "object",
        "properties": {
            "high": {"type": ["integer", "null"], "minimum": 0},
            "normal": {"type": ["integer", "null"], "minimum": 0},
        },
        "additionalProperties": false,
    }))
);
json_schema!(
    MatchBody,
    "Inbound throttling: the requests the limit applies to; `*` for any method or any path.",
    from_json(json!({
        "type": "object",
        "properties": {
            "method": {"type": "string", "pattern": "^(\\*|[A-Za-z]+)$", "minLength": 1,
                "maxLength": tollgate_rules::MATCH_METHOD_BYTES_MAX},
            "path": {"type": "string", "pattern": "^(\\*|/.*)$",
                "maxLength": tollgate_rules::MATCH_PATH_BYTES_MAX,
                "description": "`*`, or a path (normalized as /v1/check does)."},
        },
        "required": ["method", "path"],
        "additionalProperties": false,
    }))
);

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
