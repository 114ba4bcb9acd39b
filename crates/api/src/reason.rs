//! Why a request was not granted, on the wire: the core's `DenyReason` under its one name
//! (`DenyReason::as_str`). No list of reasons is written here: a reason the core adds is on the
//! wire, in the OpenAPI document and in the stats' `denials` with no edit in this crate.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use tollgate::DenyReason;

/// A denial's reason, written as `DenyReason::as_str` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reason(pub DenyReason);

impl Reason {
    pub fn as_str(self) -> &'static str {
        self.0.as_str()
    }

    /// The reason named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Reason> {
        DenyReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == name)
            .map(Reason)
    }
}

impl From<DenyReason> for Reason {
    fn from(reason: DenyReason) -> Reason {
        Reason(reason)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Reason, D::Error> {
        struct Name;

        impl Visitor<'_> for Name {
            type Value = Reason;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a denial reason")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Reason, E> {
                Reason::parse(name).ok_or_else(|| {
                    let names: Vec<&str> = DenyReason::ALL.iter().map(|r| r.as_str()).collect();
                    E::custom(format!(
                        "unknown reason {name:?}, expected one of {names:?}"
                    ))
                })
            }
        }

        deserializer.deserialize_str(Name)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Reason {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let meanings: Vec<String> = DenyReason::ALL
            .iter()
            .map(|reason| format!("`{}`, {}", reason.as_str(), reason.meaning()))
            .collect();
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(DenyReason::ALL.iter().map(|reason| reason.as_str())))
            .description(Some(format!(
                "Why a request was not granted: {}.",
                meanings.join("; ")
            )))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Reason {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("Reason")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_goes_and_comes_back_under_its_name() {
        for reason in DenyReason::ALL.map(Reason) {
            let text = serde_json::to_string(&reason).expect("json");
            assert_eq!(text, format!("\"{}\"", reason.0.as_str()));
            assert_eq!(
                serde_json::from_str::<Reason>(&text).expect("a reason"),
                reason
            );
        }
        assert!(serde_json::from_str::<Reason>("\"Capacity\"").is_err());
    }
}
