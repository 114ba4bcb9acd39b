//! Integers as JSON may write them: `86400000` or `86400000.0`. JSON has one number type and
//! JSON Schema's `integer` is any number without a fraction, so a client whose encoder writes
//! floats (as some do for every number) is read as it means. A fraction, or a float too large
//! to stand for one integer exactly, is refused.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, Visitor};

/// Past 2^53 neighbouring integers share one float: such a float is not read as an integer.
const EXACT_FLOAT_MAX: f64 = 9_007_199_254_740_992.0;

/// An integer type a JSON integer is read into.
pub(crate) trait Integer: Sized + TryFrom<u64> + TryFrom<i64> {
    const NAME: &'static str;
}

impl Integer for u64 {
    const NAME: &'static str = "u64";
}

impl Integer for i64 {
    const NAME: &'static str = "i64";
}

struct IntegerVisitor<T>(PhantomData<T>);

impl<T: Integer> IntegerVisitor<T> {
    fn out_of_range<E: de::Error>(unexpected: de::Unexpected<'_>) -> E {
        E::invalid_value(unexpected, &T::NAME)
    }
}

impl<T: Integer> Visitor<'_> for IntegerVisitor<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(T::NAME)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<T, E> {
        T::try_from(value).map_err(|_| Self::out_of_range(de::Unexpected::Unsigned(value)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<T, E> {
        T::try_from(value).map_err(|_| Self::out_of_range(de::Unexpected::Signed(value)))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<T, E> {
        let integral = value.fract() == 0.0 && value.abs() <= EXACT_FLOAT_MAX;
        if !integral {
            return Err(E::invalid_type(de::Unexpected::Float(value), &T::NAME));
        }
        // Exact: an integral float of at most 2^53 converts without loss.
        #[allow(clippy::cast_possible_truncation)]
        let whole = value as i64;
        self.visit_i64(whole)
    }
}

/// `#[serde(deserialize_with = "number::integer")]`.
pub(crate) fn integer<'de, D: Deserializer<'de>, T: Integer>(
    deserializer: D,
) -> Result<T, D::Error> {
    deserializer.deserialize_any(IntegerVisitor(PhantomData))
}

/// `#[serde(default, deserialize_with = "number::optional")]`: absent or null is `None`.
pub(crate) fn optional<'de, D: Deserializer<'de>, T: Integer>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    struct Optional<T>(PhantomData<T>);

    impl<'de, T: Integer> Visitor<'de> for Optional<T> {
        type Value = Option<T>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(formatter, "{} or null", T::NAME)
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
            integer(deserializer).map(Some)
        }
    }

    deserializer.deserialize_option(Optional(PhantomData))
}

/// A map of names to integers, each read as `integer` reads one.
struct IntegerMap;

impl<'de> Visitor<'de> for IntegerMap {
    type Value = std::collections::BTreeMap<String, u64>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an object of u64 by limit name")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        struct Units(u64);
        impl<'de> de::Deserialize<'de> for Units {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Units, D::Error> {
                integer(deserializer).map(Units)
            }
        }
        let mut each = std::collections::BTreeMap::new();
        while let Some((name, Units(units))) = map.next_entry::<String, Units>()? {
            if each.insert(name.clone(), units).is_some() {
                return Err(de::Error::custom(format_args!(
                    "limit {name:?} is named twice"
                )));
            }
        }
        Ok(each)
    }
}

/// `#[serde(default, deserialize_with = "number::optional_map")]`: absent or null is `None`.
pub(crate) fn optional_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<std::collections::BTreeMap<String, u64>>, D::Error> {
    struct Optional;

    impl<'de> Visitor<'de> for Optional {
        type Value = Option<std::collections::BTreeMap<String, u64>>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("an object of u64 by limit name, or null")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_map(IntegerMap).map(Some)
        }
    }

    deserializer.deserialize_option(Optional)
}

/// A commit's `used`: one integer, or an object of integers by limit name.
pub(crate) fn units_or_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<crate::data::Used, D::Error> {
    struct Either;

    impl<'de> Visitor<'de> for Either {
        type Value = crate::data::Used;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("u64, or an object of u64 by limit name")
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
            IntegerVisitor::<u64>(PhantomData)
                .visit_u64(value)
                .map(crate::data::Used::All)
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
            IntegerVisitor::<u64>(PhantomData)
                .visit_i64(value)
                .map(crate::data::Used::All)
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
            IntegerVisitor::<u64>(PhantomData)
                .visit_f64(value)
                .map(crate::data::Used::All)
        }

        fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            IntegerMap.visit_map(map).map(crate::data::Used::Each)
        }
    }

    deserializer.deserialize_any(Either)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Body {
        #[serde(deserialize_with = "super::integer")]
        units: u64,
        #[serde(default, deserialize_with = "super::optional")]
        signed: Option<i64>,
    }

    fn read(json: &str) -> Result<Body, String> {
        serde_json::from_str(json).map_err(|error| error.to_string())
    }

    #[test]
    fn an_integral_float_reads_as_its_integer_and_nothing_else_does() {
        let body = read(r#"{"units": 86400000.0, "signed": -5.0}"#).expect("integral");
        assert_eq!((body.units, body.signed), (86_400_000, Some(-5)));
        let body = read(r#"{"units": 7, "signed": null}"#).expect("plain");
        assert_eq!((body.units, body.signed), (7, None));
        assert_eq!(read(r#"{"units": 7}"#).expect("absent").signed, None);
        for (json, says) in [
            (r#"{"units": 1.5}"#, "floating point `1.5`, expected u64"),
            (r#"{"units": -1}"#, "integer `-1`, expected u64"),
            (r#"{"units": -1.0}"#, "integer `-1`, expected u64"),
            (r#"{"units": 1e300}"#, "expected u64"),
            (r#"{"units": 9007199254740994.0}"#, "expected u64"),
            (r#"{"units": "7"}"#, "string \"7\", expected u64"),
            (
                r#"{"units": 1, "signed": 18446744073709551615}"#,
                "expected i64",
            ),
        ] {
            let error = read(json).expect_err(json);
            assert!(error.contains(says), "{json}: {error}");
        }
    }
}
