//! Budgets: how much a consumer, or every consumer of a group together, may spend (USD at the
//! upstreams' `pricing`) per period, and what happens past it.
//!
//! Unlike the other entities, a budget's timestamps are Unix **milliseconds** (`created_at_ms`,
//! `updated_at_ms`), like the request log's `created_at_ms` it is measured against.

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{InvalidField, invalid, require_text, set};

/// Whose spend a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetScope {
    /// One consumer: `subject` is its id.
    Consumer,
    /// Every consumer of a consumer group together: `subject` is the group's name (`default`
    /// holds the consumers without groups, as for rate limits).
    Group,
}

impl BudgetScope {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetScope::Consumer => "consumer",
            BudgetScope::Group => "group",
        }
    }
}

/// The period a budget's spend is counted over, in UTC. At its end the spend starts again at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    /// From 00:00 UTC.
    Day,
    /// From Monday 00:00 UTC.
    Week,
    /// From the 1st of the month, 00:00 UTC.
    Month,
    /// Never starts again: all of the subject's spend in the request log counts.
    Never,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
            BudgetPeriod::Never => "never",
        }
    }

    /// The period that holds `now_ms` (Unix ms): its start and, unless it is `never`, its end
    /// (exclusive), both Unix ms. `never` starts at 0.
    pub fn bounds(self, now_ms: i64) -> (i64, Option<i64>) {
        let now = DateTime::<Utc>::from_timestamp_millis(now_ms).unwrap_or_default();
        let today = now.date_naive();
        let (start, end) = match self {
            BudgetPeriod::Never => return (0, None),
            BudgetPeriod::Day => (today, today.checked_add_days(Days::new(1))),
            BudgetPeriod::Week => {
                let back = u64::from(today.weekday().num_days_from_monday());
                let monday = today.checked_sub_days(Days::new(back)).unwrap_or(today);
                (monday, monday.checked_add_days(Days::new(7)))
            }
            BudgetPeriod::Month => {
                let first = today.with_day(1).unwrap_or(today);
                (first, first.checked_add_months(Months::new(1)))
            }
        };
        (midnight_ms(start), end.map(midnight_ms))
    }
}

fn midnight_ms(day: NaiveDate) -> i64 {
    day.and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc().timestamp_millis())
        .unwrap_or(0)
}

/// What a budget does once spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetMode {
    /// Requests are refused (402) until the period ends or the limit is raised.
    #[default]
    Hard,
    /// Requests are served; crossing the limit is logged (once per period) and counted.
    Soft,
}

impl BudgetMode {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetMode::Hard => "hard",
            BudgetMode::Soft => "soft",
        }
    }
}

/// A spending limit for a consumer or a consumer group. One per (scope, subject).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Budget {
    pub id: String,
    pub scope: BudgetScope,
    /// A consumer id (`scope: consumer`) or a consumer group's name (`scope: group`).
    pub subject: String,
    pub period: BudgetPeriod,
    pub mode: BudgetMode,
    /// USD per period; > 0.
    pub limit_usd: f64,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Unix milliseconds.
    pub updated_at_ms: i64,
}

impl Budget {
    pub fn validate(&self) -> Result<(), InvalidField> {
        require_text("subject", &self.subject, 128)?;
        if !self.limit_usd.is_finite() || self.limit_usd <= 0.0 {
            return Err(invalid(
                "limit_usd",
                format!("must be a number > 0, got {}", self.limit_usd),
            ));
        }
        Ok(())
    }

    /// `consumer:cs_…`, `group:gold`: how messages name what the budget is for.
    pub fn describe(&self) -> String {
        format!("{}:{}", self.scope.as_str(), self.subject)
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewBudget {
    pub scope: BudgetScope,
    /// A consumer id (it must exist) or a consumer group's name.
    pub subject: String,
    pub period: BudgetPeriod,
    /// `hard` (the default) or `soft`.
    #[serde(default)]
    pub mode: BudgetMode,
    /// USD per period; > 0.
    pub limit_usd: f64,
}

impl NewBudget {
    pub fn into_budget(self, id: String, now_ms: i64) -> Result<Budget, InvalidField> {
        let b = Budget {
            id,
            scope: self.scope,
            subject: self.subject,
            period: self.period,
            mode: self.mode,
            limit_usd: self.limit_usd,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        };
        b.validate()?;
        Ok(b)
    }
}

/// A change to a budget. What it is for (scope and subject) cannot change: that is a new budget.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetPatch {
    pub period: Option<BudgetPeriod>,
    pub mode: Option<BudgetMode>,
    pub limit_usd: Option<f64>,
}

impl BudgetPatch {
    pub fn apply(self, b: &mut Budget, now_ms: i64) -> Result<(), InvalidField> {
        set(&mut b.period, self.period);
        set(&mut b.mode, self.mode);
        set(&mut b.limit_usd, self.limit_usd);
        b.updated_at_ms = now_ms;
        b.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
            .timestamp_millis()
    }

    #[test]
    fn periods_start_at_utc_midnight_of_their_first_day() {
        // Wednesday 2026-12-02, 07:40:17.5 UTC.
        let now = ms("2026-12-02T07:40:17.500Z");
        assert_eq!(
            BudgetPeriod::Day.bounds(now),
            (ms("2026-12-02T00:00:00Z"), Some(ms("2026-12-03T00:00:00Z")))
        );
        assert_eq!(
            BudgetPeriod::Week.bounds(now),
            (ms("2026-11-30T00:00:00Z"), Some(ms("2026-12-07T00:00:00Z")))
        );
        assert_eq!(
            BudgetPeriod::Month.bounds(now),
            (ms("2026-12-01T00:00:00Z"), Some(ms("2027-01-01T00:00:00Z")))
        );
        assert_eq!(BudgetPeriod::Never.bounds(now), (0, None));
    }

    #[test]
    fn a_period_holds_its_start_and_not_its_end() {
        let midnight = ms("2026-12-07T00:00:00Z"); // a Monday
        assert_eq!(BudgetPeriod::Day.bounds(midnight).0, midnight);
        assert_eq!(BudgetPeriod::Week.bounds(midnight).0, midnight);
        assert_eq!(
            BudgetPeriod::Week.bounds(midnight - 1),
            (ms("2026-11-30T00:00:00Z"), Some(midnight))
        );
        assert_eq!(
            BudgetPeriod::Day.bounds(midnight - 1),
            (ms("2026-12-06T00:00:00Z"), Some(midnight))
        );
        // Sunday late is still the week that began on Monday.
        assert_eq!(
            BudgetPeriod::Week.bounds(ms("2026-12-06T23:59:59Z")).0,
            ms("2026-11-30T00:00:00Z")
        );
    }

    #[test]
    fn months_have_their_own_lengths_and_december_ends_in_january() {
        for (now, start, end) in [
            (
                "2027-02-14T12:00:00Z",
                "2027-02-01T00:00:00Z",
                "2027-03-01T00:00:00Z",
            ),
            (
                "2028-02-29T23:59:59Z",
                "2028-02-01T00:00:00Z",
                "2028-03-01T00:00:00Z",
            ),
            (
                "2027-04-30T10:00:00Z",
                "2027-04-01T00:00:00Z",
                "2027-05-01T00:00:00Z",
            ),
            (
                "2027-01-31T10:00:00Z",
                "2027-01-01T00:00:00Z",
                "2027-02-01T00:00:00Z",
            ),
            (
                "2026-12-31T23:59:59.999Z",
                "2026-12-01T00:00:00Z",
                "2027-01-01T00:00:00Z",
            ),
        ] {
            assert_eq!(
                BudgetPeriod::Month.bounds(ms(now)),
                (ms(start), Some(ms(end))),
                "{now}"
            );
        }
        // The last day and week of a year end in the next one.
        assert_eq!(
            BudgetPeriod::Day.bounds(ms("2026-12-31T18:00:00Z")).1,
            Some(ms("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            BudgetPeriod::Week.bounds(ms("2026-12-31T18:00:00Z")),
            (ms("2026-12-28T00:00:00Z"), Some(ms("2027-01-04T00:00:00Z")))
        );
        assert_eq!(
            BudgetPeriod::Month.bounds(ms("2027-01-01T00:00:00Z")).0,
            ms("2027-01-01T00:00:00Z")
        );
    }

    fn new(limit_usd: f64, subject: &str) -> NewBudget {
        NewBudget {
            scope: BudgetScope::Consumer,
            subject: subject.into(),
            period: BudgetPeriod::Day,
            mode: BudgetMode::Hard,
            limit_usd,
        }
    }

    #[test]
    fn validation_names_the_field() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = new(bad, "cs_1").into_budget("b".into(), 1).unwrap_err();
            assert_eq!(e.field, "limit_usd", "{bad}");
        }
        let e = new(1.0, " ").into_budget("b".into(), 1).unwrap_err();
        assert_eq!(e.field, "subject");
        let mut b = new(1.0, "cs_1").into_budget("b".into(), 1).unwrap();
        assert_eq!(b.mode, BudgetMode::Hard);
        let e = BudgetPatch {
            limit_usd: Some(-2.0),
            ..BudgetPatch::default()
        }
        .apply(&mut b, 2)
        .unwrap_err();
        assert_eq!(e.field, "limit_usd");
    }

    #[test]
    fn bodies_are_strict_and_mode_defaults_to_hard() {
        let b: NewBudget = serde_json::from_value(serde_json::json!(
            {"scope": "group", "subject": "gold", "period": "week", "limit_usd": 5}
        ))
        .unwrap();
        assert_eq!(
            (b.scope, b.period, b.mode),
            (BudgetScope::Group, BudgetPeriod::Week, BudgetMode::Hard)
        );
        for bad in [
            serde_json::json!({"scope": "team", "subject": "x", "period": "day", "limit_usd": 1}),
            serde_json::json!({"scope": "group", "subject": "x", "period": "year", "limit_usd": 1}),
            serde_json::json!({"scope": "group", "subject": "x", "period": "day", "limit_usd": 1, "extra": 1}),
        ] {
            assert!(
                serde_json::from_value::<NewBudget>(bad.clone()).is_err(),
                "{bad}"
            );
        }
        // What a budget is for cannot be patched.
        assert!(
            serde_json::from_value::<BudgetPatch>(serde_json::json!({"subject": "y"})).is_err()
        );
    }
}
