//! The server's prompt cache, as mlx-lm 0.32.2's server keeps one
//! (`LRUPromptCache` in `mlx_lm/models/cache.py`, used by
//! `mlx_lm/server.py`): a finished request's cache, keyed by the token ids
//! it holds (its prompt and every token it returned), is kept so that a
//! later prompt that extends it is prefilled from there, only its new
//! tokens computed.
//!
//! Lookup is `fetch_nearest_cache`: the longest stored sequence that is a
//! prefix of the prompt; or, when a stored sequence shares a longer common
//! prefix with the prompt (it went on differently, or past the prompt's
//! end) and its cache can be trimmed (`can_trim_prompt_cache`: full
//! attention always; a sliding window only while its ring has not wrapped;
//! a Gated DeltaNet state never), a copy of it trimmed to that common
//! prefix. At least one prompt token is always left to compute: the model
//! needs a last token to give the first logits (mlx-lm's batched path
//! refuses an exact hit as an empty prompt instead; archgen trims one token
//! or takes a shorter entry).
//!
//! Insertion is `insert_cache`: a trimmable cache replaces the stored
//! prefixes of its sequence (they are trims of it). Entries are of a kind:
//! a prompt's segment ends (its system turns, its user turn: segments.rs)
//! and finished sequences. The cache is bounded by the bytes of the arrays
//! it holds (`--prompt-cache-bytes`) and by its number of entries
//! (`--prompt-cache-size`, mlx-lm's 10), evicting until both hold, as
//! mlx-lm's `CacheOrder.pop` picks: from the finished sequences while they
//! are at least as many as the user-turn entries, else from those while
//! they are at least as many as the system ones, else a system entry; within
//! a kind the least recently used (inserted or hit).

use archgen_runtime::seq_cache::SeqCache;

use super::segments::SegmentKind;

/// A stored sequence's cache.
struct Entry {
    tokens: Vec<i32>,
    cache: SeqCache,
    nbytes: usize,
    kind: SegmentKind,
}

/// The kinds in the order eviction considers them (`CacheOrder`).
const EVICTION_ORDER: [SegmentKind; 3] = [
    SegmentKind::Assistant,
    SegmentKind::User,
    SegmentKind::System,
];

/// A hit: the cache to start from and the prompt tokens it holds.
pub struct Hit {
    pub cache: SeqCache,
    pub cached_tokens: usize,
}

/// An LRU of sequence caches bounded by bytes and entries.
pub struct PromptCache {
    max_bytes: usize,
    max_entries: usize,
    /// Least recently used first.
    entries: Vec<Entry>,
    bytes: usize,
}

fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    pub fn new(max_bytes: usize, max_entries: usize) -> Self {
        PromptCache {
            max_bytes,
            max_entries,
            entries: Vec::new(),
            bytes: 0,
        }
    }

    /// The bytes of the arrays held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The sequences held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The cache to start `prompt` from (see the module comment), or `None`.
    /// The stored entry stays; a hit makes it the most recently used.
    pub fn fetch(&mut self, prompt: &[i32]) -> Result<Option<Hit>, String> {
        let limit = prompt.len().saturating_sub(1);
        // The longest stored strict prefix (mlx-lm's `shorter`: at least two
        // tokens long, as its trie search counts it).
        let shorter = (0..self.entries.len())
            .filter(|&i| {
                let t = &self.entries[i].tokens;
                t.len() >= 2 && t.len() <= limit && prompt.starts_with(t)
            })
            .max_by_key(|&i| self.entries[i].tokens.len());
        let short_len = shorter.map_or(0, |i| self.entries[i].tokens.len());
        // The deepest common prefix with any entry, and the shortest entry
        // that reaches it (mlx-lm's `longer`).
        let longer = (0..self.entries.len())
            .map(|i| (common_prefix(&self.entries[i].tokens, prompt), i))
            .filter(|&(common, _)| common > 0)
            .max_by(|a, b| {
                a.0.cmp(&b.0).then(
                    self.entries[b.1]
                        .tokens
                        .len()
                        .cmp(&self.entries[a.1].tokens.len()),
                )
            });
        if let Some((common, i)) = longer {
            let keep = common.min(limit);
            if keep > short_len && keep > 0 && self.entries[i].cache.is_trimmable() {
                let mut cache = self.entries[i].cache.clone();
                if keep < self.entries[i].tokens.len() {
                    cache.truncate(keep).map_err(|e| e.to_string())?;
                }
                self.touch(i);
                return Ok(Some(Hit {
                    cache,
                    cached_tokens: keep,
                }));
            }
        }
        Ok(shorter.map(|i| {
            let hit = Hit {
                cache: self.entries[i].cache.clone(),
                cached_tokens: self.entries[i].tokens.len(),
            };
            self.touch(i);
            hit
        }))
    }

    /// Stores `cache`, which holds `tokens`, as an entry of `kind`, then
    /// evicts (see the module comment) until the bounds hold (an entry
    /// larger than the byte bound alone is not kept).
    pub fn insert(&mut self, tokens: Vec<i32>, cache: SeqCache, kind: SegmentKind) {
        let trimmable = cache.is_trimmable();
        self.entries.retain(|e| {
            // The same sequence is replaced; a trimmable cache makes its
            // stored prefixes redundant (mlx-lm's `pop_prefixes`).
            let drop = e.tokens == tokens
                || (trimmable && e.tokens.len() < tokens.len() && tokens.starts_with(&e.tokens));
            !drop
        });
        let nbytes = cache.nbytes();
        self.entries.push(Entry {
            tokens,
            cache,
            nbytes,
            kind,
        });
        self.bytes = self.entries.iter().map(|e| e.nbytes).sum();
        while !self.entries.is_empty()
            && (self.entries.len() > self.max_entries || self.bytes > self.max_bytes)
        {
            let evicted = self.entries.remove(self.victim());
            self.bytes -= evicted.nbytes;
        }
    }

    /// The entry to evict (`CacheOrder.pop`): the least recently used of
    /// the first kind in [`EVICTION_ORDER`] that has entries and at least
    /// as many as the next kind; the last kind otherwise.
    fn victim(&self) -> usize {
        let count = |kind| self.entries.iter().filter(|e| e.kind == kind).count();
        let kind = EVICTION_ORDER
            .windows(2)
            .find(|pair| count(pair[0]) > 0 && count(pair[0]) >= count(pair[1]))
            .map_or(EVICTION_ORDER[EVICTION_ORDER.len() - 1], |pair| pair[0]);
        self.entries
            .iter()
            .position(|e| e.kind == kind)
            .unwrap_or(0)
    }

    fn touch(&mut self, i: usize) {
        let entry = self.entries.remove(i);
        self.entries.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use archgen_runtime::mlx_rs::Array;
    use archgen_runtime::seq_cache::SeqLayerCache;
    use SegmentKind::*;

    /// A one-layer full-attention cache of `len` tokens: 2 f32 of keys and
    /// 2 of values per token (16 bytes a token); key i holds i.
    fn full(len: i32) -> SeqCache {
        let keys: Vec<f32> = (0..len * 2).map(|i| (i / 2) as f32).collect();
        let keys = Array::from_slice(&keys, &[1, 1, len, 2]);
        SeqCache {
            layers: vec![Some(SeqLayerCache::Full {
                values: keys.clone(),
                keys,
            })],
        }
    }

    /// A Gated DeltaNet layer beside the full one: never trimmable.
    fn recurrent(len: i32) -> SeqCache {
        let mut cache = full(len);
        cache.layers.push(Some(SeqLayerCache::Arrays {
            conv: Array::from_slice(&[0f32; 4], &[1, 2, 2]),
            state: Some(Array::from_slice(&[0f32; 4], &[1, 1, 2, 2])),
        }));
        cache
    }

    fn cached_len(hit: &Hit) -> i32 {
        match &hit.cache.layers[0] {
            Some(SeqLayerCache::Full { keys, .. }) => keys.shape()[2],
            _ => panic!("not a full layer"),
        }
    }

    #[test]
    fn a_prompt_extending_a_stored_sequence_starts_from_it() {
        let mut pc = PromptCache::new(1 << 20, 10);
        assert!(pc.fetch(&[1, 2, 3]).unwrap().is_none());
        pc.insert(vec![1, 2, 3, 4], full(4), Assistant);
        let hit = pc.fetch(&[1, 2, 3, 4, 5, 6]).unwrap().expect("a hit");
        assert_eq!((hit.cached_tokens, cached_len(&hit)), (4, 4));
        // Unrelated prompts miss.
        assert!(pc.fetch(&[9, 9, 9]).unwrap().is_none());
    }

    #[test]
    fn a_diverging_prompt_gets_a_trimmed_copy_and_the_entry_stays_whole() {
        let mut pc = PromptCache::new(1 << 20, 10);
        pc.insert(vec![1, 2, 3, 4, 5], full(5), Assistant);
        let hit = pc.fetch(&[1, 2, 3, 7]).unwrap().expect("a hit");
        assert_eq!((hit.cached_tokens, cached_len(&hit)), (3, 3));
        // The same prompt as stored: one token is left to compute.
        let hit = pc.fetch(&[1, 2, 3, 4, 5]).unwrap().expect("a hit");
        assert_eq!((hit.cached_tokens, cached_len(&hit)), (4, 4));
        let hit = pc.fetch(&[1, 2, 3, 4, 5, 6]).unwrap().expect("a hit");
        assert_eq!(hit.cached_tokens, 5);
    }

    #[test]
    fn a_recurrent_state_is_never_trimmed_only_extended() {
        let mut pc = PromptCache::new(1 << 20, 10);
        pc.insert(vec![1, 2, 3, 4, 5], recurrent(5), Assistant);
        assert!(pc.fetch(&[1, 2, 3, 7]).unwrap().is_none());
        assert!(pc.fetch(&[1, 2, 3, 4, 5]).unwrap().is_none());
        let hit = pc.fetch(&[1, 2, 3, 4, 5, 6]).unwrap().expect("a hit");
        assert_eq!(hit.cached_tokens, 5);
        // Its prefixes are not dropped when a longer sequence is stored.
        pc.insert(vec![1, 2, 3, 4, 5, 6, 7], recurrent(7), Assistant);
        assert_eq!(pc.len(), 2);
    }

    #[test]
    fn a_trimmable_cache_replaces_its_stored_prefixes() {
        let mut pc = PromptCache::new(1 << 20, 10);
        pc.insert(vec![1, 2, 3], full(3), Assistant);
        pc.insert(vec![1, 2, 3, 4, 5], full(5), Assistant);
        assert_eq!((pc.len(), pc.bytes()), (1, 5 * 16));
    }

    #[test]
    fn the_byte_bound_evicts_least_recently_used_first() {
        // Each token is 16 bytes (keys and values); room for 10 tokens.
        let mut pc = PromptCache::new(160, 10);
        pc.insert(vec![1, 1, 1, 1], full(4), Assistant);
        pc.insert(vec![2, 2, 2, 2], full(4), Assistant);
        assert_eq!(pc.bytes(), 128);
        // A hit makes [1, ...] the most recently used...
        assert!(pc.fetch(&[1, 1, 1, 1, 9]).unwrap().is_some());
        // ...so storing 4 more tokens evicts [2, ...].
        pc.insert(vec![3, 3, 3, 3], full(4), Assistant);
        assert_eq!((pc.len(), pc.bytes()), (2, 128));
        assert!(pc.fetch(&[2, 2, 2, 2, 9]).unwrap().is_none());
        assert!(pc.fetch(&[1, 1, 1, 1, 9]).unwrap().is_some());
        // An entry over the whole budget is not kept, and takes the rest
        // with it (LRU order).
        pc.insert(vec![4; 11], full(11), Assistant);
        assert_eq!((pc.len(), pc.bytes()), (0, 0));
    }

    #[test]
    fn eviction_keeps_system_prompts_and_balances_answers_and_user_turns() {
        let mut pc = PromptCache::new(1 << 20, 3);
        let cached = |pc: &mut PromptCache, prompt: &[i32]| {
            pc.fetch(prompt).unwrap().map_or(0, |h| h.cached_tokens)
        };
        pc.insert(vec![1, 1], recurrent(2), System);
        pc.insert(vec![1, 1, 2], recurrent(3), User);
        pc.insert(vec![1, 1, 2, 3], recurrent(4), Assistant);
        // One answer, two user turns: the older user turn goes.
        pc.insert(vec![1, 1, 4], recurrent(3), User);
        assert_eq!(pc.len(), 3);
        assert_eq!(cached(&mut pc, &[1, 1, 2, 9]), 2);
        assert_eq!(cached(&mut pc, &[1, 1, 2, 3, 9]), 4);
        // Two answers, one user turn: the older answer goes.
        pc.insert(vec![1, 1, 5], recurrent(3), Assistant);
        assert_eq!(cached(&mut pc, &[1, 1, 2, 3, 9]), 2);
        assert_eq!(cached(&mut pc, &[1, 1, 4, 9]), 3);
        // One answer, two user turns again: the user turn [1, 1, 4] goes,
        // though the system prompt was used less recently.
        pc.insert(vec![1, 1, 6], recurrent(3), User);
        assert_eq!(cached(&mut pc, &[1, 1, 4, 9]), 2);
        assert_eq!(cached(&mut pc, &[1, 1, 5, 9]), 3);
        assert_eq!(cached(&mut pc, &[1, 1, 6, 9]), 3);
    }

    #[test]
    fn the_entry_bound_evicts_least_recently_used_first() {
        let mut pc = PromptCache::new(1 << 20, 2);
        pc.insert(vec![1, 1], full(2), Assistant);
        pc.insert(vec![2, 2], full(2), Assistant);
        pc.insert(vec![3, 3], full(2), Assistant);
        assert_eq!(pc.len(), 2);
        assert!(pc.fetch(&[1, 1, 5]).unwrap().is_none());
        assert!(pc.fetch(&[2, 2, 5]).unwrap().is_some());
    }
}
