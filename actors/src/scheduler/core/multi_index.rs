//! The index of parked tickets of several kinds (rule 25): "which of them ranks best among
//! those whose every cost fits the free units?"
//!
//! # Shape
//!
//! One sparse binary trie per *key kind*, over the 32 bits of a ticket's units of that kind,
//! as [`CostIndex`](super::CostIndex) is. A ticket goes to the trie of its key kind, the
//! kind of which it needs the largest share of the pool's capacity (its dominant kind), so
//! the trie's own dimension is the one most likely to decide whether it fits. Every node
//! stores the best [`RankKey`] of its subtree, and a lower and an upper bound of the units of
//! *each* kind its tickets need (`min`, `max`); a leaf holds the tickets of one key cost, in
//! rank order, with every unit they need.
//!
//! - `insert` walks 32 levels down, lowering each node's best and min.
//! - `remove` walks down, removes the ticket from its leaf, then walks back up recomputing
//!   the bests and bounds from the children, freeing emptied nodes. A leaf's bounds are kept
//!   as they were while the leaf holds other tickets (a bound stays a bound; a leaf that
//!   empties is freed).
//! - `best_within(free)` searches depth first, better child first, and leaves out a subtree
//!   whose best ranks no better than the answer found so far or whose min does not fit
//!   `free`; a subtree whose max fits is answered by its best without going down. In a leaf
//!   it takes the first ticket in rank order that fits.
//!
//! # Bound
//!
//! A subtree is entered only if some ticket in it might fit and rank ahead of the answer,
//! so a search costs a path of 32 steps per trie in use, plus one more path for each ticket
//! ranked ahead of the answer whose key kind fits but another kind does not. With the key
//! kind chosen as the dominant one those are rare, and they cost nothing to the tickets of
//! one kind, which are never in this index.
//!
//! # Invariants
//!
//! - `node.best` is the minimum key of the node's subtree; `node.min[k]` is at most, and
//!   `node.max[k]` at least, the units of kind `k` of every ticket in it.
//! - A non-root node exists only while its subtree holds a ticket.
//! - `units[k]` counts, per units, the tickets that need that many units of kind `k`.

use std::collections::{BTreeMap, BTreeSet};

use super::rank::RankKey;
use super::KINDS;
use crate::domain::ResourceKind;

/// Every unit a ticket of several kinds needs, by kind index.
pub(super) type Demand = [u32; KINDS];

const DEPTH: usize = 32;
const NIL: u32 = u32::MAX;
const ROOT: usize = 0;
const NO_MIN: Demand = [u32::MAX; KINDS];

#[derive(Debug, Clone, Copy)]
struct Node {
    best: Option<RankKey>,
    min: Demand,
    max: Demand,
    /// Children for inner nodes; for a leaf (depth 32), `children[0]` indexes `leaves`.
    children: [u32; 2],
}

impl Node {
    const EMPTY: Node = Node {
        best: None,
        min: NO_MIN,
        max: [0; KINDS],
        children: [NIL, NIL],
    };
}

/// Whether `demand` fits `free` in every kind.
pub(super) fn fits(demand: &Demand, free: &Demand) -> bool {
    demand.iter().zip(free).all(|(need, free)| need <= free)
}

fn lower(min: &mut Demand, demand: &Demand) {
    for (min, &need) in min.iter_mut().zip(demand) {
        *min = (*min).min(need);
    }
}

fn raise(max: &mut Demand, demand: &Demand) {
    for (max, &need) in max.iter_mut().zip(demand) {
        *max = (*max).max(need);
    }
}

fn bit_at(units: u32, depth: usize) -> usize {
    ((units >> (DEPTH - 1 - depth)) & 1) as usize
}

/// One trie: the tickets whose key kind is one kind.
#[derive(Debug, Clone)]
struct KeyedTrie {
    key: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    leaves: Vec<BTreeMap<RankKey, Demand>>,
    free_leaves: Vec<u32>,
}

impl KeyedTrie {
    fn new(key: usize) -> Self {
        Self {
            key,
            nodes: vec![Node::EMPTY],
            free_nodes: Vec::new(),
            leaves: Vec::new(),
            free_leaves: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.nodes[ROOT].best.is_none()
    }

    fn insert(&mut self, demand: &Demand, key: RankKey) {
        let units = demand[self.key];
        let mut node = ROOT;
        for depth in 0..DEPTH {
            self.widen(node, demand, key);
            let bit = bit_at(units, depth);
            node = match self.nodes[node].children[bit] {
                NIL => {
                    let child = self.alloc_node();
                    self.nodes[node].children[bit] = child;
                    child as usize
                }
                child => child as usize,
            };
        }
        self.widen(node, demand, key);
        let leaf = match self.nodes[node].children[0] {
            NIL => {
                let leaf = self.alloc_leaf();
                self.nodes[node].children[0] = leaf;
                leaf
            }
            leaf => leaf,
        };
        self.leaves[leaf as usize].insert(key, *demand);
    }

    fn remove(&mut self, demand: &Demand, key: RankKey) -> bool {
        let units = demand[self.key];
        let mut path = [0usize; DEPTH + 1];
        let mut node = ROOT;
        for (depth, slot) in path.iter_mut().enumerate().take(DEPTH) {
            *slot = node;
            match self.nodes[node].children[bit_at(units, depth)] {
                NIL => return false,
                child => node = child as usize,
            }
        }
        path[DEPTH] = node;
        let leaf = self.nodes[node].children[0] as usize;
        if self.nodes[node].children[0] == NIL || self.leaves[leaf].remove(&key).is_none() {
            return false;
        }
        match self.leaves[leaf].keys().next() {
            Some(&best) => self.nodes[node].best = Some(best),
            None => {
                self.leaves[leaf].clear();
                self.free_leaves.push(leaf as u32);
                self.nodes[node] = Node::EMPTY;
            }
        }
        for depth in (0..DEPTH).rev() {
            let parent = path[depth];
            let child = path[depth + 1];
            if self.nodes[child].best.is_none() {
                self.nodes[parent].children[bit_at(units, depth)] = NIL;
                self.free_nodes.push(child as u32);
            }
            let (mut best, mut min, mut max): (Option<RankKey>, Demand, Demand) =
                (None, NO_MIN, [0; KINDS]);
            for side in self.nodes[parent].children {
                if side != NIL {
                    let side = &self.nodes[side as usize];
                    best = match (best, side.best) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    lower(&mut min, &side.min);
                    raise(&mut max, &side.max);
                }
            }
            let parent = &mut self.nodes[parent];
            (parent.best, parent.min, parent.max) = (best, min, max);
        }
        true
    }

    /// Lowers `found` to the best ticket of the trie that fits `free` and ranks ahead of it.
    fn search(&self, node: usize, depth: usize, free: &Demand, found: &mut Option<RankKey>) {
        let current = &self.nodes[node];
        let Some(best) = current.best else {
            return;
        };
        if found.is_some_and(|found| found <= best) || !fits(&current.min, free) {
            return;
        }
        if fits(&current.max, free) {
            // Every ticket below fits: the best of them is the answer here.
            *found = Some(best);
            return;
        }
        if depth == DEPTH {
            let leaf = &self.leaves[current.children[0] as usize];
            for (&key, demand) in leaf {
                if found.is_some_and(|found| found <= key) {
                    return;
                }
                if fits(demand, free) {
                    *found = Some(key);
                    return;
                }
            }
            return;
        }
        let [left, right] = current.children;
        let ranked = |child: u32| {
            (child != NIL)
                .then(|| self.nodes[child as usize].best)
                .flatten()
        };
        let order = match (ranked(left), ranked(right)) {
            (Some(a), Some(b)) if b < a => [right, left],
            _ => [left, right],
        };
        for child in order {
            if child != NIL {
                self.search(child as usize, depth + 1, free, found);
            }
        }
    }

    fn widen(&mut self, node: usize, demand: &Demand, key: RankKey) {
        let node = &mut self.nodes[node];
        if node.best.is_none_or(|current| key < current) {
            node.best = Some(key);
        }
        lower(&mut node.min, demand);
        raise(&mut node.max, demand);
    }

    fn alloc_node(&mut self) -> u32 {
        match self.free_nodes.pop() {
            Some(node) => {
                self.nodes[node as usize] = Node::EMPTY;
                node
            }
            None => {
                self.nodes.push(Node::EMPTY);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn alloc_leaf(&mut self) -> u32 {
        match self.free_leaves.pop() {
            Some(leaf) => leaf,
            None => {
                self.leaves.push(BTreeMap::new());
                (self.leaves.len() - 1) as u32
            }
        }
    }
}

/// Parked tickets of several kinds, indexed by every unit they need and by rank.
#[derive(Debug, Clone)]
pub struct MultiIndex {
    tries: [KeyedTrie; KINDS],
    /// Per kind, how many tickets need each number of units of it (budget wakeups, rule 15).
    units: [BTreeMap<u32, u32>; KINDS],
    /// Every ticket held, in rank order: the worst is the last (rule 21 sheds it first).
    by_rank: BTreeSet<RankKey>,
}

impl Default for MultiIndex {
    fn default() -> Self {
        Self {
            tries: std::array::from_fn(KeyedTrie::new),
            units: Default::default(),
            by_rank: BTreeSet::new(),
        }
    }
}

impl MultiIndex {
    /// Number of tickets held.
    pub fn len(&self) -> usize {
        self.by_rank.len()
    }

    /// Whether no ticket is held.
    pub fn is_empty(&self) -> bool {
        self.by_rank.is_empty()
    }

    /// Adds `key`, which needs `demand` and is keyed by kind `by`.
    pub(super) fn insert(&mut self, by: ResourceKind, demand: &Demand, key: RankKey) {
        self.tries[by.index()].insert(demand, key);
        for (count, &units) in self.units.iter_mut().zip(demand) {
            if units > 0 {
                *count.entry(units).or_default() += 1;
            }
        }
        self.by_rank.insert(key);
    }

    /// Removes `key`, inserted with `by` and `demand`. Returns whether it was there.
    pub(super) fn remove(&mut self, by: ResourceKind, demand: &Demand, key: RankKey) -> bool {
        if !self.tries[by.index()].remove(demand, key) {
            return false;
        }
        for (count, &units) in self.units.iter_mut().zip(demand) {
            if units > 0 {
                if let Some(tickets) = count.get_mut(&units) {
                    *tickets -= 1;
                    if *tickets == 0 {
                        count.remove(&units);
                    }
                }
            }
        }
        self.by_rank.remove(&key);
        true
    }

    /// The best-ranked ticket whose every cost fits `free`, or `ahead_of` if none ranks
    /// ahead of it (a bound that spares the search every subtree ranked behind it).
    pub(super) fn best_within(&self, free: &Demand, ahead_of: Option<RankKey>) -> Option<RankKey> {
        let mut found = ahead_of;
        for trie in self.tries.iter().filter(|trie| !trie.is_empty()) {
            trie.search(ROOT, 0, free, &mut found);
        }
        found
    }

    /// The best-ranked ticket.
    pub fn best(&self) -> Option<RankKey> {
        self.by_rank.first().copied()
    }

    /// The lowest-ranked ticket.
    pub fn worst(&self) -> Option<RankKey> {
        self.by_rank.last().copied()
    }

    /// The smallest number of units of `kind` above `level` that a ticket needs.
    pub(super) fn smallest_above(&self, kind: ResourceKind, level: u32) -> Option<u32> {
        let from = level.checked_add(1)?;
        self.units[kind.index()]
            .range(from..)
            .next()
            .map(|(&units, _)| units)
    }

    /// Every ticket held with what it needs, in no particular order (the invariants' check).
    pub(super) fn tickets(&self) -> impl Iterator<Item = (RankKey, &Demand)> + '_ {
        self.tries
            .iter()
            .flat_map(|trie| trie.leaves.iter())
            .flat_map(|leaf| leaf.iter().map(|(&key, demand)| (key, demand)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::Priority;

    fn key(id: u64) -> RankKey {
        RankKey::new(Priority::Normal, id, id)
    }

    proptest! {
        /// The index answers as a scan of every ticket in rank order would, through inserts
        /// and removals in any order.
        #[test]
        fn best_within_is_the_first_in_rank_order_that_fits(
            tickets in prop::collection::vec((0usize..KINDS, prop::array::uniform4(0u32..12)), 1..60),
            frees in prop::collection::vec(prop::array::uniform4(0u32..14), 1..12),
            removed in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
        ) {
            let mut index = MultiIndex::default();
            let mut held: Vec<(u64, usize, Demand)> = Vec::new();
            for (id, (by, demand)) in tickets.into_iter().enumerate() {
                let id = id as u64;
                index.insert(ResourceKind::ALL[by], &demand, key(id));
                held.push((id, by, demand));
            }
            for pick in removed {
                if held.is_empty() {
                    break;
                }
                let (id, by, demand) = held.remove(pick.index(held.len()));
                prop_assert!(index.remove(ResourceKind::ALL[by], &demand, key(id)));
                prop_assert!(!index.remove(ResourceKind::ALL[by], &demand, key(id)));
            }
            prop_assert_eq!(index.len(), held.len());
            for free in frees {
                let scan = held.iter().filter(|(_, _, demand)| fits(demand, &free)).map(|(id, ..)| key(*id)).min();
                prop_assert_eq!(index.best_within(&free, None), scan);
                let bound = key(7);
                prop_assert_eq!(index.best_within(&free, Some(bound)), scan.into_iter().chain([bound]).min());
            }
            prop_assert_eq!(index.best(), held.iter().map(|(id, ..)| key(*id)).min());
            prop_assert_eq!(index.worst(), held.iter().map(|(id, ..)| key(*id)).max());
        }
    }
}
