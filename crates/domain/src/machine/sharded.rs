//! A string-keyed map whose copy shares everything and whose change copies one shard of it.
//!
//! The machine is shared with the view the shell publishes after each change and copied by the
//! next change (`Arc::make_mut`), so a `HashMap` in it is copied whole, once per change: with
//! the providerIDs of 10,000 nodes learned one at a time, the autoscaler's first loop did
//! 10,000 copies of up to 10,000 entries (seconds of CPU, `benches/learned_nodes.rs`). Here a
//! copy of the map copies one pointer, and a change copies the table of shard pointers and the
//! one shard it touches. Entries are behind `Arc`s, so a shard's copy counts references instead
//! of allocating every string again.
//!
//! A persistent map would make a change O(log n) where this is O(n / [`SHARDS`]), but none is
//! a dependency of the workspace, and this crate has none; Kubernetes supports clusters of up
//! to 5,000 nodes, about 80 entries a shard.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

/// How many shards a map is split into. A change copies the table (this many pointers) and
/// one shard (n / this many entries): at 10,000 entries 64 and 128 measured alike, and 32 and
/// 256 took 1.5 to 2 times as long, the shard's copy or the table's then outweighing the other.
pub(crate) const SHARDS: usize = 64;

type Shard<V> = Option<Arc<HashMap<Arc<str>, Arc<V>>>>;

/// A `HashMap<String, V>` in [`SHARDS`] shards by hash of key, each shared between copies of
/// the map until one of them changes it.
#[derive(Clone)]
pub(crate) struct ShardedMap<V> {
    /// `None` until the first insert: most groups learn nothing, and then a change of their
    /// machine copies no table.
    shards: Option<Arc<[Shard<V>; SHARDS]>>,
    /// Picks a key's shard. Copied with the map, so a key's shard is the same in every copy;
    /// the shards' own maps hash with keys of their own, or the bits that chose the shard
    /// would also choose the bucket and every key of a shard would crowd into a few.
    chooser: RandomState,
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        ShardedMap {
            shards: None,
            chooser: RandomState::new(),
        }
    }
}

impl<V> ShardedMap<V> {
    fn shard_of(&self, key: &str) -> usize {
        // SipHash's low bits are as good as its high ones.
        (self.chooser.hash_one(key) as usize) % SHARDS
    }

    fn shard(&self, key: &str) -> Option<&HashMap<Arc<str>, Arc<V>>> {
        self.shards.as_ref()?[self.shard_of(key)].as_deref()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        self.shard(key)?.get(key).map(|v| &**v)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.shard(key).is_some_and(|s| s.contains_key(key))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.shards
            .iter()
            .flat_map(|table| table.iter())
            .flatten()
            .flat_map(|shard| shard.iter())
            .map(|(k, v)| (&**k, &**v))
    }
}

impl<V: Clone> ShardedMap<V> {
    /// The key's shard, copied first when another copy of the map shares it.
    fn shard_mut(&mut self, key: &str) -> &mut HashMap<Arc<str>, Arc<V>> {
        let i = self.shard_of(key);
        let table = self
            .shards
            .get_or_insert_with(|| Arc::new(std::array::from_fn(|_| None)));
        Arc::make_mut(Arc::make_mut(table)[i].get_or_insert_with(Default::default))
    }

    pub(crate) fn insert(&mut self, key: String, value: V) -> Option<V> {
        self.shard_mut(&key)
            .insert(key.into(), Arc::new(value))
            .map(Arc::unwrap_or_clone)
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<V> {
        // Removing what is not there copies nothing.
        if !self.contains_key(key) {
            return None;
        }
        self.shard_mut(key).remove(key).map(Arc::unwrap_or_clone)
    }
}

impl<V: fmt::Debug> fmt::Debug for ShardedMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether the two maps share the key's shard (neither copied it since they parted).
    fn shares_shard<V>(a: &ShardedMap<V>, b: &ShardedMap<V>, key: &str) -> bool {
        let i = a.shard_of(key);
        match (&a.shards, &b.shards) {
            (Some(x), Some(y)) => match (&x[i], &y[i]) {
                (Some(x), Some(y)) => Arc::ptr_eq(x, y),
                _ => false,
            },
            _ => false,
        }
    }

    #[test]
    fn a_change_copies_only_the_shard_it_touches() {
        let mut live = ShardedMap::default();
        for i in 0..2_000 {
            live.insert(format!("vm-{i}"), i);
        }
        let view = live.clone();
        live.insert("vm-7".into(), -7);
        assert_eq!(view.get("vm-7"), Some(&7), "the copy keeps its value");
        assert_eq!(live.get("vm-7"), Some(&-7));
        let touched = live.shard_of("vm-7");
        for i in 0..2_000 {
            let key = format!("vm-{i}");
            assert_eq!(
                shares_shard(&live, &view, &key),
                live.shard_of(&key) != touched,
                "{key}"
            );
        }
    }

    #[test]
    fn removing_a_missing_key_copies_nothing() {
        let mut live = ShardedMap::default();
        live.insert("a".to_string(), 1);
        let view = live.clone();
        assert_eq!(live.remove("b"), None);
        assert!(Arc::ptr_eq(
            live.shards.as_ref().expect("a table"),
            view.shards.as_ref().expect("a table")
        ));
        assert_eq!(live.remove("a"), Some(1));
        assert_eq!(view.get("a"), Some(&1));
        assert!(!live.contains_key("a"));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u8, u16),
        Remove(u8),
        /// Keep a copy of the map as it is now, as a published view.
        Publish,
    }

    /// Few enough keys that removals and overwrites find what they name.
    const KEYS: u8 = 64;

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..KEYS, any::<u16>()).prop_map(|(k, v)| Step::Insert(k, v)),
            2 => (0..KEYS).prop_map(Step::Remove),
            1 => Just(Step::Publish),
        ]
    }

    fn entries(m: &ShardedMap<u16>) -> HashMap<String, u16> {
        m.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Against a `HashMap` doing the same: the same answers, and every copy kept answers
        /// as the map did when it was copied, whatever changed after.
        #[test]
        fn answers_as_a_hash_map_and_copies_never_change(
            steps in proptest::collection::vec(step(), 1..200)
        ) {
            let mut map = ShardedMap::default();
            let mut model: HashMap<String, u16> = HashMap::new();
            let mut views: Vec<(ShardedMap<u16>, HashMap<String, u16>)> = Vec::new();
            for s in steps {
                match s {
                    Step::Insert(k, v) => {
                        let key = format!("key-{k}");
                        prop_assert_eq!(map.insert(key.clone(), v), model.insert(key.clone(), v));
                        prop_assert_eq!(map.get(&key), Some(&v));
                    }
                    Step::Remove(k) => {
                        let key = format!("key-{k}");
                        prop_assert_eq!(map.remove(&key), model.remove(&key));
                        prop_assert!(!map.contains_key(&key));
                    }
                    Step::Publish => views.push((map.clone(), model.clone())),
                }
            }
            for k in 0..KEYS {
                let key = format!("key-{k}");
                prop_assert_eq!(map.get(&key), model.get(&key));
                prop_assert_eq!(map.contains_key(&key), model.contains_key(&key));
            }
            prop_assert_eq!(entries(&map), model);
            for (view, then) in &views {
                prop_assert_eq!(&entries(view), then);
            }
        }
    }
}
