//! Coordination within one process: what Redis would hold, in a map. With
//! no other replica, every lease is this process's to take and nothing is
//! shared; it keeps the callers' code the same whether or not Redis is there.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

enum Value {
    Text(String),
    Hash(HashMap<String, String>),
}

struct Entry {
    value: Value,
    expires_at: Option<Instant>,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.expires_at.is_none_or(|t| t > now)
    }
}

/// The in-process backend of [`super::Coordination`]: a few keys (one per
/// governor, the knobs), so a lock over one map is enough.
#[derive(Default)]
pub struct MemoryCoordination {
    entries: Mutex<HashMap<String, Entry>>,
}

impl MemoryCoordination {
    /// The live entries (expired ones are dropped on the way).
    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, e| e.live(now));
        map
    }

    pub(super) fn get(&self, key: &str) -> Option<String> {
        match self.entries().get(key).map(|e| &e.value) {
            Some(Value::Text(t)) => Some(t.clone()),
            _ => None,
        }
    }

    pub(super) fn set_if_absent(&self, key: &str, value: &str, ttl: Option<Duration>) -> bool {
        let mut map = self.entries();
        if map.contains_key(key) {
            return false;
        }
        map.insert(
            key.to_owned(),
            Entry {
                value: Value::Text(value.to_owned()),
                expires_at: ttl.map(|t| Instant::now() + t),
            },
        );
        true
    }

    pub(super) fn hold(&self, key: &str, holder: &str, ttl: Duration) -> bool {
        let mut map = self.entries();
        let mine = match map.get(key).map(|e| &e.value) {
            None => true,
            Some(Value::Text(t)) => t == holder,
            Some(Value::Hash(_)) => false,
        };
        if mine {
            map.insert(
                key.to_owned(),
                Entry {
                    value: Value::Text(holder.to_owned()),
                    expires_at: Some(Instant::now() + ttl),
                },
            );
        }
        mine
    }

    pub(super) fn release(&self, key: &str, holder: &str) -> bool {
        let mut map = self.entries();
        let mine = matches!(map.get(key).map(|e| &e.value), Some(Value::Text(t)) if t == holder);
        if mine {
            map.remove(key);
        }
        mine
    }

    pub(super) fn hash_get(&self, key: &str, field: &str) -> Option<String> {
        match self.entries().get(key).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.get(field).cloned(),
            _ => None,
        }
    }

    pub(super) fn hash_get_all(&self, key: &str) -> HashMap<String, String> {
        match self.entries().get(key).map(|e| &e.value) {
            Some(Value::Hash(h)) => h.clone(),
            _ => HashMap::new(),
        }
    }

    pub(super) fn hash_set(
        &self,
        key: &str,
        fields: Vec<(String, String)>,
        life: Option<Duration>,
    ) {
        let mut map = self.entries();
        let entry = map.entry(key.to_owned()).or_insert_with(|| Entry {
            value: Value::Hash(HashMap::new()),
            expires_at: None,
        });
        if !matches!(entry.value, Value::Hash(_)) {
            entry.value = Value::Hash(HashMap::new());
        }
        if let Value::Hash(h) = &mut entry.value {
            h.extend(fields);
        }
        if let Some(life) = life {
            entry.expires_at = Some(Instant::now() + life);
        }
    }

    pub(super) fn hash_delete_if(&self, key: &str, fields: &[(String, String)]) {
        let held: Vec<String> = fields
            .iter()
            .filter(|(f, v)| self.hash_get(key, f).as_ref() == Some(v))
            .map(|(f, _)| f.clone())
            .collect();
        self.hash_delete(key, &held);
    }

    pub(super) fn hash_delete(&self, key: &str, fields: &[String]) {
        let mut map = self.entries();
        let emptied = match map.get_mut(key).map(|e| &mut e.value) {
            Some(Value::Hash(h)) => {
                for f in fields {
                    h.remove(f);
                }
                h.is_empty()
            }
            _ => false,
        };
        // As in Redis, a hash without fields is gone.
        if emptied {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Coordination;
    use std::time::Duration;

    #[tokio::test]
    async fn a_lease_is_held_by_one_holder_until_released_or_lapsed() {
        let c = Coordination::in_process();
        let ttl = Duration::from_secs(60);
        assert!(c.hold("l", "a", ttl).await.unwrap());
        assert!(c.hold("l", "a", ttl).await.unwrap());
        assert!(!c.hold("l", "b", ttl).await.unwrap());
        assert_eq!(c.get("l").await.unwrap().as_deref(), Some("a"));
        assert!(!c.release("l", "b").await.unwrap());
        assert!(c.release("l", "a").await.unwrap());
        assert!(c.hold("l", "b", Duration::from_millis(1)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(c.hold("l", "a", ttl).await.unwrap());
    }

    #[tokio::test]
    async fn a_value_is_written_once() {
        let c = Coordination::in_process();
        assert!(!c.is_shared());
        assert!(c.set_if_absent("k", "1", None).await.unwrap());
        assert!(!c.set_if_absent("k", "2", None).await.unwrap());
        assert_eq!(c.get("k").await.unwrap().as_deref(), Some("1"));
    }

    #[tokio::test]
    async fn hash_fields_are_written_read_and_removed() {
        let c = Coordination::in_process();
        let fields = vec![("a".into(), "1".into()), ("b".into(), "2".into())];
        c.hash_set("h", fields, None).await.unwrap();
        assert_eq!(c.hash_get("h", "a").await.unwrap().as_deref(), Some("1"));
        c.hash_delete("h", vec!["a".into()]).await.unwrap();
        let all = c.hash_get_all("h").await.unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all.get("b").map(String::as_str), Some("2"));
        c.hash_set(
            "h",
            vec![("c".into(), "3".into())],
            Some(Duration::from_millis(1)),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(c.hash_get_all("h").await.unwrap().is_empty());
        assert!(c
            .renew_shares(&super::super::ShareRenewal {
                purpose: "test",
                holder: "a",
                life_ms: 1,
                floor: 0.0,
                headroom: 0.0,
                fallback: crate::quota::Fallback {
                    share: 0.0,
                    hold_ms: 0,
                },
                asks: vec![],
            })
            .await
            .is_err());
    }
}
