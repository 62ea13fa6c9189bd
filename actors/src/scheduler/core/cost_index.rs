//! The index that answers "which parked task of this kind ranks best among those costing at
//! most `free` units?" in O(log U) for U = 2^32 possible costs.
//!
//! # Shape
//!
//! A sparse binary trie over the 32 bits of a task's cost (a segment tree whose nodes exist
//! only where some parked task's cost lies). Every node stores the best and the worst
//! [`RankKey`] in its subtree. The leaf for one cost value holds the ordered set of all
//! parked tasks with that cost.
//!
//! - `insert` walks 32 levels down, creating missing nodes, lowering each node's best and
//!   raising its worst.
//! - `remove` walks down, removes the key from its leaf, then walks back up recomputing the
//!   bests and worsts that named the removed key, freeing nodes whose subtree emptied (so
//!   memory follows the distinct costs parked now, not every cost ever seen).
//! - `best_within(free)` walks the path of `free`: wherever the path turns right, the whole
//!   left subtree costs less than `free`, so its best is a candidate; the leaf of `free`
//!   itself is the last candidate. 32 steps, no scan of tasks or costs.
//! - `worst()` is the root's worst: the lowest-ranked task of any cost, which a full
//!   parking lot sheds first (rule 21). The worsts cost a node's size, not a task's.
//!
//! # Invariants
//!
//! - `node.best` is the minimum key of the node's subtree and `node.worst` its maximum,
//!   `None` only for the root of an empty index.
//! - A non-root node exists only while its subtree holds a key.
//! - `len` is the number of keys held.

use std::collections::BTreeSet;

use super::rank::RankKey;

const DEPTH: usize = 32;
const NIL: u32 = u32::MAX;
const ROOT: usize = 0;

#[derive(Debug, Clone, Copy)]
struct Node {
    best: Option<RankKey>,
    worst: Option<RankKey>,
    /// Children for inner nodes; for a leaf (depth 32), `children[0]` indexes `leaves`.
    children: [u32; 2],
}

impl Node {
    const EMPTY: Node = Node {
        best: None,
        worst: None,
        children: [NIL, NIL],
    };
}

/// Parked tasks of one resource kind, indexed by cost and rank.
#[derive(Debug, Clone)]
pub struct CostIndex {
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    leaves: Vec<BTreeSet<RankKey>>,
    free_leaves: Vec<u32>,
    len: usize,
}

impl Default for CostIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl CostIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            nodes: vec![Node::EMPTY],
            free_nodes: Vec::new(),
            leaves: Vec::new(),
            free_leaves: Vec::new(),
            len: 0,
        }
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The best key of any cost.
    pub fn best(&self) -> Option<RankKey> {
        self.nodes[ROOT].best
    }

    /// The worst (lowest-ranked) key of any cost.
    pub fn worst(&self) -> Option<RankKey> {
        self.nodes[ROOT].worst
    }

    /// Adds `key` at `cost`. Keys are unique (they carry the task id).
    pub fn insert(&mut self, cost: u32, key: RankKey) {
        let mut node = ROOT;
        for depth in 0..DEPTH {
            self.widen(node, key);
            let bit = bit_at(cost, depth);
            node = match self.nodes[node].children[bit] {
                NIL => {
                    let child = self.alloc_node();
                    self.nodes[node].children[bit] = child as u32;
                    child
                }
                child => child as usize,
            };
        }
        self.widen(node, key);
        let leaf = match self.nodes[node].children[0] {
            NIL => {
                let leaf = self.alloc_leaf();
                self.nodes[node].children[0] = leaf;
                leaf
            }
            leaf => leaf,
        };
        self.leaves[leaf as usize].insert(key);
        self.len += 1;
    }

    /// Removes `key` from `cost`. Returns whether it was there.
    pub fn remove(&mut self, cost: u32, key: RankKey) -> bool {
        let mut path = [0usize; DEPTH + 1];
        let mut node = ROOT;
        for (depth, slot) in path.iter_mut().enumerate().take(DEPTH) {
            *slot = node;
            match self.nodes[node].children[bit_at(cost, depth)] {
                NIL => return false,
                child => node = child as usize,
            }
        }
        path[DEPTH] = node;
        let leaf = self.nodes[node].children[0];
        if leaf == NIL || !self.leaves[leaf as usize].remove(&key) {
            return false;
        }
        self.len -= 1;
        self.repair_after_remove(&path, cost, key);
        true
    }

    /// The best key among those whose cost is at most `max_cost`.
    pub fn best_within(&self, max_cost: u32) -> Option<RankKey> {
        if max_cost == u32::MAX {
            return self.best();
        }
        let mut best: Option<RankKey> = None;
        let mut node = ROOT;
        for depth in 0..DEPTH {
            let children = self.nodes[node].children;
            if bit_at(max_cost, depth) == 1 && children[0] != NIL {
                best = min_key(best, self.nodes[children[0] as usize].best);
            }
            match children[bit_at(max_cost, depth)] {
                NIL => return best,
                child => node = child as usize,
            }
        }
        min_key(best, self.nodes[node].best)
    }

    /// The largest cost held that is at most `max_cost`, with the best key of that cost: a
    /// walk down `max_cost`'s path, then, if it leaves the trie, down the rightmost path of
    /// the last subtree of smaller costs it passed. At most 64 steps.
    pub fn largest_within(&self, max_cost: u32) -> Option<(u32, RankKey)> {
        let mut node = ROOT;
        let mut prefix = 0u32;
        // The last subtree of costs below `max_cost`'s path: its node, depth and prefix.
        let mut below: Option<(usize, usize, u32)> = None;
        let mut on_path = true;
        for depth in 0..DEPTH {
            let children = self.nodes[node].children;
            let bit = bit_at(max_cost, depth);
            if bit == 1 && children[0] != NIL {
                below = Some((children[0] as usize, depth + 1, prefix << 1));
            }
            match children[bit] {
                NIL => {
                    on_path = false;
                    break;
                }
                child => {
                    node = child as usize;
                    prefix = (prefix << 1) | bit as u32;
                }
            }
        }
        if on_path {
            return self.leaves_best(node).map(|key| (max_cost, key));
        }
        let (mut node, depth, mut prefix) = below?;
        for _ in depth..DEPTH {
            let [left, right] = self.nodes[node].children;
            let (bit, child) = if right != NIL { (1, right) } else { (0, left) };
            node = child as usize;
            prefix = (prefix << 1) | bit;
        }
        self.leaves_best(node).map(|key| (prefix, key))
    }

    /// The smallest cost held that is above `min_cost`: a walk down the path of
    /// `min_cost + 1`, then, if it leaves the trie, down the leftmost path of the last
    /// subtree of larger costs it passed. At most 64 steps.
    pub fn smallest_above(&self, min_cost: u32) -> Option<u32> {
        let from = min_cost.checked_add(1)?;
        let mut node = ROOT;
        let mut prefix = 0u32;
        // The last subtree of costs above `from`'s path: its node, depth and prefix.
        let mut above: Option<(usize, usize, u32)> = None;
        for depth in 0..DEPTH {
            let children = self.nodes[node].children;
            let bit = bit_at(from, depth);
            if bit == 0 && children[1] != NIL {
                above = Some((children[1] as usize, depth + 1, (prefix << 1) | 1));
            }
            match children[bit] {
                NIL => {
                    let (mut node, depth, mut prefix) = above?;
                    for _ in depth..DEPTH {
                        let [left, right] = self.nodes[node].children;
                        let (bit, child) = if left != NIL { (0, left) } else { (1, right) };
                        node = child as usize;
                        prefix = (prefix << 1) | bit;
                    }
                    return Some(prefix);
                }
                child => {
                    node = child as usize;
                    prefix = (prefix << 1) | bit as u32;
                }
            }
        }
        Some(from)
    }

    /// Lowers `node`'s best and raises its worst to take in `key`.
    fn widen(&mut self, node: usize, key: RankKey) {
        let node = &mut self.nodes[node];
        if node.best.is_none_or(|current| key < current) {
            node.best = Some(key);
        }
        if node.worst.is_none_or(|current| key > current) {
            node.worst = Some(key);
        }
    }

    /// Walks from the leaf back to the root, recomputing bests and worsts that were `key`
    /// and freeing emptied nodes. Stops early once a node's best and worst were not the
    /// removed key and no child was freed below it: nothing above can change then.
    fn repair_after_remove(&mut self, path: &[usize; DEPTH + 1], cost: u32, key: RankKey) {
        let leaf_node = path[DEPTH];
        let leaf = self.nodes[leaf_node].children[0] as usize;
        let mut emptied = self.leaves[leaf].is_empty();
        if emptied {
            self.free_leaves.push(leaf as u32);
            self.nodes[leaf_node].children[0] = NIL;
        }
        self.nodes[leaf_node].best = self.leaves_best(leaf_node);
        self.nodes[leaf_node].worst = self.leaves_worst(leaf_node);
        for depth in (0..DEPTH).rev() {
            let node = path[depth];
            let child = path[depth + 1];
            if emptied {
                self.free_node(child);
                self.nodes[node].children[bit_at(cost, depth)] = NIL;
            } else if self.nodes[node].best != Some(key) && self.nodes[node].worst != Some(key) {
                return;
            }
            let [left, right] = self.nodes[node].children;
            let (left, right) = (self.node_at(left), self.node_at(right));
            let best = min_key(left.and_then(|n| n.best), right.and_then(|n| n.best));
            let worst = max_key(left.and_then(|n| n.worst), right.and_then(|n| n.worst));
            self.nodes[node].best = best;
            self.nodes[node].worst = worst;
            emptied = best.is_none();
        }
    }

    fn leaves_best(&self, leaf_node: usize) -> Option<RankKey> {
        match self.nodes[leaf_node].children[0] {
            NIL => None,
            leaf => self.leaves[leaf as usize].first().copied(),
        }
    }

    fn leaves_worst(&self, leaf_node: usize) -> Option<RankKey> {
        match self.nodes[leaf_node].children[0] {
            NIL => None,
            leaf => self.leaves[leaf as usize].last().copied(),
        }
    }

    fn node_at(&self, node: u32) -> Option<Node> {
        match node {
            NIL => None,
            node => Some(self.nodes[node as usize]),
        }
    }

    fn alloc_node(&mut self) -> usize {
        match self.free_nodes.pop() {
            Some(node) => node as usize,
            None => {
                self.nodes.push(Node::EMPTY);
                self.nodes.len() - 1
            }
        }
    }

    fn free_node(&mut self, node: usize) {
        self.nodes[node] = Node::EMPTY;
        self.free_nodes.push(node as u32);
    }

    fn alloc_leaf(&mut self) -> u32 {
        match self.free_leaves.pop() {
            Some(leaf) => leaf,
            None => {
                self.leaves.push(BTreeSet::new());
                (self.leaves.len() - 1) as u32
            }
        }
    }
}

fn bit_at(cost: u32, depth: usize) -> usize {
    ((cost >> (DEPTH - 1 - depth)) & 1) as usize
}

fn min_key(a: Option<RankKey>, b: Option<RankKey>) -> Option<RankKey> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn max_key(a: Option<RankKey>, b: Option<RankKey>) -> Option<RankKey> {
    a.max(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Priority;

    fn key(priority: Priority, created: u64, id: u64) -> RankKey {
        RankKey::new(priority, created, id)
    }

    #[test]
    fn best_within_respects_the_cost_bound_and_the_rank() {
        let mut index = CostIndex::new();
        index.insert(10, key(Priority::Critical, 1, 1));
        index.insert(3, key(Priority::Low, 2, 2));
        index.insert(5, key(Priority::Normal, 3, 3));
        assert_eq!(index.best_within(2), None);
        assert_eq!(index.best_within(3).map(|k| k.id()), Some(2));
        assert_eq!(index.best_within(9).map(|k| k.id()), Some(3));
        assert_eq!(index.best_within(10).map(|k| k.id()), Some(1));
        assert_eq!(index.best_within(u32::MAX).map(|k| k.id()), Some(1));
    }

    #[test]
    fn remove_repairs_bests_and_frees_nodes() {
        let mut index = CostIndex::new();
        let a = key(Priority::High, 1, 1);
        let b = key(Priority::Normal, 1, 2);
        index.insert(7, a);
        index.insert(7, b);
        index.insert(u32::MAX, key(Priority::Low, 1, 3));
        let nodes_with_two_costs = index.nodes.len() - index.free_nodes.len();
        assert!(index.remove(7, a));
        assert!(!index.remove(7, a), "a key is removed once");
        assert_eq!(index.best_within(7).map(|k| k.id()), Some(2));
        assert!(index.remove(7, b));
        assert_eq!(index.best_within(7), None);
        assert!(index.nodes.len() - index.free_nodes.len() < nodes_with_two_costs);
        assert_eq!(index.len(), 1);
        assert!(index.remove(u32::MAX, key(Priority::Low, 1, 3)));
        assert!(index.is_empty());
        assert_eq!(index.best(), None);
        assert_eq!(
            index.nodes.len() - index.free_nodes.len(),
            1,
            "only the root is left"
        );
    }

    #[test]
    fn matches_a_linear_scan_on_many_keys() {
        let mut index = CostIndex::new();
        let mut all = Vec::new();
        let mut seed = 0x9e37_79b9_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for id in 0..2_000 {
            let cost = (next() % 64) as u32;
            let k = key(Priority::ALL[(next() % 4) as usize], next() % 100, id);
            index.insert(cost, k);
            all.push((cost, k));
        }
        for step in 0..2_000 {
            if step % 3 == 0 {
                let (cost, k) = all.swap_remove((next() as usize) % all.len());
                assert!(index.remove(cost, k));
            }
            let bound = (next() % 70) as u32;
            let expected = all
                .iter()
                .filter(|(c, _)| *c <= bound)
                .map(|(_, k)| *k)
                .min();
            assert_eq!(index.best_within(bound), expected);
            assert_eq!(index.worst(), all.iter().map(|&(_, k)| k).max());
            let largest = all
                .iter()
                .filter(|(c, _)| *c <= bound)
                .min_by_key(|&&(c, k)| (std::cmp::Reverse(c), k))
                .copied();
            assert_eq!(index.largest_within(bound), largest, "bound {bound}");
            let above = all.iter().map(|&(c, _)| c).filter(|&c| c > bound).min();
            assert_eq!(index.smallest_above(bound), above, "above {bound}");
        }
    }

    #[test]
    fn smallest_above_finds_the_next_cost_up() {
        let mut index = CostIndex::new();
        assert_eq!(index.smallest_above(0), None);
        index.insert(3, key(Priority::Low, 1, 1));
        index.insert(1 << 20, key(Priority::High, 2, 2));
        index.insert(u32::MAX, key(Priority::Low, 3, 3));
        assert_eq!(index.smallest_above(0), Some(3));
        assert_eq!(index.smallest_above(2), Some(3));
        assert_eq!(index.smallest_above(3), Some(1 << 20));
        assert_eq!(index.smallest_above((1 << 20) - 1), Some(1 << 20));
        assert_eq!(index.smallest_above(1 << 20), Some(u32::MAX));
        assert_eq!(index.smallest_above(u32::MAX - 1), Some(u32::MAX));
        assert_eq!(index.smallest_above(u32::MAX), None);
    }

    #[test]
    fn largest_within_finds_the_largest_cost_at_most_the_bound() {
        let mut index = CostIndex::new();
        assert_eq!(index.largest_within(u32::MAX), None);
        index.insert(10, key(Priority::Low, 1, 1));
        index.insert(10, key(Priority::High, 2, 2));
        index.insert(3, key(Priority::Critical, 3, 3));
        index.insert(u32::MAX, key(Priority::Low, 4, 4));
        assert_eq!(index.largest_within(2), None);
        assert_eq!(
            index.largest_within(9).map(|(c, k)| (c, k.id())),
            Some((3, 3))
        );
        // Of the tasks at the largest cost, the best-ranked.
        assert_eq!(
            index.largest_within(10).map(|(c, k)| (c, k.id())),
            Some((10, 2))
        );
        assert_eq!(
            index.largest_within(1 << 20).map(|(c, k)| (c, k.id())),
            Some((10, 2))
        );
        assert_eq!(
            index.largest_within(u32::MAX).map(|(c, k)| (c, k.id())),
            Some((u32::MAX, 4))
        );
    }
}
