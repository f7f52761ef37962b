//! The `rate-limit` plugin at admission: a route's limits (see [`crate::entity::RateLimitConfig`])
//! become charges against a [`LimitStore`] before any upstream is contacted; a refusal is a 429
//! in the client's dialect with `Retry-After` and the `x-ratelimit-*` headers, and an admitted
//! request holds an [`Admitted`] that corrects its token charge to the upstream's usage and
//! gives its concurrency slots back when dropped (also when the client goes away mid-stream).
//!
//! Requests per minute and tokens per minute are GCRA ([`gcra`]); tokens are charged at
//! admission by the prompt estimate (characters / 4, 85 per image: the same estimate prefill
//! accounting uses) and reconciled when the answer ends.

pub mod gcra;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::entity::{LimitScope, RateLimitConfig};
pub use store::{Charge, InProcessLimits, LimitKind, LimitStore, Refusal, Standing};

/// Who and what a request is, as far as scopes care.
pub struct Subject<'a> {
    /// The inbound route's id: every counter belongs to one route's plugin.
    pub route_id: &'a str,
    pub consumer_id: Option<&'a str>,
    pub key_id: Option<&'a str>,
    /// The groups of the caller's consumer.
    pub consumer_groups: &'a [String],
    /// The caller identity (`key:…`, `grant:…`, `ip:…`): stands in for a consumer or key when
    /// the route authenticates none.
    pub caller: Option<&'a str>,
    /// The canonical model id, for `per_model` limits.
    pub model: &'a str,
}

/// Names one limit of a config the way the request log and the metric do: `consumer:rpm`,
/// `api_key:per_model:tpm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitName {
    pub scope: LimitScope,
    pub per_model: bool,
    pub kind: LimitKind,
}

impl std::fmt::Display for LimitName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per_model = if self.per_model { ":per_model" } else { "" };
        write!(
            f,
            "{}{per_model}:{}",
            self.scope.as_str(),
            self.kind.as_str()
        )
    }
}

/// The charges one request makes under `config`, with the name of the limit behind each.
pub fn charges(
    config: &RateLimitConfig,
    subject: &Subject<'_>,
    prompt_tokens: u32,
) -> Vec<(LimitName, Charge)> {
    let anonymous = subject.caller.unwrap_or("none");
    let mut out = Vec::with_capacity(config.limits.len() * 2);
    for limit in &config.limits {
        // Counters of one route, one scope value and (per_model) one model.
        let mut subjects: Vec<String> = match limit.scope {
            LimitScope::Consumer => vec![match subject.consumer_id {
                Some(id) => ["consumer=", id].concat(),
                None => ["caller=", anonymous].concat(),
            }],
            LimitScope::ApiKey => vec![match subject.key_id {
                Some(id) => ["key=", id].concat(),
                None => ["caller=", anonymous].concat(),
            }],
            LimitScope::ConsumerGroup if subject.consumer_groups.is_empty() => {
                vec![format!("group={}", crate::config::DEFAULT_GROUP)]
            }
            LimitScope::ConsumerGroup => subject
                .consumer_groups
                .iter()
                .map(|g| format!("group={g}"))
                .collect(),
            LimitScope::Route => vec!["route".to_owned()],
        };
        if limit.per_model {
            for s in &mut subjects {
                s.push_str("|model=");
                s.push_str(subject.model);
            }
        }
        for (kind, value, amount) in [
            (LimitKind::Requests, limit.requests_per_minute, 1),
            (
                LimitKind::Tokens,
                limit.tokens_per_minute,
                u64::from(prompt_tokens),
            ),
            (LimitKind::Concurrent, limit.concurrent_requests, 1),
        ] {
            let Some(value) = value else { continue };
            let name = LimitName {
                scope: limit.scope,
                per_model: limit.per_model,
                kind,
            };
            for s in &subjects {
                // Joined, not formatted: a `format!` per counter was a fifth of a limited
                // request's admission (`concat` sizes the string once, as the subjects above).
                let key = ["rl|", subject.route_id, "|", s, "|", kind.as_str()].concat();
                out.push((
                    name,
                    Charge {
                        key,
                        kind,
                        limit: value,
                        amount,
                    },
                ));
            }
        }
    }
    out
}

/// The `x-ratelimit-*` values of an answer: for requests and for tokens, the counter with the
/// least left (the one that refuses first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    pub requests: Option<Standing>,
    pub tokens: Option<Standing>,
}

impl RateHeaders {
    fn of(charges: &[(LimitName, Charge)], standings: &[Standing]) -> RateHeaders {
        let tightest = |kind: LimitKind| {
            charges
                .iter()
                .zip(standings)
                .filter(|((_, c), _)| c.kind == kind)
                .map(|(_, s)| *s)
                .min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset)))
        };
        RateHeaders {
            requests: tightest(LimitKind::Requests),
            tokens: tightest(LimitKind::Tokens),
        }
    }

    /// Adds the headers (OpenAI's names; reset as a duration such as `1.5s` or `6m0s`). Names
    /// are constants and numbers go straight into values: the names parsed from `format!`ed
    /// text and the values from `to_string()` cost 10,600 instructions a rate-limited request.
    pub fn apply(&self, headers: &mut HeaderMap) {
        const REQUESTS: [HeaderName; 3] = [
            HeaderName::from_static("x-ratelimit-limit-requests"),
            HeaderName::from_static("x-ratelimit-remaining-requests"),
            HeaderName::from_static("x-ratelimit-reset-requests"),
        ];
        const TOKENS: [HeaderName; 3] = [
            HeaderName::from_static("x-ratelimit-limit-tokens"),
            HeaderName::from_static("x-ratelimit-remaining-tokens"),
            HeaderName::from_static("x-ratelimit-reset-tokens"),
        ];
        for (standing, [limit, remaining, reset]) in
            [(self.requests, REQUESTS), (self.tokens, TOKENS)]
        {
            let Some(s) = standing else { continue };
            headers.insert(limit, HeaderValue::from(s.limit));
            headers.insert(remaining, HeaderValue::from(s.remaining));
            if let Ok(value) = HeaderValue::try_from(reset_text(s.reset)) {
                headers.insert(reset, value);
            }
        }
    }
}

/// A duration as OpenAI writes its reset headers: `250ms`, `1.5s`, `6m0s`. Seconds keep up to
/// three decimals (the nearest millisecond), without trailing zeros.
fn reset_text(d: Duration) -> String {
    let mut digits = itoa::Buffer::new();
    let mut text = String::with_capacity(16);
    let ms = d.as_millis();
    if ms < 1000 {
        text.push_str(digits.format(ms));
        text.push_str("ms");
    } else if ms < 60_000 {
        let rounded = (d.as_nanos() + 500_000) / 1_000_000;
        text.push_str(digits.format(rounded / 1000));
        let thousandths = rounded % 1000;
        if thousandths > 0 {
            text.push('.');
            // Three digits with their leading zeros, then without the trailing ones.
            let fraction = digits.format(1000 + thousandths);
            text.push_str(fraction[1..].trim_end_matches('0'));
        }
        text.push('s');
    } else {
        text.push_str(digits.format(ms / 60_000));
        text.push('m');
        text.push_str(digits.format((ms % 60_000) / 1000));
        text.push('s');
    }
    text
}

/// A request a limit refused: the 429's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    /// Which limit (`consumer:rpm`): the request log's `rate_limited_by` and the metric's label.
    pub limit: String,
    /// The client's message.
    pub message: String,
    /// `Retry-After`, whole seconds rounded up, at least 1.
    pub retry_after_seconds: u64,
    pub headers: RateHeaders,
}

/// A request every limit admitted. Dropping it ends its concurrency charges; [`Admitted::settle`]
/// first corrects its token charges to the upstream's usage.
pub struct Admitted {
    store: Arc<dyn LimitStore>,
    charges: Vec<Charge>,
    /// Tokens charged at admission (the prompt estimate).
    estimate: u32,
    pub headers: RateHeaders,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("charges", &self.charges)
            .field("estimate", &self.estimate)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl Admitted {
    /// The answer ended: `prompt_tokens` and `completion_tokens` are the upstream's usage (0
    /// where it reported none: an unreported prompt keeps its estimate). Charges or refunds the
    /// difference from the estimate on every token limit.
    pub fn settle(self, prompt_tokens: u32, completion_tokens: u32) {
        let prompt = if prompt_tokens > 0 {
            prompt_tokens
        } else {
            self.estimate
        };
        let used = i64::from(prompt) + i64::from(completion_tokens);
        self.correct(used - i64::from(self.estimate));
    }

    /// No upstream served the request (every attempt failed): its tokens are given back.
    pub fn refund(self) {
        self.correct(-i64::from(self.estimate));
    }

    fn correct(&self, delta: i64) {
        for c in self.charges.iter().filter(|c| c.kind == LimitKind::Tokens) {
            self.store.reconcile(c, delta);
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        for c in self
            .charges
            .iter()
            .filter(|c| c.kind == LimitKind::Concurrent)
        {
            self.store.release(c);
        }
    }
}

/// Checks and reserves every limit of `config` for one request.
pub async fn admit(
    store: &Arc<dyn LimitStore>,
    config: &RateLimitConfig,
    subject: &Subject<'_>,
    prompt_tokens: u32,
) -> Result<Admitted, RateLimited> {
    let named = charges(config, subject, prompt_tokens);
    let plain: Vec<Charge> = named.iter().map(|(_, c)| c.clone()).collect();
    match store.check_and_reserve(&plain).await {
        Ok(standings) => Ok(Admitted {
            headers: RateHeaders::of(&named, &standings),
            store: store.clone(),
            charges: plain,
            estimate: prompt_tokens,
        }),
        Err(refusal) => Err(refused(&named, &refusal)),
    }
}

fn refused(named: &[(LimitName, Charge)], refusal: &Refusal) -> RateLimited {
    let (name, charge) = &named[refusal.index.min(named.len().saturating_sub(1))];
    let retry_after_seconds = refusal.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let message = match (charge.kind, refusal.never) {
        (LimitKind::Tokens, true) => format!(
            "rate limit {name}: this request's {} estimated prompt tokens exceed the limit of {} \
             tokens per minute; it cannot be admitted",
            charge.amount, charge.limit
        ),
        (LimitKind::Requests, _) => format!(
            "rate limit {name} exceeded: {} requests per minute; retry in {retry_after_seconds} s",
            charge.limit
        ),
        (LimitKind::Tokens, false) => format!(
            "rate limit {name} exceeded: {} tokens per minute (this request: {} estimated \
             prompt tokens); retry in {retry_after_seconds} s",
            charge.limit, charge.amount
        ),
        (LimitKind::Concurrent, _) => format!(
            "rate limit {name} exceeded: {} concurrent requests; retry when one ends",
            charge.limit
        ),
    };
    RateLimited {
        limit: name.to_string(),
        message,
        retry_after_seconds,
        headers: RateHeaders::of(named, &refusal.standings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(v: serde_json::Value) -> RateLimitConfig {
        RateLimitConfig::from_value(&v).unwrap()
    }

    fn subject<'a>(consumer: Option<&'a str>, groups: &'a [String]) -> Subject<'a> {
        Subject {
            route_id: "rt_1",
            consumer_id: consumer,
            key_id: consumer.map(|_| "ck_1"),
            consumer_groups: groups,
            caller: Some("ip:10.0.0.1"),
            model: "m1",
        }
    }

    #[test]
    fn scopes_pick_their_counters() {
        let c = config(json!({"limits": [
            {"scope": "consumer", "requests_per_minute": 5, "tokens_per_minute": 100},
            {"scope": "api_key", "per_model": true, "concurrent_requests": 2},
            {"scope": "consumer_group", "requests_per_minute": 50},
            {"scope": "route", "concurrent_requests": 9},
        ]}));
        let groups = vec!["a".to_owned(), "b".to_owned()];
        let keys: Vec<(String, String, u64)> = charges(&c, &subject(Some("cs_1"), &groups), 42)
            .into_iter()
            .map(|(n, ch)| (n.to_string(), ch.key, ch.amount))
            .collect();
        let expect = |n: &str, k: &str, a: u64| (n.to_owned(), k.to_owned(), a);
        assert_eq!(
            keys,
            vec![
                expect("consumer:rpm", "rl|rt_1|consumer=cs_1|rpm", 1),
                expect("consumer:tpm", "rl|rt_1|consumer=cs_1|tpm", 42),
                expect(
                    "api_key:per_model:concurrency",
                    "rl|rt_1|key=ck_1|model=m1|concurrency",
                    1
                ),
                expect("consumer_group:rpm", "rl|rt_1|group=a|rpm", 1),
                expect("consumer_group:rpm", "rl|rt_1|group=b|rpm", 1),
                expect("route:concurrency", "rl|rt_1|route|concurrency", 1),
            ]
        );
        // Without a consumer: the caller identity, and the default group.
        let anon: Vec<String> = charges(&c, &subject(None, &[]), 1)
            .into_iter()
            .map(|(_, ch)| ch.key)
            .collect();
        assert_eq!(anon[0], "rl|rt_1|caller=ip:10.0.0.1|rpm");
        assert_eq!(anon[2], "rl|rt_1|caller=ip:10.0.0.1|model=m1|concurrency");
        assert_eq!(anon[3], "rl|rt_1|group=default|rpm");
    }

    #[test]
    fn reset_is_written_as_openai_does() {
        assert_eq!(reset_text(Duration::from_millis(250)), "250ms");
        assert_eq!(reset_text(Duration::from_millis(1500)), "1.5s");
        assert_eq!(reset_text(Duration::from_secs(20)), "20s");
        assert_eq!(reset_text(Duration::from_secs(360)), "6m0s");
        for (d, text) in [
            (Duration::ZERO, "0ms"),
            (Duration::from_micros(999_999), "999ms"),
            (Duration::from_millis(1000), "1s"),
            (Duration::from_millis(1005), "1.005s"),
            (Duration::from_millis(1050), "1.05s"),
            (Duration::from_micros(1_999_600), "2s"),
            (Duration::from_micros(59_999_400), "59.999s"),
            (Duration::from_millis(60_000), "1m0s"),
            (Duration::from_millis(3_599_999), "59m59s"),
        ] {
            assert_eq!(reset_text(d), text, "{d:?}");
        }
    }

    #[test]
    fn headers_carry_openai_names_and_values() {
        let headers = RateHeaders {
            requests: Some(Standing {
                limit: 60,
                remaining: 59,
                reset: Duration::from_millis(1500),
            }),
            tokens: Some(Standing {
                limit: 1_000_000,
                remaining: 0,
                reset: Duration::from_secs(360),
            }),
        };
        let mut map = HeaderMap::new();
        headers.apply(&mut map);
        let written: Vec<(&str, &str)> = map
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("?")))
            .collect();
        assert_eq!(
            written,
            [
                ("x-ratelimit-limit-requests", "60"),
                ("x-ratelimit-remaining-requests", "59"),
                ("x-ratelimit-reset-requests", "1.5s"),
                ("x-ratelimit-limit-tokens", "1000000"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ]
        );
        let mut only_requests = HeaderMap::new();
        RateHeaders {
            tokens: None,
            ..headers
        }
        .apply(&mut only_requests);
        assert_eq!(only_requests.len(), 3);
        assert!(!only_requests.contains_key("x-ratelimit-limit-tokens"));
    }

    #[tokio::test]
    async fn admission_refuses_the_request_after_the_limit_and_settles_tokens() {
        let store: Arc<dyn LimitStore> = Arc::new(InProcessLimits::default());
        let c = config(json!({"limits": [
            {"scope": "consumer", "requests_per_minute": 2, "tokens_per_minute": 100},
            {"scope": "route", "concurrent_requests": 1},
        ]}));
        let who = subject(Some("cs_1"), &[]);
        let first = admit(&store, &c, &who, 10).await.unwrap();
        assert_eq!(first.headers.requests.unwrap().remaining, 1);
        assert_eq!(first.headers.tokens.unwrap().remaining, 90);
        // The route's one slot is taken until `first` ends.
        let busy = admit(&store, &c, &who, 10).await.unwrap_err();
        assert_eq!(busy.limit, "route:concurrency");
        assert_eq!(busy.retry_after_seconds, 1);
        // 10 estimated, 5 + 45 used: 40 more tokens are charged.
        first.settle(5, 45);
        let second = admit(&store, &c, &who, 10).await.unwrap();
        assert_eq!(second.headers.tokens.unwrap().remaining, 40);
        assert_eq!(second.headers.requests.unwrap().remaining, 0);
        second.refund();
        let third = admit(&store, &c, &who, 10).await.unwrap_err();
        assert_eq!(third.limit, "consumer:rpm");
        assert_eq!(third.retry_after_seconds, 30, "one request every 30 s");
        assert_eq!(third.headers.requests.unwrap().remaining, 0);
        assert_eq!(
            third.headers.tokens.unwrap().remaining,
            50,
            "the refund gave 10 back"
        );
        let mut h = HeaderMap::new();
        third.headers.apply(&mut h);
        assert_eq!(h["x-ratelimit-limit-requests"], "2");
        assert_eq!(h["x-ratelimit-remaining-requests"], "0");
        assert_eq!(h["x-ratelimit-limit-tokens"], "100");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "50");
        assert!(h.contains_key("x-ratelimit-reset-tokens"));
        // Another consumer has its own counters (the route's slot is free again).
        let other = subject(Some("cs_2"), &[]);
        assert!(admit(&store, &c, &other, 10).await.is_ok());
        // A prompt larger than the whole limit can never pass.
        let huge = admit(&store, &c, &subject(Some("cs_3"), &[]), 101)
            .await
            .unwrap_err();
        assert!(
            huge.message.contains("cannot be admitted"),
            "{}",
            huge.message
        );
    }
}
