//! Readiness of the services in one process, for `GET /readyz` (an orchestrator's readiness
//! probe; `/healthz` stays liveness).
//!
//! Each service registers a component ([`Readiness::register`]) before it starts and marks it
//! ready once it can do its job (ingress serving, worker subscribed, cache subscribed with its
//! embedding model loaded, billing with its database migrated). The process is ready when every
//! registered component is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The components of one process. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<Mutex<BTreeMap<String, Component>>>,
}

/// One component's state as reported by `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Component {
    /// Ready to serve.
    pub ready: bool,
    /// What it is doing, e.g. `"loading embedding model"`, `"waiting for database: …"`, `"ready"`.
    pub detail: String,
}

/// A handle one component reports through.
#[derive(Debug, Clone)]
pub struct ReadyFlag {
    readiness: Readiness,
    name: String,
}

impl Readiness {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Component>) -> T) -> T {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut map)
    }

    /// Adds component `name`, not ready, with `detail`; returns its flag.
    pub fn register(&self, name: &str, detail: &str) -> ReadyFlag {
        self.with(|m| {
            m.insert(
                name.to_owned(),
                Component {
                    ready: false,
                    detail: detail.to_owned(),
                },
            )
        });
        ReadyFlag {
            readiness: self.clone(),
            name: name.to_owned(),
        }
    }

    /// Whether every registered component is ready (true with none registered), and each
    /// component's state by name.
    pub fn report(&self) -> (bool, BTreeMap<String, Component>) {
        let map = self.with(|m| m.clone());
        (map.values().all(|c| c.ready), map)
    }
}

impl ReadyFlag {
    /// Not ready (again), with what it waits for.
    pub fn waiting(&self, detail: impl Into<String>) {
        self.put(false, detail.into());
    }

    /// Ready.
    pub fn ready(&self) {
        self.put(true, "ready".to_owned());
    }

    fn put(&self, ready: bool, detail: String) {
        self.readiness
            .with(|m| m.insert(self.name.clone(), Component { ready, detail }));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ready_when_every_component_is() {
        let r = Readiness::default();
        assert!(r.report().0);
        let a = r.register("billing", "opening database");
        let b = r.register("cache", "loading embedding model");
        assert!(!r.report().0);
        a.ready();
        let (ready, map) = r.report();
        assert!(!ready);
        assert_eq!(map["billing"].detail, "ready");
        assert_eq!(map["cache"].detail, "loading embedding model");
        b.ready();
        assert!(r.report().0);
        a.waiting("waiting for database: refused");
        assert!(!r.report().0);
    }
}
