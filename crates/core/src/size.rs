//! Byte sizes as administrators write them: `1GiB`, `512MiB`, `4096`.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A size in bytes, parsed from an integer or from a number with a binary unit suffix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("T", 1 << 40),
    ("G", 1 << 30),
    ("M", 1 << 20),
    ("K", 1 << 10),
    ("B", 1),
];

impl ByteSize {
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let text = text.trim();
        let (number, multiplier) = UNITS
            .iter()
            .find_map(|(suffix, mult)| text.strip_suffix(suffix).map(|n| (n.trim(), *mult)))
            .unwrap_or((text, 1));
        let value: u64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a size (examples: 4096, 512MiB, 16GiB)"))?;
        value
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| format!("{text:?} is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        for (suffix, mult) in &UNITS[..4] {
            if bytes >= *mult && bytes.is_multiple_of(*mult) {
                return write!(f, "{}{suffix}", bytes / mult);
            }
        }
        write!(f, "{bytes}B")
    }
}

/// Written back the way an administrator would write it (`"64KiB"`, `"1000B"`), which
/// [`ByteSize::parse`] reads again to the same value.
impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 1GiB, 512MiB or a number of bytes")
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<ByteSize, E> {
                u64::try_from(value)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<ByteSize, E> {
                ByteSize::parse(value).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_plain_bytes() {
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("1GiB"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse("512 MiB"), Ok(ByteSize(512 << 20)));
        assert_eq!(ByteSize::parse("2T"), Ok(ByteSize(2 << 40)));
        assert!(ByteSize::parse("1.5GiB").is_err());
        assert!(ByteSize::parse("lots").is_err());
        assert!(ByteSize::parse("99999999999TiB").is_err());
    }

    #[test]
    fn displays_the_largest_exact_unit() {
        assert_eq!(ByteSize(16 << 30).to_string(), "16GiB");
        assert_eq!(ByteSize(1536 << 20).to_string(), "1536MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }

    proptest::proptest! {
        #[test]
        fn display_parses_back_to_the_same_size(bytes in proptest::prelude::any::<u64>()) {
            proptest::prop_assert_eq!(ByteSize::parse(&ByteSize(bytes).to_string()), Ok(ByteSize(bytes)));
        }
    }
}
