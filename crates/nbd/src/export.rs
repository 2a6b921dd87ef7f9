//! The catalog of named exports a server offers.
//!
//! Lock rule: the catalog's lock is held only to look up or change the map, never across I/O.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use strata_core::DeviceRef;

/// One named export: a device and how clients may use it.
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: DeviceRef,
    pub read_only: bool,
    /// Client identities (names in their TLS certificates) that may open this export;
    /// empty: any client.
    pub allow: Vec<String>,
}

/// The exports a server offers. Exports can be added and removed while clients are connected;
/// a connection keeps the export it opened until it disconnects.
#[derive(Default)]
pub struct Exports {
    inner: RwLock<Catalog>,
}

#[derive(Default)]
struct Catalog {
    by_name: BTreeMap<String, Arc<Export>>,
    /// Which export the empty name ("") selects.
    default_name: Option<String>,
}

impl Exports {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces an export. The first export added, or one named "default", becomes
    /// what the empty name selects unless [`Exports::set_default`] says otherwise.
    pub fn insert(&self, export: Export) {
        let mut catalog = self.inner.write().expect("export catalog lock poisoned");
        let name = export.name.clone();
        if catalog.default_name.is_none() || name == "default" {
            catalog.default_name = Some(name.clone());
        }
        catalog.by_name.insert(name, Arc::new(export));
    }

    pub fn remove(&self, name: &str) -> Option<Arc<Export>> {
        let mut catalog = self.inner.write().expect("export catalog lock poisoned");
        let removed = catalog.by_name.remove(name);
        if catalog.default_name.as_deref() == Some(name) {
            catalog.default_name = catalog.by_name.keys().next().cloned();
        }
        removed
    }

    pub fn set_default(&self, name: &str) {
        let mut catalog = self.inner.write().expect("export catalog lock poisoned");
        catalog.default_name = Some(name.to_string());
    }

    /// Finds an export by name; "" selects the default export.
    pub fn lookup(&self, name: &str) -> Option<Arc<Export>> {
        let catalog = self.inner.read().expect("export catalog lock poisoned");
        let name = if name.is_empty() {
            catalog.default_name.as_deref()?
        } else {
            name
        };
        catalog.by_name.get(name).cloned()
    }

    /// Every export, in name order.
    pub fn list(&self) -> Vec<Arc<Export>> {
        let catalog = self.inner.read().expect("export catalog lock poisoned");
        catalog.by_name.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_backend::MemoryDevice;

    fn export(name: &str) -> Export {
        Export {
            name: name.into(),
            description: String::new(),
            device: Arc::new(MemoryDevice::new(4096)),
            read_only: false,
            allow: Vec::new(),
        }
    }

    #[test]
    fn empty_name_prefers_default_then_first() {
        let exports = Exports::new();
        assert!(exports.lookup("").is_none());
        exports.insert(export("b"));
        exports.insert(export("a"));
        assert_eq!(exports.lookup("").unwrap().name, "b");
        exports.insert(export("default"));
        assert_eq!(exports.lookup("").unwrap().name, "default");
        exports.remove("default");
        assert_eq!(exports.lookup("").unwrap().name, "a");
        assert!(exports.lookup("missing").is_none());
        assert_eq!(exports.list().len(), 2);
    }
}
