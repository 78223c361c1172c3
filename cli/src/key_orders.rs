//! The key orders of the index benchmarks: the five datasets of the thesis "Implementation of
//! B-trees on GPU" and the mesh-edge order it named but never measured.
//!
//! Every order yields `(key, value)` insert operations; the value is the operation's position,
//! so a later upsert of the same key is visible. `ascending`, `descending`, `almost-sorted` and
//! `shuffled` insert the same set of distinct random u64 keys (so their rows differ only in
//! order); `gaussian` repeats keys (upserts); `mesh` inserts every interior edge twice.

use clap::ValueEnum;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KeyOrder {
    /// Distinct random u64 keys, sorted ascending.
    Ascending,
    /// The same keys, sorted descending.
    Descending,
    /// Sorted, then 5% of the keys swapped with a neighbour at most 16 places away.
    AlmostSorted,
    /// The same keys in random order.
    Shuffled,
    /// Normally distributed around 2^63 with σ = n/2: a dense middle with repeated keys.
    Gaussian,
    /// Edges of a Delaunay triangulation of random points, keyed (low id | high id << 32),
    /// inserted once per adjacent triangle in triangle order.
    Mesh,
}

impl KeyOrder {
    pub fn name(self) -> &'static str {
        match self {
            KeyOrder::Ascending => "ascending",
            KeyOrder::Descending => "descending",
            KeyOrder::AlmostSorted => "almost-sorted",
            KeyOrder::Shuffled => "shuffled",
            KeyOrder::Gaussian => "gaussian",
            KeyOrder::Mesh => "mesh",
        }
    }

    /// About `n` insert operations in this order (the mesh yields about 2n for n distinct
    /// edges), deterministic for a seed.
    pub fn generate(self, n: usize, seed: u64) -> Vec<(u64, u64)> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let keys = match self {
            KeyOrder::Ascending => {
                let mut k = distinct_random(n, &mut rng);
                k.sort_unstable();
                k
            }
            KeyOrder::Descending => {
                let mut k = distinct_random(n, &mut rng);
                k.sort_unstable_by(|a, b| b.cmp(a));
                k
            }
            KeyOrder::AlmostSorted => {
                let mut k = distinct_random(n, &mut rng);
                k.sort_unstable();
                for _ in 0..n / 20 {
                    let i = rng.random_range(0..n);
                    let j = (i + rng.random_range(1..=16)).min(n - 1);
                    k.swap(i, j);
                }
                k
            }
            KeyOrder::Shuffled => distinct_random(n, &mut rng),
            KeyOrder::Gaussian => {
                let normal = Normal::new(0.0f64, (n as f64 / 2.0).max(1.0)).expect("finite σ");
                (0..n).map(|_| (1u64 << 63).wrapping_add_signed(normal.sample(&mut rng).round() as i64)).collect()
            }
            KeyOrder::Mesh => mesh_edges(n, &mut rng),
        };
        keys.into_iter().enumerate().map(|(i, k)| (k, i as u64)).collect()
    }
}

/// `n` distinct random u64 keys in random order.
fn distinct_random(n: usize, rng: &mut SmallRng) -> Vec<u64> {
    let mut keys: Vec<u64> = (0..n + n / 64 + 16).map(|_| rng.random()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.shuffle(rng);
    keys.truncate(n);
    assert_eq!(keys.len(), n, "2^64 random draws repeat too rarely to fall short");
    keys
}

/// The edges of a Delaunay triangulation of about n/3 random points (≈ n distinct edges),
/// once per adjacent triangle, triangles in the order the triangulator emits them.
fn mesh_edges(n: usize, rng: &mut SmallRng) -> Vec<u64> {
    let points: Vec<delaunator::Point> =
        (0..(n / 3).max(3)).map(|_| delaunator::Point { x: rng.random(), y: rng.random() }).collect();
    let triangulation = delaunator::triangulate(&points);
    let edge = |a: usize, b: usize| {
        let (lo, hi) = (a.min(b) as u64, a.max(b) as u64);
        lo | hi << 32
    };
    triangulation
        .triangles
        .chunks_exact(3)
        .flat_map(|t| [edge(t[0], t[1]), edge(t[1], t[2]), edge(t[2], t[0])])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn sorted_orders_hold_the_same_distinct_keys() {
        let set = |o: KeyOrder| o.generate(5000, 9).into_iter().map(|(k, _)| k).collect::<BTreeSet<_>>();
        let asc = KeyOrder::Ascending.generate(5000, 9);
        assert!(asc.windows(2).all(|w| w[0].0 < w[1].0));
        let desc = KeyOrder::Descending.generate(5000, 9);
        assert!(desc.windows(2).all(|w| w[0].0 > w[1].0));
        for o in [KeyOrder::Descending, KeyOrder::AlmostSorted, KeyOrder::Shuffled] {
            assert_eq!(set(o), set(KeyOrder::Ascending), "{o:?}");
        }
        let almost = KeyOrder::AlmostSorted.generate(5000, 9);
        let inversions = almost.windows(2).filter(|w| w[0].0 > w[1].0).count();
        assert!(inversions > 0 && inversions < 1000, "{inversions} inversions");
    }

    #[test]
    fn gaussian_repeats_keys_around_the_middle() {
        let g = KeyOrder::Gaussian.generate(10_000, 3);
        let distinct: BTreeSet<_> = g.iter().map(|&(k, _)| k).collect();
        assert!(distinct.len() < g.len(), "σ = n/2 over n draws repeats keys");
        assert!(g.iter().all(|&(k, _)| k.abs_diff(1 << 63) < 100 * 10_000));
    }

    #[test]
    fn mesh_edges_are_shared_by_at_most_two_triangles() {
        let m = KeyOrder::Mesh.generate(3000, 5);
        let mut uses = std::collections::BTreeMap::new();
        for &(k, _) in &m {
            let (lo, hi) = (k & 0xFFFF_FFFF, k >> 32);
            assert!(lo < hi && hi < 1000, "edge ({lo}, {hi}) of 1000 points");
            *uses.entry(k).or_insert(0) += 1;
        }
        assert!(uses.values().all(|&u| u == 1 || u == 2));
        // Euler: a triangulation of V points has about 3V edges, most interior (used twice).
        assert!(uses.len() > 2500 && uses.len() < 3000, "{} edges", uses.len());
        assert!(uses.values().filter(|&&u| u == 2).count() > uses.len() * 9 / 10);
    }
}
