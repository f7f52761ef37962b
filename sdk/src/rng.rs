//! A small deterministic random number generator.

use crate::Request;

/// SplitMix64: a tiny, fast, seedable generator with good statistical quality for routing decisions.
///
/// Deterministic across platforms and SDK versions: the same seed always yields the same sequence
/// (the algorithm is fixed and uses only integer arithmetic; [`Rng::next_f64`] is an exact conversion).
/// Nearby seeds (0, 1, 2, ...) give unrelated sequences. Not cryptographically secure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`. Every seed, including 0, is fine.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The generator for one request, seeded from the host-supplied [`Request::seed`], so a decision is
    /// reproducible from its inputs.
    pub const fn for_request(request: &Request) -> Self {
        Self::new(request.seed)
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`, with 53 random bits (consumes one [`Rng::next_u64`]).
    pub fn next_f64(&mut self) -> f64 {
        // 2^-53; the top 53 bits of a u64 convert to f64 exactly.
        const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
        (self.next_u64() >> 11) as f64 * SCALE
    }

    /// A uniform integer in `[0, bound)`, without modulo bias; 0 when `bound` is 0.
    ///
    /// Usually consumes one [`Rng::next_u64`], rarely more (rejection sampling).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        // Lemire's multiply-shift with rejection of the biased low range.
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(bound);
            if (product as u64) >= threshold {
                return (product >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_splitmix64_sequence() {
        let mut rng = Rng::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(rng.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn same_seed_same_sequence() {
        let mut a = Rng::for_request(&Request::with_seed(42));
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn floats_are_in_the_unit_interval_and_spread() {
        let mut rng = Rng::new(7);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let x = rng.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        let mean = sum / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(3);
        let mut seen = [0u32; 5];
        for _ in 0..5_000 {
            let x = rng.below(5);
            assert!(x < 5);
            seen[x as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 850), "{seen:?}");
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
    }
}
