//! What RouteWise learns from observations: latency profiles, the output-length predictor and the
//! cost envelope. Time is always the host's `now-ms`; nothing here reads a clock.

use std::collections::{BTreeMap, VecDeque};

use crate::name::SharedName;

/// TTFT recorded for a failed attempt, in milliseconds.
pub const FAILURE_PENALTY_MS: f64 = 60_000.0;

/// Samples the cost envelope keeps at most (the newest win), so percentiles stay cheap.
pub const ENVELOPE_MAX_SAMPLES: usize = 8_192;

/// A dirty, calibrated envelope is recomputed at most this often (an uncalibrated one at once).
pub const ENVELOPE_RECOMPUTE_MS: u64 = 1_000;

/// A running mean's count is halved (with its sum) when it reaches this, so old behaviour fades.
pub const OUTPUT_STAT_CAP: u64 = 10_000;

/// Rolling TTFT samples of one endpoint within a time window.
#[derive(Clone, Debug, Default)]
pub struct LatencyProfile {
    samples: VecDeque<(u64, f64)>,
    /// The same values in ascending order, so the hedge's CDF queries are binary searches.
    sorted: SortedSamples,
    sum: f64,
}

/// Values in ascending order, in runs of at most [`SortedSamples::MAX_RUN`]: a sample added or
/// dropped moves the values after it in its run only. One sorted `Vec` moved half the profile
/// twice per observation, 40 KB at the default cap of 5,000 samples: under load that copy was most
/// of what a RouteWise request cost (`memmove` was 61 % of `select` and `observe` natively).
#[derive(Clone, Debug, Default)]
struct SortedSamples {
    /// Never an empty run; every value of a run is at most every value of the next.
    runs: Vec<Vec<f64>>,
    len: usize,
}

impl SortedSamples {
    /// A run this long is split in two halves.
    const MAX_RUN: usize = 512;

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn clear(&mut self) {
        self.runs.clear();
        self.len = 0;
    }

    /// The first run whose last value is at least `value`: where `value` goes, and where its first
    /// copy is when it is here (every run before it holds only smaller values).
    fn run_for(&self, value: f64) -> usize {
        self.runs
            .partition_point(|run| run.last().is_some_and(|&last| last < value))
    }

    fn insert(&mut self, value: f64) {
        // Past every run's last value it joins the last run.
        let r = self.run_for(value).min(self.runs.len().saturating_sub(1));
        if self.runs.is_empty() {
            self.runs.push(Vec::new());
        }
        let run = &mut self.runs[r];
        let at = run.partition_point(|&v| v < value);
        run.insert(at, value);
        self.len += 1;
        if run.len() >= Self::MAX_RUN {
            let upper = run.split_off(Self::MAX_RUN / 2);
            self.runs.insert(r + 1, upper);
        }
    }

    /// Removes one copy of `value`, if it is here.
    fn remove(&mut self, value: f64) {
        let r = self.run_for(value);
        let Some(run) = self.runs.get_mut(r) else {
            return;
        };
        let at = run.partition_point(|&v| v < value);
        if run.get(at) == Some(&value) {
            run.remove(at);
            self.len -= 1;
            if run.is_empty() {
                self.runs.remove(r);
            }
        }
    }

    /// How many values are at most `limit`.
    fn count_at_most(&self, limit: f64) -> usize {
        let whole = self
            .runs
            .partition_point(|run| run.last().is_some_and(|&last| last <= limit));
        let before: usize = self.runs[..whole].iter().map(Vec::len).sum();
        before
            + self
                .runs
                .get(whole)
                .map_or(0, |run| run.partition_point(|&v| v <= limit))
    }
}

impl LatencyProfile {
    /// Adds a sample at `now_ms`, then trims to the window and to `max_samples` (oldest first).
    pub fn push(&mut self, now_ms: u64, ttft_ms: f64, window_ms: u64, max_samples: usize) {
        if !ttft_ms.is_finite() || ttft_ms < 0.0 {
            return;
        }
        self.samples.push_back((now_ms, ttft_ms));
        self.sorted.insert(ttft_ms);
        self.sum += ttft_ms;
        while self.samples.len() > max_samples.max(1) {
            self.pop_front();
        }
        self.trim(now_ms, window_ms);
    }

    /// Drops samples older than `window_ms` before `now_ms`.
    pub fn trim(&mut self, now_ms: u64, window_ms: u64) {
        let cutoff = now_ms.saturating_sub(window_ms);
        while self.samples.front().is_some_and(|&(t, _)| t < cutoff) {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, ms)) = self.samples.pop_front() {
            self.sum -= ms;
            self.sorted.remove(ms);
        }
        if self.samples.is_empty() {
            self.sum = 0.0;
            self.sorted.clear();
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Mean TTFT of the samples in the window; `None` without samples.
    pub fn mean(&self) -> Option<f64> {
        (!self.samples.is_empty()).then(|| (self.sum / self.samples.len() as f64).max(0.0))
    }

    /// Share of samples at or below `limit_ms` (the empirical CDF); `None` without samples. Failed
    /// attempts are samples of [`FAILURE_PENALTY_MS`], so they count as misses of any limit below it.
    pub fn cdf(&self, limit_ms: f64) -> Option<f64> {
        (!self.sorted.is_empty())
            .then(|| self.sorted.count_at_most(limit_ms) as f64 / self.sorted.len() as f64)
    }

    /// Share of samples at or below `slo_ms`; `None` without samples.
    pub fn slo_share(&self, slo_ms: f64) -> Option<f64> {
        self.cdf(slo_ms)
    }
}

/// A running mean with a soft cap on its count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MeanStat {
    pub count: u64,
    pub sum: f64,
}

impl MeanStat {
    fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        if self.count >= OUTPUT_STAT_CAP {
            self.count /= 2;
            self.sum /= 2.0;
        }
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    fn mean_if(&self, min_samples: u32) -> Option<f64> {
        (self.count >= u64::from(min_samples.max(1)))
            .then(|| self.mean())
            .flatten()
    }
}

/// Where a prediction came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputSource {
    Bucket,
    Model,
    Global,
    Default,
}

impl OutputSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bucket => "bucket",
            Self::Model => "model",
            Self::Global => "global",
            Self::Default => "default",
        }
    }
}

/// Minimum samples per level and the default, from the params.
#[derive(Clone, Copy, Debug)]
pub struct OutputThresholds {
    pub bucket: u32,
    pub model: u32,
    pub global: u32,
    pub default_tokens: u32,
}

/// Predicts completion tokens from (model, ⌊log2 prompt tokens⌋).
#[derive(Clone, Debug, Default)]
pub struct OutputPredictor {
    /// Per model: its overall stat and its stats by prompt bucket. Keyed by model first so a
    /// lookup borrows the name instead of allocating a key on every request, and by the caller's
    /// shared name, which a lookup then meets by pointer.
    models: BTreeMap<SharedName, ModelStats>,
    global: MeanStat,
}

#[derive(Clone, Debug, Default)]
struct ModelStats {
    all: MeanStat,
    buckets: BTreeMap<u32, MeanStat>,
}

/// ⌊log2 prompt_tokens⌋, with 0 tokens in bucket 0.
pub fn prompt_bucket(prompt_tokens: u32) -> u32 {
    prompt_tokens.max(1).ilog2()
}

impl OutputPredictor {
    /// Learns one served answer. A zero-token completion is not an observation (as in the
    /// reference): an empty answer says nothing about how long the next one will be, and counting
    /// it would drag the means towards nothing.
    pub fn record(&mut self, model: &SharedName, prompt_tokens: u32, completion_tokens: u32) {
        if completion_tokens == 0 {
            return;
        }
        let value = f64::from(completion_tokens);
        let stats = match self.models.get_mut(model) {
            Some(stats) => stats,
            None => self.models.entry(model.clone()).or_default(),
        };
        stats
            .buckets
            .entry(prompt_bucket(prompt_tokens))
            .or_default()
            .add(value);
        stats.all.add(value);
        self.global.add(value);
    }

    /// Bucket mean, else model mean, else global mean, else the default; capped by `max_tokens`
    /// (the answer cannot be longer: a deliberate difference from the reference, which ignores it),
    /// at least 1.
    pub fn predict(
        &self,
        model: &SharedName,
        prompt_tokens: u32,
        max_tokens: Option<u32>,
        thresholds: OutputThresholds,
    ) -> (u32, OutputSource) {
        let stats = self.models.get(model);
        let bucket = stats
            .and_then(|m| m.buckets.get(&prompt_bucket(prompt_tokens)))
            .and_then(|s| s.mean_if(thresholds.bucket));
        let (tokens, source) = if let Some(mean) = bucket {
            (mean, OutputSource::Bucket)
        } else if let Some(mean) = stats.and_then(|m| m.all.mean_if(thresholds.model)) {
            (mean, OutputSource::Model)
        } else if let Some(mean) = self.global.mean_if(thresholds.global) {
            (mean, OutputSource::Global)
        } else {
            (f64::from(thresholds.default_tokens), OutputSource::Default)
        };
        let mut tokens = tokens.round().clamp(0.0, f64::from(u32::MAX)) as u32;
        if let Some(max) = max_tokens {
            tokens = tokens.min(max);
        }
        (tokens.max(1), source)
    }

    pub fn global(&self) -> MeanStat {
        self.global
    }

    pub fn model(&self, model: &str) -> MeanStat {
        self.models.get(model).map(|m| m.all).unwrap_or_default()
    }

    /// The buckets of `model`: (⌊log2⌋, stat).
    pub fn buckets<'a>(&'a self, model: &'a str) -> impl Iterator<Item = (u32, MeanStat)> + 'a {
        self.models
            .get(model)
            .into_iter()
            .flat_map(|m| m.buckets.iter().map(|(b, s)| (*b, *s)))
    }
}

/// The envelope's current bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// Samples in the window.
    pub samples: usize,
    pub calibrated: bool,
    /// L after the fix-up (`None` without samples).
    pub lower: Option<f64>,
    /// U (`None` without samples).
    pub upper: Option<f64>,
    /// Whether L was replaced by `U · 1e-3` (the raw percentile was ≤ 0 or ≥ U).
    pub lower_fixed: bool,
}

impl Bounds {
    const EMPTY: Bounds = Bounds {
        samples: 0,
        calibrated: false,
        lower: None,
        upper: None,
        lower_fixed: false,
    };

    /// The quota shadow price `L · (U/L)^z` at used fraction `z` (clamped to [0, 0.9999]); `None`
    /// while uncalibrated.
    pub fn shadow_price(&self, used_fraction: f64) -> Option<f64> {
        if !self.calibrated {
            return None;
        }
        let (lower, upper) = (self.lower?, self.upper?);
        let z = if used_fraction.is_nan() {
            0.0
        } else {
            used_fraction.clamp(0.0, 0.9999)
        };
        if upper <= 0.0 || lower <= 0.0 {
            return Some(0.0);
        }
        Some(lower * (upper / lower).powf(z))
    }
}

/// Envelope settings, from the params.
#[derive(Clone, Copy, Debug)]
pub struct EnvelopeSettings {
    pub window_ms: u64,
    pub lower_percentile: f64,
    pub upper_percentile: f64,
    pub min_samples: u32,
}

/// Per-request cost samples (the cheapest on-demand cost of each served request) over a window;
/// their lower/upper percentiles bound the shadow price of quota routes.
#[derive(Clone, Debug)]
pub struct CostEnvelope {
    samples: VecDeque<(u64, f64)>,
    bounds: Bounds,
    dirty: bool,
    computed_at_ms: u64,
}

impl Default for CostEnvelope {
    fn default() -> Self {
        Self {
            samples: VecDeque::new(),
            bounds: Bounds::EMPTY,
            dirty: false,
            computed_at_ms: 0,
        }
    }
}

/// Linear interpolation between closest ranks (`numpy.percentile`'s default) of unsorted values.
pub fn percentile(values: &mut [f64], p: f64) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
    let lo = rank.floor() as usize;
    let frac = rank - lo as f64;
    let (_, &mut at_lo, above) = values.select_nth_unstable_by(lo, f64::total_cmp);
    let at_hi = if frac > 0.0 {
        above.iter().copied().fold(f64::INFINITY, f64::min)
    } else {
        at_lo
    };
    if !at_hi.is_finite() {
        return Some(at_lo);
    }
    Some(at_lo + (at_hi - at_lo) * frac)
}

impl CostEnvelope {
    pub fn record(&mut self, now_ms: u64, cost: f64) {
        if !cost.is_finite() || cost < 0.0 {
            return;
        }
        self.samples.push_back((now_ms, cost));
        while self.samples.len() > ENVELOPE_MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.dirty = true;
    }

    pub fn trim(&mut self, now_ms: u64, window_ms: u64) {
        let cutoff = now_ms.saturating_sub(window_ms);
        while self.samples.front().is_some_and(|&(t, _)| t < cutoff) {
            self.samples.pop_front();
            self.dirty = true;
        }
    }

    /// Trims to the window and returns the bounds, recomputing them when samples changed (at most
    /// every [`ENVELOPE_RECOMPUTE_MS`] once calibrated).
    pub fn bounds(&mut self, now_ms: u64, settings: EnvelopeSettings) -> Bounds {
        self.trim(now_ms, settings.window_ms);
        let due = !self.bounds.calibrated
            || now_ms < self.computed_at_ms
            || now_ms >= self.computed_at_ms.saturating_add(ENVELOPE_RECOMPUTE_MS);
        if self.dirty && due {
            self.bounds = self.compute(settings);
            self.dirty = false;
            self.computed_at_ms = now_ms;
        }
        self.bounds
    }

    /// The last computed bounds (for `status`).
    pub fn last_bounds(&self) -> Bounds {
        self.bounds
    }

    fn compute(&self, settings: EnvelopeSettings) -> Bounds {
        let mut values: Vec<f64> = self.samples.iter().map(|&(_, c)| c).collect();
        let (Some(raw_lower), Some(upper)) = (
            percentile(&mut values, settings.lower_percentile),
            percentile(&mut values, settings.upper_percentile),
        ) else {
            return Bounds::EMPTY;
        };
        let lower_fixed = raw_lower <= 0.0 || raw_lower >= upper;
        Bounds {
            samples: values.len(),
            calibrated: values.len() >= settings.min_samples.max(1) as usize,
            lower: Some(if lower_fixed { upper * 1e-3 } else { raw_lower }),
            upper: Some(upper),
            lower_fixed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_window_cap_and_mean() {
        let mut p = LatencyProfile::default();
        assert_eq!(p.mean(), None);
        p.push(0, 100.0, 1_000, 3);
        p.push(500, 300.0, 1_000, 3);
        assert_eq!(p.mean(), Some(200.0));
        // Cap: the oldest goes.
        p.push(600, 500.0, 1_000, 3);
        p.push(700, 700.0, 1_000, 3);
        assert_eq!(p.len(), 3);
        assert_eq!(p.mean(), Some(500.0));
        // Window: at 1 550 only samples from 550 on remain.
        p.trim(1_550, 1_000);
        assert_eq!(p.len(), 2);
        assert_eq!(p.mean(), Some(600.0));
        p.trim(10_000, 1_000);
        assert!(p.is_empty());
        assert_eq!(p.mean(), None);
        p.push(10_000, f64::NAN, 1_000, 3);
        assert!(p.is_empty());
        p.push(10_000, 2_000.0, 1_000, 3);
        assert_eq!(p.slo_share(3_000.0), Some(1.0));
        assert_eq!(p.slo_share(1_000.0), Some(0.0));
    }

    const T: OutputThresholds = OutputThresholds {
        bucket: 3,
        model: 3,
        global: 3,
        default_tokens: 500,
    };

    #[test]
    fn output_predictor_falls_back_level_by_level() {
        let mut o = OutputPredictor::default();
        assert_eq!(
            o.predict(&"m".into(), 100, None, T),
            (500, OutputSource::Default)
        );
        assert_eq!(
            o.predict(&"m".into(), 100, Some(64), T),
            (64, OutputSource::Default)
        );
        assert_eq!(
            o.predict(&"m".into(), 100, Some(0), T),
            (1, OutputSource::Default)
        );
        // Three samples of another model: global level only.
        for tokens in [10, 20, 30] {
            o.record(&"other".into(), 100, tokens);
        }
        assert_eq!(
            o.predict(&"m".into(), 100, None, T),
            (20, OutputSource::Global)
        );
        // Three samples of m in bucket ⌊log2 5000⌋ = 12.
        for tokens in [100, 200, 300] {
            o.record(&"m".into(), 5_000, tokens);
        }
        assert_eq!(
            o.predict(&"m".into(), 100, None, T),
            (200, OutputSource::Model)
        );
        assert_eq!(
            o.predict(&"m".into(), 4_096, None, T),
            (200, OutputSource::Bucket)
        );
        assert_eq!(
            o.predict(&"m".into(), 8_192, None, T),
            (200, OutputSource::Model)
        );
        o.record(&"m".into(), 4_500, 1_000);
        // Bucket 12 mean: 400; model mean: 400 too; the cap still applies.
        assert_eq!(
            o.predict(&"m".into(), 6_000, None, T),
            (400, OutputSource::Bucket)
        );
        assert_eq!(
            o.predict(&"m".into(), 6_000, Some(50), T),
            (50, OutputSource::Bucket)
        );
        // Zero-token completions teach nothing: the bucket keeps its four samples.
        for _ in 0..10 {
            o.record(&"m".into(), 6_000, 0);
        }
        assert_eq!(
            o.predict(&"m".into(), 6_000, None, T),
            (400, OutputSource::Bucket)
        );
        assert_eq!(o.model("m").count, 4);
        assert_eq!(o.global().count, 7);
        assert_eq!(prompt_bucket(0), 0);
        assert_eq!(prompt_bucket(1), 0);
        assert_eq!(prompt_bucket(1_024), 10);
    }

    /// The profile's CDF at each limit is the share of its live samples at or below it.
    fn assert_cdf_counts_the_live_samples(
        profile: &LatencyProfile,
        limits: impl IntoIterator<Item = f64>,
        after: u64,
    ) {
        let live: Vec<f64> = profile.samples.iter().map(|&(_, v)| v).collect();
        for limit in limits {
            let expected = live.iter().filter(|&&v| v <= limit).count() as f64 / live.len() as f64;
            assert_eq!(
                profile.cdf(limit),
                Some(expected),
                "after {after}, limit {limit}"
            );
        }
    }

    /// Thousands of samples, many equal, through the cap and the window: runs split and empty,
    /// and the CDF still counts exactly what is live.
    #[test]
    fn cdf_stays_exact_over_many_runs() {
        let mut profile = LatencyProfile::default();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..12_000_u64 {
            // Values 0..400 in steps of 0.5, so most values recur; a burst of one value too.
            let ms = if (5_000..5_700).contains(&i) {
                42.0
            } else {
                (next() % 800) as f64 / 2.0
            };
            // At most 3,000 samples, and a window of 4,000 ms after the first 6,000.
            let window = if i < 6_000 { u64::MAX } else { 4_000 };
            profile.push(i, ms, window, 3_000);
            if i % 997 != 0 && i != 11_999 {
                continue;
            }
            let mut live: Vec<f64> = profile.samples.iter().map(|&(_, v)| v).collect();
            live.sort_by(f64::total_cmp);
            let runs = &profile.sorted.runs;
            assert!(
                runs.iter()
                    .all(|r| !r.is_empty() && r.len() < SortedSamples::MAX_RUN)
            );
            assert_eq!(runs.concat(), live, "after {i}");
            if live.len() >= 2 * SortedSamples::MAX_RUN {
                assert!(
                    runs.len() > 2,
                    "{} samples in {} runs",
                    live.len(),
                    runs.len()
                );
            }
            assert_cdf_counts_the_live_samples(
                &profile,
                [-1.0, 0.0, 0.5, 41.5, 42.0, 42.25, 199.5, 399.5, 400.0],
                i,
            );
        }
        profile.trim(u64::MAX, 1);
        assert!(profile.sorted.is_empty() && profile.sorted.runs.is_empty());
    }

    #[test]
    fn cdf_agrees_with_a_count_of_the_live_samples_through_caps_and_trims() {
        let mut profile = LatencyProfile::default();
        assert_eq!(profile.cdf(1.0), None);
        let values = [
            5.0, 1.0, 9.0, 3.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 10.0, 12.0, 3.0,
        ];
        for (i, ms) in values.into_iter().enumerate() {
            // At most 8 samples, and a 6 ms window from the newest: both drop the oldest.
            profile.push(i as u64, ms, 6, 8);
            assert_cdf_counts_the_live_samples(&profile, (0..=13).map(f64::from), i as u64);
        }
        profile.trim(1_000, 6);
        assert_eq!(profile.cdf(100.0), None);
        assert!(profile.sorted.is_empty());
    }

    #[test]
    fn percentile_interpolates_linearly() {
        let mut v: Vec<f64> = (1..=11).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 10.0), Some(2.0));
        assert_eq!(percentile(&mut v, 90.0), Some(10.0));
        assert_eq!(percentile(&mut v, 50.0), Some(6.0));
        let mut v = vec![4.0, 0.0];
        assert_eq!(percentile(&mut v, 25.0), Some(1.0));
        assert_eq!(percentile(&mut [], 50.0), None);
        assert_eq!(percentile(&mut [7.0], 90.0), Some(7.0));
    }

    const S: EnvelopeSettings = EnvelopeSettings {
        window_ms: 10_000,
        lower_percentile: 10.0,
        upper_percentile: 90.0,
        min_samples: 5,
    };

    #[test]
    fn envelope_calibrates_at_min_samples_and_fixes_lower() {
        let mut e = CostEnvelope::default();
        for (i, cost) in [1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
            e.record(i as u64, cost);
        }
        let b = e.bounds(10, S);
        assert_eq!(b.samples, 4);
        assert!(!b.calibrated);
        assert_eq!(b.shadow_price(0.5), None);
        e.record(10, 5.0);
        let b = e.bounds(10, S);
        assert!(b.calibrated);
        assert!((b.lower.unwrap_or(0.0) - 1.4).abs() < 1e-12);
        assert!((b.upper.unwrap_or(0.0) - 4.6).abs() < 1e-12);
        assert!(!b.lower_fixed);
        // Shadow price: L at z = 0, U at z = 1 (clamped to 0.9999).
        assert!((b.shadow_price(0.0).unwrap_or(0.0) - 1.4).abs() < 1e-12);
        assert!((b.shadow_price(2.0).unwrap_or(0.0) - 4.6).abs() < 1e-3);
        let mid = b.shadow_price(0.5).unwrap_or(0.0);
        assert!((mid - (1.4f64 * 4.6).sqrt()).abs() < 1e-12, "{mid}");

        // Every sample 0 but one: L ≤ 0 → L = U · 1e-3.
        let mut e = CostEnvelope::default();
        for i in 0..9 {
            e.record(i, 0.0);
        }
        e.record(9, 10.0);
        let b = e.bounds(9, S);
        assert!(b.lower_fixed);
        let upper = b.upper.unwrap_or(0.0);
        assert!((upper - 1.0).abs() < 1e-9, "{upper}");
        assert_eq!(b.lower, Some(upper * 1e-3));
        // All equal: L ≥ U → fixed too.
        let mut e = CostEnvelope::default();
        for i in 0..5 {
            e.record(i, 2.0);
        }
        let b = e.bounds(5, S);
        assert!(b.lower_fixed);
        assert_eq!(b.lower, Some(2e-3));
    }

    #[test]
    fn envelope_window_and_throttle() {
        let mut e = CostEnvelope::default();
        for i in 0..5 {
            e.record(i, 1.0 + i as f64);
        }
        assert!(e.bounds(5, S).calibrated);
        // A new sample within the throttle interval keeps the cached bounds.
        e.record(100, 100.0);
        assert_eq!(e.bounds(100, S).samples, 5);
        assert_eq!(e.bounds(1_005, S).samples, 6);
        // Past the window every sample but the newest is gone: uncalibrated again.
        let b = e.bounds(10_050, S);
        assert_eq!(b.samples, 1);
        assert!(!b.calibrated);
    }
}
