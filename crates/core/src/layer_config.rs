//! Typed layer configurations: a kind's options, as the configuration gave them, read into the
//! kind's serde struct, and the struct written back as a TOML table for `describe`.
//!
//! Why a deserializer of our own rather than going through `toml::Value`: errors must name the
//! field (`field `chunk`: …`) as the untyped accessors did, and serde's value deserializers do
//! not say which field failed. This one wraps every value error with its key, and answers an
//! unknown key with the list of the struct's fields (known from `deserialize_struct`).

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::{forward_to_deserialize_any, Serialize};

use crate::layer::{OptionValue, Options};

/// Why options do not fit a kind's struct; the message names the field.
#[derive(Debug)]
pub struct OptionsError {
    pub message: String,
    /// For an unknown field: the struct's fields.
    known: Option<&'static [&'static str]>,
}

impl OptionsError {
    fn new(message: String) -> Self {
        OptionsError {
            message,
            known: None,
        }
    }

    fn unknown(field: &str, known: &'static [&'static str]) -> Self {
        let message = if known.is_empty() {
            format!("field `{field}`: unknown option (this kind takes none)")
        } else {
            format!(
                "field `{field}`: unknown option (known: {})",
                known.join(", ")
            )
        };
        OptionsError {
            message,
            known: Some(known),
        }
    }
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OptionsError {}

impl de::Error for OptionsError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        OptionsError::new(message.to_string())
    }

    fn missing_field(field: &'static str) -> Self {
        OptionsError::new(format!("field `{field}` is required"))
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        OptionsError::unknown(field, expected)
    }
}

/// Reads `options` into `T`. Every error names the field it is about.
pub(crate) fn parse<T: DeserializeOwned>(options: &Options) -> Result<T, OptionsError> {
    T::deserialize(OptionsDeserializer { options })
}

struct OptionsDeserializer<'a> {
    options: &'a Options,
}

impl<'de> de::Deserializer<'de> for OptionsDeserializer<'_> {
    type Error = OptionsError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, OptionsError> {
        visitor.visit_map(Entries {
            entries: self.options.entries(),
            current: None,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, OptionsError> {
        // Checked here as well as by `deny_unknown_fields`, so that a struct that forgot the
        // attribute still refuses what it does not know.
        if let Some(key) = self.options.keys().find(|key| !fields.contains(key)) {
            return Err(OptionsError::unknown(key, fields));
        }
        self.deserialize_any(visitor)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

struct Entries<'a, I: Iterator<Item = (&'a str, &'a OptionValue)>> {
    entries: I,
    current: Option<(&'a str, &'a OptionValue)>,
}

impl<'de, 'a, I: Iterator<Item = (&'a str, &'a OptionValue)>> MapAccess<'de> for Entries<'a, I> {
    type Error = OptionsError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, OptionsError> {
        self.current = self.entries.next();
        match self.current {
            None => Ok(None),
            Some((key, _)) => seed
                .deserialize(key.to_string().into_deserializer())
                .map(Some),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, OptionsError> {
        let (key, value) = self
            .current
            .take()
            .expect("serde asks for a value after its key");
        seed.deserialize(ValueDeserializer(value))
            .map_err(|e| OptionsError::new(format!("field `{key}`: {e}")))
    }
}

struct ValueDeserializer<'a>(&'a OptionValue);

impl<'de> de::Deserializer<'de> for ValueDeserializer<'_> {
    type Error = OptionsError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, OptionsError> {
        match self.0 {
            OptionValue::Text(text) => visitor.visit_str(text),
            OptionValue::Integer(n) => visitor.visit_i64(*n),
            OptionValue::Float(x) => visitor.visit_f64(*x),
            OptionValue::Bool(b) => visitor.visit_bool(*b),
        }
    }

    /// A value that is present is `Some`: absence is the field missing from the map.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, OptionsError> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, OptionsError> {
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// The names of `T`'s fields as a configuration writes them, so that a kind's list of options
/// is its struct: read from the refusal of a key no struct has, which lists the known ones.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut values = std::collections::BTreeMap::new();
    values.insert("\0".to_string(), OptionValue::Bool(true));
    match parse::<T>(&Options::new(values, Default::default())) {
        Err(OptionsError {
            known: Some(fields),
            ..
        }) => fields,
        _ => &[],
    }
}

/// A kind's configuration as a TOML table, for `NodeStatus::config`: what a `[[layer]]`
/// table holds besides `name`, `kind` and `children`.
///
/// None only if the struct holds a value TOML cannot carry (an integer above `i64::MAX`),
/// which no configuration can have given.
pub fn to_table<T: Serialize>(config: &T) -> Option<toml::Table> {
    toml::Table::try_from(config).ok()
}

/// A described (or parsed) table as options again: the way back from `describe`.
pub fn options_from_table(
    table: &toml::Table,
    base: std::path::PathBuf,
) -> Result<Options, OptionsError> {
    let values = table
        .iter()
        .map(|(key, value)| {
            let value = match value {
                toml::Value::String(s) => OptionValue::Text(s.clone()),
                toml::Value::Integer(n) => OptionValue::Integer(*n),
                toml::Value::Float(x) => OptionValue::Float(*x),
                toml::Value::Boolean(b) => OptionValue::Bool(*b),
                _ => {
                    return Err(OptionsError::new(format!(
                        "field `{key}`: must be a string, number or boolean"
                    )))
                }
            };
            Ok((key.clone(), value))
        })
        .collect::<Result<_, _>>()?;
    Ok(Options::new(values, base))
}
