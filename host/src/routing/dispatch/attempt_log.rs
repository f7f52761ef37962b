//! The attempt log of one request: every attempt the dispatch sent — the one that answered,
//! the ones that failed before it, a hedge's backup and the side of a hedge that lost — with its
//! status, tokens, cost and latency, for the request log (`api_logs.attempt_log`).
//!
//! The ledger of each attempt writes its entry: a slot when the attempt opens (so entries are in
//! the order they were sent), filled when the attempt ends, or marked `cancelled` when it is
//! dropped without an end (a hedge that lost, a client that left).

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::config::ModelUpstream;
use crate::config::raw::RawPricing;
use crate::protocol::ir::Usage;
use crate::upstream::{AttemptEnd, AttemptError};

/// `error_type` of an attempt dropped before it ended: a hedge that lost the race, or the
/// client went away. What it consumed is not known; it is logged with 0 tokens.
pub const CANCELLED: &str = "cancelled";

/// One attempt, as `api_logs.attempt_log` keeps it (written by [`attempts_json`], which the tests
/// hold to this derived `Serialize`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptRecord {
    pub endpoint_id: String,
    /// The upstream's protocol (`openai_compat`, `openai_responses`, `anthropic`).
    pub provider: &'static str,
    /// The upstream's HTTP status; 0 when it gave none (transport error, timeout, cancelled
    /// before its headers).
    pub status: u16,
    /// `None` when the attempt succeeded; else its kind (`http_status`, `timeout`, …,
    /// [`CANCELLED`]). A stream that failed after reaching the client has status 200 and one.
    pub error_type: Option<&'static str>,
    /// The backup a latency hedge sent.
    pub hedge: bool,
    /// Every input token, cached ones included (the IR's convention; Anthropic's
    /// `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`).
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Input tokens read from a prompt cache (part of `prompt_tokens`).
    pub cached_tokens: u32,
    /// Input tokens written to a prompt cache (part of `prompt_tokens`; Anthropic only).
    pub cache_write_tokens: u32,
    /// `None` when the upstream has no `pricing`.
    pub cost_usd: Option<f64>,
    pub latency_ms: f64,
    /// Position of the upstream in the model's list.
    #[serde(skip)]
    position: usize,
    /// This attempt's answer is the one the client got.
    #[serde(skip)]
    served: bool,
    #[serde(skip)]
    ended: bool,
    #[serde(skip)]
    started: Instant,
}

/// Shared by the dispatch and each attempt's ledger; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct AttemptLog(Arc<Mutex<Vec<AttemptRecord>>>);

impl AttemptLog {
    /// An attempt at the upstream at `position` of the model's list is being sent: its slot.
    pub(super) fn open(&self, position: usize, upstream: &ModelUpstream, hedge: bool) -> usize {
        let mut entries = self.0.lock();
        entries.push(AttemptRecord {
            endpoint_id: upstream.endpoint_id.clone(),
            provider: upstream.kind.as_str(),
            status: 0,
            error_type: None,
            hedge,
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: 0,
            cache_write_tokens: 0,
            // Priced at 0 until it reports usage: an attempt that consumed nothing known costs 0.
            cost_usd: upstream.pricing.map(|_| 0.0),
            latency_ms: 0.0,
            position,
            served: false,
            ended: false,
            started: Instant::now(),
        });
        entries.len() - 1
    }

    /// A stream's first content arrived: the upstream answered 200.
    pub(super) fn first_token(&self, slot: usize) {
        if let Some(entry) = self.0.lock().get_mut(slot) {
            entry.status = 200;
        }
    }

    /// The attempt in `slot` ended as `end` says; `cost_usd` is what its usage cost.
    pub(super) fn end(&self, slot: usize, end: &AttemptEnd<'_>, cost_usd: Option<f64>) {
        if let Some(entry) = self.0.lock().get_mut(slot) {
            entry.status = end.status;
            entry.error_type = end.outcome.err().map(AttemptError::error_type);
            entry.prompt_tokens = end.usage.input_tokens;
            entry.completion_tokens = end.usage.output_tokens;
            entry.cached_tokens = end.usage.cached_input_tokens;
            entry.cache_write_tokens = end.usage.cache_creation_input_tokens;
            entry.cost_usd = cost_usd;
            entry.latency_ms = end.latency_ms;
            entry.ended = true;
        }
    }

    /// The attempt in `slot` was dropped without an end.
    pub(super) fn cancelled(&self, slot: usize) {
        if let Some(entry) = self.0.lock().get_mut(slot).filter(|e| !e.ended) {
            cancel(entry);
        }
    }

    /// The attempt at `position` answered the client.
    pub(super) fn served(&self, position: usize) {
        let mut entries = self.0.lock();
        if let Some(entry) = entries.iter_mut().rev().find(|e| e.position == position) {
            entry.served = true;
        }
    }

    /// Every attempt so far, in the order they were sent. One still running (a stream whose
    /// client left, read before its ledger was dropped) shows as cancelled, as it will end.
    pub fn records(&self) -> Vec<AttemptRecord> {
        let mut records = self.0.lock().clone();
        for entry in records.iter_mut().filter(|e| !e.ended) {
            cancel(entry);
        }
        records
    }

    /// [`summarize`] of [`AttemptLog::records`], read in place when every attempt has ended (as
    /// they have when a request is logged, but for a stream whose client left): the copy of the
    /// list and of each record's endpoint id is not needed then.
    pub fn summary(&self) -> AttemptSummary {
        {
            let entries = self.0.lock();
            if entries.iter().all(|e| e.ended) {
                return summarize(&entries);
            }
        }
        summarize(&self.records())
    }

    /// What the attempts so far cost: the sum over those whose upstream has `pricing`, `None`
    /// when none has (the same as [`summarize`]'s, without writing the log).
    pub fn cost_usd(&self) -> Option<f64> {
        sum_cost(self.0.lock().iter())
    }
}

fn sum_cost<'a>(records: impl Iterator<Item = &'a AttemptRecord>) -> Option<f64> {
    records
        .filter_map(|r| r.cost_usd)
        .fold(None, |sum: Option<f64>, c| Some(sum.unwrap_or(0.0) + c))
}

fn cancel(entry: &mut AttemptRecord) {
    entry.error_type = Some(CANCELLED);
    entry.latency_ms = entry.started.elapsed().as_secs_f64() * 1000.0;
    entry.ended = true;
}

/// What the request log keeps of a request's attempts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptSummary {
    /// The attempts as a JSON array; `None` when there were none.
    pub json: Option<String>,
    /// The sum over the attempts whose upstream has `pricing`; `None` when none has.
    pub cost_usd: Option<f64>,
    /// Prompt-cache reads and writes of the attempt that answered.
    pub cached_tokens: Option<u32>,
    pub cache_write_tokens: Option<u32>,
}

/// Sums up `records`.
pub fn summarize(records: &[AttemptRecord]) -> AttemptSummary {
    let served = records.iter().find(|r| r.served);
    AttemptSummary {
        json: (!records.is_empty()).then(|| attempts_json(records)),
        cost_usd: sum_cost(records.iter()),
        cached_tokens: served.map(|r| r.cached_tokens),
        cache_write_tokens: served.map(|r| r.cache_write_tokens),
    }
}

/// `records` as a JSON array, as `serde_json` writes the derived `Serialize` of each: the keys
/// written as the constants they are, each value by `serde_json` (string escapes, integers, and
/// floats with non-finite ones as `null`). Derived, every key went through the string escaper
/// and the struct machinery: 3,300 instructions for one record, on every request.
fn attempts_json(records: &[AttemptRecord]) -> String {
    use crate::protocol::json::{push_entry as value, push_str_entry as text};
    let mut out = Vec::with_capacity(records.len() * 320);
    out.push(b'[');
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        text(&mut out, "{\"endpoint_id\":", &r.endpoint_id);
        text(&mut out, ",\"provider\":", r.provider);
        value(&mut out, ",\"status\":", &r.status);
        match r.error_type {
            Some(error_type) => text(&mut out, ",\"error_type\":", error_type),
            None => out.extend_from_slice(b",\"error_type\":null"),
        }
        value(&mut out, ",\"hedge\":", &r.hedge);
        value(&mut out, ",\"prompt_tokens\":", &r.prompt_tokens);
        value(&mut out, ",\"completion_tokens\":", &r.completion_tokens);
        value(&mut out, ",\"cached_tokens\":", &r.cached_tokens);
        value(&mut out, ",\"cache_write_tokens\":", &r.cache_write_tokens);
        value(&mut out, ",\"cost_usd\":", &r.cost_usd);
        value(&mut out, ",\"latency_ms\":", &r.latency_ms);
        out.push(b'}');
    }
    out.push(b']');
    // Only JSON text went in.
    String::from_utf8(out).unwrap_or_default()
}

/// What `usage` costs at `pricing` (USD per million tokens). The IR counts cached reads and
/// cache writes inside `input_tokens` whatever the protocol (the Anthropic decoder adds them to
/// Anthropic's `input_tokens`), so they are taken out of it and charged once, at their own price
/// (or at `prompt` when the route sets none).
pub fn cost_usd(pricing: &RawPricing, usage: &Usage) -> f64 {
    let cached = u64::from(usage.cached_input_tokens);
    let written = u64::from(usage.cache_creation_input_tokens);
    let fresh = u64::from(usage.input_tokens).saturating_sub(cached + written);
    let reads = pricing.input_cache_reads.unwrap_or(pricing.prompt);
    let writes = pricing.input_cache_writes.unwrap_or(pricing.prompt);
    (fresh as f64 * pricing.prompt
        + cached as f64 * reads
        + written as f64 * writes
        + f64::from(usage.output_tokens) * pricing.completion)
        / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Dialect;

    fn pricing(reads: Option<f64>, writes: Option<f64>) -> RawPricing {
        RawPricing {
            prompt: 3.0,
            completion: 15.0,
            input_cache_reads: reads,
            input_cache_writes: writes,
        }
    }

    /// The usage each dialect's decoder reads from a whole answer.
    fn usage_of(dialect: Dialect, body: &str) -> Usage {
        dialect
            .parse_response(body.as_bytes())
            .expect("a valid answer")
            .usage
    }

    #[test]
    fn anthropic_cache_reads_and_writes_are_charged_once_at_their_prices() {
        // Anthropic counts cache reads and writes apart from `input_tokens`.
        let usage = usage_of(
            Dialect::AnthropicMessages,
            r#"{"id":"msg_1","type":"message","role":"assistant","model":"c",
                "content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn",
                "usage":{"input_tokens":100,"output_tokens":20,
                         "cache_read_input_tokens":1000,"cache_creation_input_tokens":400}}"#,
        );
        let cost = cost_usd(&pricing(Some(0.3), Some(3.75)), &usage);
        let expected = (100.0 * 3.0 + 1000.0 * 0.3 + 400.0 * 3.75 + 20.0 * 15.0) / 1e6;
        assert!((cost - expected).abs() < 1e-12, "{cost} != {expected}");
        // Without cache prices every input token is charged at `prompt`, still once.
        let cost = cost_usd(&pricing(None, None), &usage);
        let expected = (1500.0 * 3.0 + 20.0 * 15.0) / 1e6;
        assert!((cost - expected).abs() < 1e-12, "{cost} != {expected}");
    }

    #[test]
    fn openai_cached_tokens_are_inside_the_prompt_tokens() {
        // Chat Completions and Responses count cached tokens inside the prompt's.
        let chat = usage_of(
            Dialect::OpenAiChat,
            r#"{"id":"c1","object":"chat.completion","created":1,"model":"m",
                "choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
                "usage":{"prompt_tokens":1100,"completion_tokens":20,"total_tokens":1120,
                         "prompt_tokens_details":{"cached_tokens":1000}}}"#,
        );
        let responses = usage_of(
            Dialect::OpenAiResponses,
            r#"{"id":"r1","object":"response","created_at":1,"model":"m","status":"completed",
                "output":[{"type":"message","id":"m1","role":"assistant","status":"completed",
                           "content":[{"type":"output_text","text":"hi","annotations":[]}]}],
                "usage":{"input_tokens":1100,"input_tokens_details":{"cached_tokens":1000},
                         "output_tokens":20,"total_tokens":1120}}"#,
        );
        let expected = (100.0 * 3.0 + 1000.0 * 0.3 + 20.0 * 15.0) / 1e6;
        for usage in [chat, responses] {
            assert_eq!(usage.input_tokens, 1100);
            let cost = cost_usd(&pricing(Some(0.3), None), &usage);
            assert!((cost - expected).abs() < 1e-12, "{cost} != {expected}");
        }
    }

    /// An answered attempt at `m:a` (10 prompt tokens, 3 of them cached).
    fn answered(cost_usd: Option<f64>, served: bool, ended: bool) -> AttemptRecord {
        AttemptRecord {
            endpoint_id: "m:a".into(),
            provider: "openai_compat",
            status: 200,
            error_type: None,
            hedge: false,
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 3,
            cache_write_tokens: 1,
            cost_usd,
            latency_ms: 1.0,
            position: 0,
            served,
            ended,
            started: Instant::now(),
        }
    }

    #[test]
    fn a_request_costs_the_sum_of_its_priced_attempts() {
        let record = |cost_usd, served| answered(cost_usd, served, true);
        let summary = summarize(&[
            record(Some(0.25), false),
            record(None, false),
            record(Some(0.5), true),
        ]);
        assert_eq!(summary.cost_usd, Some(0.75));
        assert_eq!(summary.cached_tokens, Some(3));
        let json: serde_json::Value =
            serde_json::from_str(summary.json.as_deref().unwrap()).unwrap();
        assert_eq!(json.as_array().map(Vec::len), Some(3));
        assert_eq!(json[1]["cost_usd"], serde_json::Value::Null);
        assert!(json[0].get("position").is_none());
        // No priced upstream: no cost, rather than a cost of 0.
        assert_eq!(summarize(&[record(None, true)]).cost_usd, None);
        assert_eq!(summarize(&[]), AttemptSummary::default());
    }

    #[test]
    fn the_summary_read_in_place_is_the_summary_of_the_records() {
        let record = |ended, served| answered(Some(0.25), served, ended);
        let log = AttemptLog::default();
        log.0
            .lock()
            .extend([record(true, false), record(true, true)]);
        assert_eq!(log.summary(), summarize(&log.records()));
        assert_eq!(log.summary().cost_usd, Some(0.5));
        // One still running shows as cancelled, as `records` has it, and the log keeps it running.
        log.0.lock().push(record(false, false));
        let summary = log.summary();
        assert!(
            summary.json.as_deref().unwrap().contains(CANCELLED),
            "{summary:?}"
        );
        assert!(!log.0.lock()[2].ended);
    }

    #[test]
    fn the_attempt_log_is_written_as_serde_would_write_it() {
        let record = |endpoint_id: &str, error_type, cost_usd, latency_ms| AttemptRecord {
            endpoint_id: endpoint_id.into(),
            provider: "anthropic",
            status: 529,
            error_type,
            hedge: true,
            prompt_tokens: u32::MAX,
            completion_tokens: 0,
            cached_tokens: 7,
            cache_write_tokens: 1,
            cost_usd,
            latency_ms,
            position: 3,
            served: false,
            ended: true,
            started: Instant::now(),
        };
        let records = [
            record("m:a", None, None, 0.499_024_999_999_999_94),
            // Escapes in the id, a non-finite cost and latency (written as null by both).
            record(
                "m:\"quoted\"\\\u{1}\u{e9}",
                Some(CANCELLED),
                Some(f64::NAN),
                f64::INFINITY,
            ),
            record("m:b", Some("http_status"), Some(1e-7), 1e21),
        ];
        for n in 1..=records.len() {
            assert_eq!(
                attempts_json(&records[..n]),
                serde_json::to_string(&records[..n]).unwrap()
            );
        }
    }
}
