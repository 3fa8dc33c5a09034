//! A payload's text held once and shared: the job, the worker's ledger,
//! the settle script's argument and a handler's stdin line or POST body
//! all read the same bytes.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// Text shared without copying. Built from a `String` it keeps that
/// string's buffer (an `Arc<str>` would copy it, and a payload can be
/// megabytes: the reply's bytes become the job's text as they are).
/// Compares, hashes and borrows as the `str` it holds, so a map keyed by
/// it is looked up with a `&str`.
#[derive(Clone, Default)]
pub struct SharedText(Arc<String>);

impl SharedText {
    /// The text as a `str`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for SharedText {
    fn from(text: String) -> Self {
        Self(Arc::new(text))
    }
}

impl From<&str> for SharedText {
    fn from(text: &str) -> Self {
        Self(Arc::new(text.to_string()))
    }
}

impl Deref for SharedText {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedText {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The bytes of the text: what `bytes::Bytes::from_owner` takes, so an
/// HTTP body is the shared text itself.
impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl Borrow<str> for SharedText {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq for SharedText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SharedText {}

impl PartialEq<str> for SharedText {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

/// As `str` hashes, which `Borrow<str>` requires.
impl Hash for SharedText {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for SharedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for SharedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_string_becomes_shared_text_without_a_copy_and_maps_look_it_up_by_str() {
        let text = String::from("{\"id\":\"a\"}");
        let at = text.as_ptr();
        let shared = SharedText::from(text);
        assert_eq!(shared.as_ptr(), at, "the string's own buffer");
        assert_eq!(shared.clone().as_ptr(), at);
        let map = HashMap::from([(shared, 1)]);
        assert_eq!(map.get("{\"id\":\"a\"}"), Some(&1));
    }
}
