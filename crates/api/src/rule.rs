//! A rule as written: the body of `PUT /v1/limits/{name}`, a row of the rules table or an
//! entry of a limits file. Every field is optional and numbers are signed, so that the parser
//! refuses nothing with a vague message; the rules crate's `Validate` turns a `RawRule` into a
//! rule or an error that names the field and the reason.

use serde::{Deserialize, Serialize};

/// Longest `match.path` accepted in a rule, in bytes.
pub const MATCH_PATH_BYTES_MAX: usize = 1024;
/// Longest `match.method` accepted in a rule, in bytes.
pub const MATCH_METHOD_BYTES_MAX: usize = 16;

/// A rule as written: the body of `PUT /v1/limits/{name}`, or one row of the rules table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// Optional in a body (the name is in the path); when given it must equal the path's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `rate` or `concurrency`.
    #[serde(default)]
    pub kind: Option<String>,
    /// Units per period (rate) or leases outstanding (concurrency).
    #[serde(default, deserialize_with = "crate::number::optional")]
    pub limit: Option<i64>,
    /// Rate limits: the period, in milliseconds.
    #[serde(
        default,
        deserialize_with = "crate::number::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub period_ms: Option<i64>,
    /// Rate limits: `sliding` (default), `fixed` or `gcra`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// `gcra` only: the largest burst, in units (default: `limit`).
    #[serde(
        default,
        deserialize_with = "crate::number::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub burst: Option<i64>,
    /// Rate limits: time added to the period to absorb delivery jitter, in milliseconds.
    #[serde(
        default,
        deserialize_with = "crate::number::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub margin_ms: Option<i64>,
    /// Concurrency limits: how long a lease lives without renewal, in milliseconds.
    #[serde(
        default,
        deserialize_with = "crate::number::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub lease_ttl_ms: Option<i64>,
    /// Units kept for a priority level or higher.
    #[serde(
        default,
        deserialize_with = "object",
        skip_serializing_if = "Option::is_none"
    )]
    pub reserve: Option<RawReserve>,
    /// A label (`user`, `account`): each key given at acquire gets its own counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<String>,
    /// Limits counted `per` key: keys tracked at once at most, past which a new key is refused
    /// (`too_many_keys`) without touching any other limit. Default: the server's
    /// `keys_per_limit_max`.
    #[serde(
        default,
        deserialize_with = "crate::number::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub keys_max: Option<i64>,
    /// Inbound throttling: which requests the rule applies to.
    #[serde(
        default,
        rename = "match",
        deserialize_with = "object",
        skip_serializing_if = "Option::is_none"
    )]
    pub matcher: Option<RawMatch>,
}

/// An object, or null: serde would also read a struct from an array, by position, so that
/// `"reserve": [1, 2]` would pass for `{"high": 1, "normal": 2}`.
fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectOrNull<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectOrNull<T> {
        type Value = Option<T>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("an object or null")
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(
            self,
            deserializer: D2,
        ) -> Result<Option<T>, D2::Error> {
            deserializer.deserialize_map(self)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }

    deserializer.deserialize_option(ObjectOrNull(std::marker::PhantomData))
}

/// Units kept for `high` (and for `normal` and higher).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RawReserve {
    #[serde(
        default,
        deserialize_with = "crate::number::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub high: Option<i64>,
    #[serde(
        default,
        deserialize_with = "crate::number::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub normal: Option<i64>,
}

/// `{"method": "GET", "path": "/entity/#/bundle"}`; `*` for any method or any path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
}
