//! The OpenAPI schemas the derives cannot express: the error bodies by status, the shared
//! error responses and their headers, the constraints on names, keys and permit ids, and one
//! schema per kind of rule. The server's `/openapi.json` puts them together with the handlers'
//! annotations.

use std::borrow::Cow;

use serde_json::{Value, json};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{PartialSchema, ToResponse, ToSchema};

use crate::Code;

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
pub fn rate_limited_detail() -> RefOr<Schema> {
    error_detail(&[Code::RateLimited], false).into()
}

macro_rules! error_schema {
    ($name:ident, $description:literal, [$($code:expr),+], $field:literal) => {
        #[doc = $description]
        #[derive(Debug)]
        pub struct $name;

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
    [Code::Forbidden],
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
        #[derive(Debug)]
        pub struct $name;

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
     a valid token whose scope does not allow this (`forbidden`, with `WWW-Authenticate`).",
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
        #[derive(Debug)]
        pub struct $name;

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
        // Rust's `char::is_control`, which `check_key` refuses: C0, DEL and C1.
        .pattern(Some("^[^\\u0000-\\u001F\\u007F-\\u009F]+$"))
        .examples(["user-42"])
);
string_schema!(
    LimitPattern,
    "Which limits a scoped token may use: a limit's name, a prefix of names ending in `*` \
     (`vendor-*`), or `*` for all.",
    |schema| schema
        .min_length(Some(1))
        .max_length(Some(tollgate::LIMIT_NAME_BYTES_MAX + 1))
        .pattern(Some("^(\\*|[a-z0-9][a-z0-9._:-]*\\*?)$"))
        .examples(["vendor-*"])
);
string_schema!(
    PermitText,
    "A permit id as /v1/acquire hands it out: lower-case hex, opaque, tagged so that it \
     cannot be forged.",
    |schema| schema
        .min_length(Some(tollgate::PERMIT_ID_CHARS_MIN))
        .max_length(Some(tollgate::PERMIT_ID_CHARS_MAX))
        .pattern(Some("^([0-9a-f]{2})+$"))
);
string_schema!(UiAsset, "A file the dashboard's page loads.", |schema| {
    schema.enum_values(Some(["app.js", "style.css", "favicon.svg"]))
});
string_schema!(
    PriorityName,
    "A request's priority: a lower level never delays a higher one.",
    |schema| schema.enum_values(Some(
        tollgate::Priority::ALL
            .iter()
            .rev()
            .map(|priority| priority.as_str())
    ))
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

/// Every algorithm's name, and null (the default).
fn algorithm_names() -> Value {
    let mut names: Vec<Value> = tollgate::Algorithm::EACH
        .iter()
        .map(|algorithm| Value::from(algorithm.name()))
        .collect();
    names.push(Value::Null);
    Value::Array(names)
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
        #[derive(Debug)]
        pub struct $name;

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
            "algorithm": {"type": ["string", "null"], "enum": algorithm_names(),
                "description": "How the limit counts (default `sliding`)."},
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
                "maxLength": crate::rule::MATCH_METHOD_BYTES_MAX},
            "path": {"type": "string", "pattern": "^(\\*|/.*)$",
                "maxLength": crate::rule::MATCH_PATH_BYTES_MAX,
                "description": "`*`, or a path (normalized as /v1/check does)."},
        },
        "required": ["method", "path"],
        "additionalProperties": false,
    }))
);

// ---- A commit's `used` -----------------------------------------------------------------------

/// A commit's `used`: a number for every rate limit of the permit, or an object of numbers by
/// limit name.
#[derive(Debug)]
pub struct UsedSchema;

impl PartialSchema for UsedSchema {
    fn schema() -> RefOr<Schema> {
        let units = || {
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
        };
        OneOfBuilder::new()
            .description(Some(
                "Units used: one number for every rate limit of the permit, or an object \
                 giving each rate limit of the permit its own by name (a permit granted with \
                 `costs`); the rest are refunded.",
            ))
            .item(units())
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .additional_properties(Some(AdditionalProperties::RefOr(units().into())))
                    .examples([
                        json!({"model-requests": 1, "model-input": 640, "model-output": 212}),
                    ]),
            )
            .into()
    }
}

impl ToSchema for UsedSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Used")
    }
}

/// A cost per limit, by name: `costs` of an acquire or a charge.
#[derive(Debug)]
pub struct CostsSchema;

impl PartialSchema for CostsSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            // Null as absent, as the server reads it.
            .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                Type::Object,
                Type::Null,
            ]))
            .description(Some(
                "Units by limit name, for limits whose cost differs from `cost`; every name must \
                 be among `limits`.",
            ))
            .property_names(Some(LimitName::schema()))
            .additional_properties(Some(AdditionalProperties::RefOr(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1))
                    .maximum(Some(tollgate::core::UNITS_MAX))
                    .into(),
            )))
            .max_properties(Some(tollgate::COUNTERS_PER_REQUEST_MAX))
            .into()
    }
}

impl ToSchema for CostsSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Costs")
    }
}
