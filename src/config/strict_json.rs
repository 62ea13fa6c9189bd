//! JSON read into a [`serde_json::Value`], refusing a key given twice in one object.
//!
//! `serde_json::from_str::<Value>` keeps the last of two equal keys, so a file with two
//! `"max_units"` in one pool, or two pools of one name, would load with one of them silently
//! dropped. The YAML parser refuses such a file; this reader makes JSON do the same, naming
//! the key's field path: `pools.p.max_units: duplicate key `max_units` at line 1 column 41`.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::settings::error::ConfigError;
use crate::settings::quote;

/// Parses `text` as one JSON document without duplicate keys.
pub(crate) fn parse(text: &str) -> Result<Value, ConfigError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let UniqueKeys(value) =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            if error.inner().is_data() {
                ConfigError::invalid(
                    quote::path(error.path()),
                    quote::problem(&error.inner().to_string()),
                )
            } else {
                syntax(error.inner())
            }
        })?;
    deserializer.end().map_err(|error| syntax(&error))?;
    Ok(value)
}

fn syntax(error: &serde_json::Error) -> ConfigError {
    ConfigError::syntax("JSON", &error.to_string())
}

/// A JSON value whose objects had no key twice.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(UniqueKeysVisitor)
            .map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, flag: bool) -> Result<Value, E> {
        Ok(Value::Bool(flag))
    }

    fn visit_i64<E>(self, number: i64) -> Result<Value, E> {
        Ok(number.into())
    }

    fn visit_u64<E>(self, number: u64) -> Result<Value, E> {
        Ok(number.into())
    }

    fn visit_f64<E>(self, number: f64) -> Result<Value, E> {
        Ok(number.into())
    }

    fn visit_str<E>(self, text: &str) -> Result<Value, E> {
        Ok(text.into())
    }

    fn visit_string<E>(self, text: String) -> Result<Value, E> {
        Ok(text.into())
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut array = Vec::new();
        while let Some(UniqueKeys(item)) = items.next_element()? {
            array.push(item);
        }
        Ok(Value::Array(array))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            if object.contains_key(&key) {
                // Refused while reading the key's value, so the error's path ends in the key.
                return entries.next_value_seed(DuplicateKey(key));
            }
            let UniqueKeys(value) = entries.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// The value of a key seen before in the same object: always an error.
struct DuplicateKey(String);

impl<'de> DeserializeSeed<'de> for DuplicateKey {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, _value: D) -> Result<Value, D::Error> {
        Err(de::Error::custom(format_args!(
            "duplicate key `{}`",
            quote::name(&self.0)
        )))
    }
}
