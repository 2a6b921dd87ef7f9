//! Why assembly refuses to open an array: its members' metadata is damaged (reported as
//! `BlockError::Corrupt`, the kind `strata check` and an operator act on), or the members do
//! not make one array as configured (`InvalidArgument`: stale, split, reordered, missing).

use std::fmt;
use std::ops::Deref;

use strata_core::BlockError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No readable metadata copy, and a damaged one: never formatted over.
    Damaged(String),
    /// Anything else that stops the open.
    Refused(String),
}

impl Refusal {
    /// The error of layer `layer` (e.g. "mirror m0") refusing for this reason, of its kind.
    pub fn error(self, layer: &str) -> BlockError {
        match self {
            Refusal::Damaged(why) => BlockError::Corrupt(format!("{layer}: {why}")),
            Refusal::Refused(why) => BlockError::InvalidArgument(format!("{layer}: {why}")),
        }
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal::Refused(why)
    }
}

/// The reason as text, so that tests and messages read a refusal like the string it carries.
impl Deref for Refusal {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Refusal::Damaged(why) | Refusal::Refused(why) => why,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}
