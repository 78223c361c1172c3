//! The update distributions of the snapshot benchmark: which heap page each update writes.
//!
//! Seven distributions over the page indices `0..pages`, from the scattered to the local and
//! the skewed. The skewed ones follow Gray et al., "Quickly generating billion-record
//! synthetic databases" (SIGMOD 1994): the hottest pages are the lowest page numbers, so a hot
//! set is contiguous (heap pages are 4 KiB, one OS page each, so contiguity does not change how
//! many pages a copy-on-write snapshot copies).
//!
//! Every choice is a named constant below. A [`PageStream`] is deterministic for a seed and
//! costs O(1) per draw with no allocation (it runs inside the timed update loop): ranges are
//! precomputed [`Uniform`]s; Zipf and self-similar are Gray's closed forms, one `powf` a draw
//! (Zipf's normalising sum ζ(pages, θ) is precomputed: its first 1024 terms summed, the rest by
//! Euler-Maclaurin, so construction is O(1) too). Gray's Zipf is exact for the two hottest pages
//! and a close continuous approximation beyond; `rand_distr::Zipf` (rejection-inversion, exact)
//! measured about 3 times slower a draw (~68 ns against ~20 ns on the development machine).

use clap::ValueEnum;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Uniform};

/// Heavy hitter: the hot set is `pages / HOT_SET_DIVISOR` pages (at least one): 1%.
pub const HOT_SET_DIVISOR: u64 = 100;
/// Heavy hitter: the share of updates that go to the hot set: 90%.
pub const HOT_SHARE: f64 = 0.9;
/// Repeated runs: a run is 1..=MAX_RUN consecutive pages, uniformly (mean 32.5 pages).
pub const MAX_RUN: u64 = 64;
/// Zipf: the skew θ (Gray's and YCSB's 0.99): P(page i) ∝ 1 / (i + 1)^θ.
pub const ZIPF_THETA: f64 = 0.99;
/// Self-similar: the skew h; the lowest h·pages pages take 1 − h of the updates, recursively
/// (80-20 for h = 0.2: the first 20% get 80%, the first 4% get 64%, ...).
pub const SELF_SIMILAR_H: f64 = 0.2;
/// Moving cluster: the window is `pages / CLUSTER_WINDOW_DIVISOR` pages (at least one).
pub const CLUSTER_WINDOW_DIVISOR: u64 = 64;
/// Moving cluster: the window moves forward one page every CLUSTER_STEP updates, so it moves
/// its own width after each of its pages was updated CLUSTER_STEP times on average.
pub const CLUSTER_STEP: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PageDist {
    /// Every page equally likely, independently.
    Uniform,
    /// Pages 0, 1, 2, ... in order, wrapping around to 0 after the last.
    Sorted,
    /// 90% of updates uniform over the hot set (the first 1% of the pages), 10% uniform over
    /// the other pages.
    HeavyHitter,
    /// Runs of consecutive pages (wrapping around): a uniformly random start page, then a run
    /// of 1..=64 pages (length uniform), then the next run.
    RepeatedRuns,
    /// Gray's Zipf with θ = 0.99: page i is drawn with probability ≈ 1/(i+1)^0.99 / ζ(pages,
    /// 0.99), exactly so for pages 0 and 1 (over 10^5 pages the first 1% take about 60% of
    /// the updates, page 0 alone 8%).
    Zipf,
    /// Gray's self-similar with h = 0.2: page ⌊pages · u^(log 0.2 / log 0.8)⌋ for u uniform in
    /// [0, 1): the first 20% of the pages take 80% of the updates, recursively.
    SelfSimilar,
    /// Uniform within a window of pages/64 pages (wrapping around) that starts at page 0 and
    /// moves forward one page every 16 updates.
    MovingCluster,
}

impl PageDist {
    pub const ALL: [PageDist; 7] = [
        PageDist::Uniform,
        PageDist::Sorted,
        PageDist::HeavyHitter,
        PageDist::RepeatedRuns,
        PageDist::Zipf,
        PageDist::SelfSimilar,
        PageDist::MovingCluster,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PageDist::Uniform => "uniform",
            PageDist::Sorted => "sorted",
            PageDist::HeavyHitter => "heavy-hitter",
            PageDist::RepeatedRuns => "repeated-runs",
            PageDist::Zipf => "zipf",
            PageDist::SelfSimilar => "self-similar",
            PageDist::MovingCluster => "moving-cluster",
        }
    }
}

/// An endless stream of page indices in `0..pages` drawn from one [`PageDist`].
pub struct PageStream {
    rng: SmallRng,
    state: State,
}

/// The precomputed parameters and the position of each distribution.
enum State {
    Uniform(Uniform<u64>),
    Sorted { next: u64, pages: u64 },
    HeavyHitter { hot: Uniform<u64>, cold: Option<Uniform<u64>> },
    RepeatedRuns { start: Uniform<u64>, len: Uniform<u64>, next: u64, left: u64, pages: u64 },
    Zipf(GrayZipf),
    SelfSimilar { exponent: f64, pages: f64, last: u64 },
    MovingCluster { offset: Uniform<u64>, start: u64, since_step: u64, pages: u64 },
}

fn range(lo: u64, hi: u64) -> Uniform<u64> {
    Uniform::new(lo, hi).expect("a non-empty page range")
}

impl PageStream {
    /// A stream over `pages` pages (at least one), deterministic for `seed`.
    pub fn new(dist: PageDist, pages: u64, seed: u64) -> PageStream {
        assert!(pages > 0, "a page stream needs at least one page");
        let state = match dist {
            PageDist::Uniform => State::Uniform(range(0, pages)),
            PageDist::Sorted => State::Sorted { next: 0, pages },
            PageDist::HeavyHitter => {
                let hot = (pages / HOT_SET_DIVISOR).max(1);
                State::HeavyHitter { hot: range(0, hot), cold: (hot < pages).then(|| range(hot, pages)) }
            }
            PageDist::RepeatedRuns => {
                State::RepeatedRuns { start: range(0, pages), len: range(1, MAX_RUN + 1), next: 0, left: 0, pages }
            }
            PageDist::Zipf => State::Zipf(GrayZipf::new(pages, ZIPF_THETA)),
            PageDist::SelfSimilar => State::SelfSimilar {
                exponent: SELF_SIMILAR_H.ln() / (1.0 - SELF_SIMILAR_H).ln(),
                pages: pages as f64,
                last: pages - 1,
            },
            PageDist::MovingCluster => State::MovingCluster {
                offset: range(0, (pages / CLUSTER_WINDOW_DIVISOR).max(1)),
                start: 0,
                since_step: 0,
                pages,
            },
        };
        PageStream { rng: SmallRng::seed_from_u64(seed), state }
    }

    /// The next page index, in `0..pages`.
    #[inline]
    pub fn next_page(&mut self) -> u64 {
        let rng = &mut self.rng;
        match &mut self.state {
            State::Uniform(all) => all.sample(rng),
            State::Sorted { next, pages } => {
                let page = *next;
                *next = if page + 1 == *pages { 0 } else { page + 1 };
                page
            }
            State::HeavyHitter { hot, cold } => match cold {
                Some(cold) if !rng.random_bool(HOT_SHARE) => cold.sample(rng),
                _ => hot.sample(rng),
            },
            State::RepeatedRuns { start, len, next, left, pages } => {
                if *left == 0 {
                    *next = start.sample(rng);
                    *left = len.sample(rng);
                }
                let page = *next;
                *left -= 1;
                *next = if page + 1 == *pages { 0 } else { page + 1 };
                page
            }
            State::Zipf(zipf) => zipf.sample(rng.random()),
            State::SelfSimilar { exponent, pages, last } => {
                let u: f64 = rng.random();
                ((*pages * u.powf(*exponent)) as u64).min(*last)
            }
            State::MovingCluster { offset, start, since_step, pages } => {
                let (off, room) = (offset.sample(rng), *pages - *start);
                let page = if off < room { *start + off } else { off - room };
                *since_step += 1;
                if *since_step == CLUSTER_STEP {
                    *since_step = 0;
                    *start = if room == 1 { 0 } else { *start + 1 };
                }
                page
            }
        }
    }
}

/// Gray et al.'s Zipf generator, 0-based: pages 0 and 1 with their exact probabilities, the
/// rest by inverting a continuous approximation of the distribution function. θ in (0, 1).
struct GrayZipf {
    pages: f64,
    last: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl GrayZipf {
    fn new(pages: u64, theta: f64) -> GrayZipf {
        let n = pages as f64;
        let zetan = zeta(pages, theta);
        let eta = (1.0 - (2.0 / n).powf(1.0 - theta)) / (1.0 - zeta(2, theta) / zetan);
        GrayZipf { pages: n, last: pages - 1, theta, alpha: 1.0 / (1.0 - theta), zetan, eta }
    }

    /// The page for `u` uniform in [0, 1). (For 1 or 2 pages the first two cases always
    /// answer, so `eta`, ±∞ or NaN there, is never used.)
    #[inline]
    fn sample(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(self.theta) {
            1.min(self.last)
        } else {
            ((self.pages * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64).min(self.last)
        }
    }
}

/// ζ(n, θ) = Σ_{i=1..n} 1/i^θ: the first 1024 terms summed, the rest by Euler-Maclaurin
/// (integral, end-point and first-derivative terms; tested to a relative error below 1e-10).
/// θ in (0, 1).
fn zeta(n: u64, theta: f64) -> f64 {
    const EXACT: u64 = 1024;
    let head: f64 = (1..=n.min(EXACT)).map(|i| (i as f64).powf(-theta)).sum();
    if n <= EXACT {
        return head;
    }
    let (m, n) = (EXACT as f64, n as f64);
    let f = |x: f64| x.powf(-theta);
    let df = |x: f64| -theta * x.powf(-theta - 1.0);
    let integral = (n.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta);
    head + integral + (f(n) - f(m)) / 2.0 + (df(n) - df(m)) / 12.0
}

impl Iterator for PageStream {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        Some(self.next_page())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn draws(dist: PageDist, pages: u64, n: usize, seed: u64) -> Vec<u64> {
        PageStream::new(dist, pages, seed).take(n).collect()
    }

    /// The share of `d` that falls below `bound`.
    fn share_below(d: &[u64], bound: u64) -> f64 {
        d.iter().filter(|&&p| p < bound).count() as f64 / d.len() as f64
    }

    #[test]
    fn names_match_the_command_line() {
        for dist in PageDist::ALL {
            assert_eq!(PageDist::from_str(dist.name(), false), Ok(dist));
        }
        let distinct: HashSet<_> = PageDist::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(distinct.len(), 7);
    }

    #[test]
    fn every_draw_is_in_range() {
        for dist in PageDist::ALL {
            for pages in [1, 2, 3, 63, 64, 65, 100, 1000, 12_345, 1 << 20, 1 << 40, u64::MAX] {
                for (i, p) in PageStream::new(dist, pages, 7).take(20_000).enumerate() {
                    assert!(p < pages, "{} over {pages} pages: draw {i} is {p}", dist.name());
                }
            }
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        for dist in PageDist::ALL {
            assert_eq!(draws(dist, 10_000, 5000, 42), draws(dist, 10_000, 5000, 42), "{}", dist.name());
        }
        for dist in [PageDist::Uniform, PageDist::HeavyHitter, PageDist::RepeatedRuns, PageDist::Zipf] {
            assert_ne!(draws(dist, 10_000, 5000, 1), draws(dist, 10_000, 5000, 2), "{}", dist.name());
        }
    }

    #[test]
    fn uniform_spreads_evenly() {
        let d = draws(PageDist::Uniform, 100, 100_000, 3);
        let mut counts = [0u32; 100];
        d.iter().for_each(|&p| counts[p as usize] += 1);
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }

    #[test]
    fn sorted_is_sequential_and_wraps() {
        let d = draws(PageDist::Sorted, 1000, 2500, 5);
        assert_eq!(d[0], 0);
        assert!(d.windows(2).all(|w| w[1] == (w[0] + 1) % 1000));
        assert!(draws(PageDist::Sorted, 1, 10, 5).iter().all(|&p| p == 0));
    }

    #[test]
    fn heavy_hitter_sends_90_percent_to_the_hot_percent() {
        let pages = 100_000;
        let d = draws(PageDist::HeavyHitter, pages, 200_000, 11);
        let hot = share_below(&d, pages / HOT_SET_DIVISOR);
        assert!((hot - HOT_SHARE).abs() < 0.005, "hot share {hot}");
        // The cold 10% is spread over the other 99%.
        let cold: HashSet<_> = d.iter().filter(|&&p| p >= pages / 100).collect();
        assert!(cold.len() > 15_000, "{} cold pages touched", cold.len());
    }

    #[test]
    fn repeated_runs_are_consecutive_pages() {
        let pages = 1 << 30;
        let d = draws(PageDist::RepeatedRuns, pages, 100_000, 13);
        let (mut runs, mut starts) = (vec![1u64], vec![d[0]]);
        for w in d.windows(2) {
            if w[1] == (w[0] + 1) % pages {
                *runs.last_mut().unwrap() += 1;
            } else {
                runs.push(1);
                starts.push(w[1]);
            }
        }
        runs.pop(); // the last run may be cut short
        let mean = runs.iter().sum::<u64>() as f64 / runs.len() as f64;
        assert!((mean - (MAX_RUN + 1) as f64 / 2.0).abs() < 1.5, "mean run {mean}");
        assert!(runs.iter().all(|&r| (1..=MAX_RUN).contains(&r)));
        assert_eq!(runs.iter().max(), Some(&MAX_RUN));
        // Runs start at scattered pages: ~3000 starts fall in most of the 1024 regions of 2^20.
        let regions: HashSet<_> = starts.iter().map(|s| s >> 20).collect();
        assert!(regions.len() > 900, "{} regions for {} runs", regions.len(), starts.len());
    }

    #[test]
    fn zipf_is_skewed_toward_low_pages() {
        let pages = 100_000;
        let d = draws(PageDist::Zipf, pages, 500_000, 17);
        // The exact Zipf share of the first b pages, against which Gray's approximation is
        // within about 1.5 points (exact for pages 0 and 1).
        let exact = |b: u64| zeta(b, ZIPF_THETA) / zeta(pages, ZIPF_THETA);
        for (b, tolerance) in [(1, 0.003), (2, 0.003), (10, 0.02), (pages / 100, 0.02), (pages / 10, 0.02)] {
            let (got, want) = (share_below(&d, b), exact(b));
            assert!((got - want).abs() < tolerance, "first {b} pages: {got} against {want}");
        }
        // θ = 0.99 over 10^5 pages: the first 1% take about 60% (60 times their share), page 0
        // alone about 8%, and the tail is still drawn.
        assert!(share_below(&d, pages / 100) > 0.55);
        assert!(share_below(&d, 1) > 0.07);
        assert!(share_below(&d, pages / 2) < 0.97);
    }

    #[test]
    fn zeta_tail_matches_the_sum() {
        for n in [1, 2, 1000, 1024, 1025, 5000, 100_000, 3_000_000] {
            let exact: f64 = (1..=n).map(|i| (i as f64).powf(-ZIPF_THETA)).sum();
            let approx = zeta(n, ZIPF_THETA);
            assert!(((approx - exact) / exact).abs() < 1e-10, "ζ({n}): {approx} against {exact}");
        }
    }

    #[test]
    fn self_similar_gives_80_percent_to_20_percent() {
        let pages = 100_000;
        let d = draws(PageDist::SelfSimilar, pages, 200_000, 19);
        let top20 = share_below(&d, pages / 5);
        assert!((top20 - 0.8).abs() < 0.01, "top 20% share {top20}");
        let top4 = share_below(&d, pages / 25);
        assert!((top4 - 0.64).abs() < 0.01, "top 4% share {top4}");
    }

    #[test]
    fn moving_cluster_stays_in_a_window_that_moves() {
        let pages = 1 << 14;
        let window = pages / CLUSTER_WINDOW_DIVISOR;
        let d = draws(PageDist::MovingCluster, pages, (pages * CLUSTER_STEP) as usize + 10_000, 23);
        for (i, &p) in d.iter().enumerate() {
            let start = (i as u64 / CLUSTER_STEP) % pages;
            assert!((p + pages - start) % pages < window, "draw {i}: page {p}, window at {start}");
        }
        // A short stretch touches few pages, a long one (the window went all the way round)
        // nearly all of them.
        let short: HashSet<_> = d[..2000].iter().collect();
        assert!(short.len() < (window + 2000 / CLUSTER_STEP) as usize, "{} pages", short.len());
        let long: HashSet<_> = d.iter().collect();
        assert!(long.len() as u64 > pages * 95 / 100, "{} of {pages} pages", long.len());
        // Later stretches are elsewhere.
        let later: HashSet<_> = d[100_000..102_000].iter().collect();
        assert!(short.is_disjoint(&later));
    }
}
