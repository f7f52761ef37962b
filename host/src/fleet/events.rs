//! What replicas tell each other: one JSON message per change on the fleet's channel, and the same
//! change kept as a Redis key with the change's own expiry, so a replica that starts (or comes
//! back after Redis did) reads the state the others built.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::entity::Role;
use crate::routing::RoutingContext;

/// One change of shared routing state. Times are Unix milliseconds: replicas on different hosts
/// share a wall clock (NTP), not an `Instant`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    BreakerOpened {
        endpoint: String,
        until_ms: u64,
    },
    BreakerClosed {
        endpoint: String,
    },
    Pinned {
        caller: String,
        model: String,
        endpoint: String,
        until_ms: u64,
    },
    Unpinned {
        caller: String,
        model: String,
        endpoint: String,
    },
    Quieted {
        fingerprint: String,
        status: u16,
        until_ms: u64,
    },
    Bound {
        caller: String,
        pool: String,
        fingerprint: String,
        role: Option<Role>,
        until_ms: u64,
    },
}

/// A change as it travels: who made it, so its maker ignores its own echo.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub from: String,
    #[serde(flatten)]
    pub change: Change,
}

/// What a change does to its Redis record.
pub enum Record {
    /// Keep `key` (holding the message) until `until_ms`.
    Keep { key: String, until_ms: u64 },
    /// Delete `key`.
    Delete { key: String },
}

impl Change {
    /// The key this change is kept under, and whether it sets or removes it.
    pub fn record(&self, prefix: &str) -> Record {
        match self {
            Change::BreakerOpened { endpoint, until_ms } => Record::Keep {
                key: format!("{prefix}:breaker:{endpoint}"),
                until_ms: *until_ms,
            },
            Change::BreakerClosed { endpoint } => Record::Delete {
                key: format!("{prefix}:breaker:{endpoint}"),
            },
            Change::Pinned {
                caller,
                model,
                until_ms,
                ..
            } => Record::Keep {
                key: pin_key(prefix, model, caller),
                until_ms: *until_ms,
            },
            Change::Unpinned { caller, model, .. } => Record::Delete {
                key: pin_key(prefix, model, caller),
            },
            Change::Quieted {
                fingerprint,
                until_ms,
                ..
            } => Record::Keep {
                key: format!("{prefix}:quiet:{fingerprint}"),
                until_ms: *until_ms,
            },
            Change::Bound {
                caller,
                pool,
                until_ms,
                ..
            } => Record::Keep {
                key: format!("{prefix}:bind:{pool}\n{caller}"),
                until_ms: *until_ms,
            },
        }
    }

    /// Applies another replica's change to this process's state. Changes already expired are
    /// ignored.
    pub fn apply(&self, routing: &RoutingContext, now_ms: u64) {
        let at = |until_ms: u64| -> Option<Instant> {
            let left = until_ms.checked_sub(now_ms).filter(|&ms| ms > 0)?;
            Some(Instant::now() + Duration::from_millis(left))
        };
        match self {
            Change::BreakerOpened { endpoint, until_ms } => {
                if let Some(until) = at(*until_ms) {
                    routing.health.apply_remote_open(endpoint, until);
                }
            }
            Change::BreakerClosed { endpoint } => routing.health.apply_remote_close(endpoint),
            Change::Pinned {
                caller,
                model,
                endpoint,
                until_ms,
            } => {
                if let Some(until) = at(*until_ms) {
                    routing
                        .affinity
                        .apply_remote_pin(caller, model, endpoint, until);
                }
            }
            Change::Unpinned {
                caller,
                model,
                endpoint,
            } => routing.affinity.apply_remote_drop(caller, model, endpoint),
            Change::Quieted {
                fingerprint,
                status,
                until_ms,
            } => {
                if let Some(until) = at(*until_ms) {
                    routing.keys.apply_remote_quiet(fingerprint, *status, until);
                }
            }
            Change::Bound {
                caller,
                pool,
                fingerprint,
                role,
                until_ms,
            } => {
                if let Some(until) = at(*until_ms) {
                    routing
                        .keys
                        .apply_remote_bind(caller, pool, fingerprint, *role, until);
                }
            }
        }
    }
}

/// A session pin's key. Model ids and caller keys hold no newline, so the pair is unambiguous.
fn pin_key(prefix: &str, model: &str, caller: &str) -> String {
    format!("{prefix}:pin:{model}\n{caller}")
}

/// The patterns of every kept record, for a replica that (re)joins.
pub fn record_patterns(prefix: &str) -> [String; 4] {
    ["breaker", "pin", "quiet", "bind"].map(|kind| format!("{prefix}:{kind}:*"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_name_their_record() {
        let m = Message {
            from: "r1".into(),
            change: Change::Bound {
                caller: "key:ab".into(),
                pool: "p".into(),
                fingerprint: "fp".into(),
                role: Some(Role::Pro),
                until_ms: 10,
            },
        };
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains(r#""kind":"bound""#), "{json}");
        assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), m);
        match m.change.record("sy") {
            Record::Keep { key, until_ms } => {
                assert_eq!(key, "sy:bind:p\nkey:ab");
                assert_eq!(until_ms, 10);
            }
            Record::Delete { .. } => panic!("a binding is kept"),
        }
        let closed = Change::BreakerClosed {
            endpoint: "e".into(),
        };
        assert!(matches!(closed.record("sy"), Record::Delete { key } if key == "sy:breaker:e"));
    }

    #[test]
    fn expired_changes_are_not_applied() {
        let config = crate::config::Config::from_yaml(
            std::path::Path::new("fleet-test.yaml"),
            "models: []\n",
            &|_| None,
        )
        .unwrap();
        let routing = RoutingContext::new(&config);
        Change::BreakerOpened {
            endpoint: "e".into(),
            until_ms: 1_000,
        }
        .apply(&routing, 2_000);
        assert!(routing.health.admits("e", Instant::now()).is_some());
        Change::BreakerOpened {
            endpoint: "e".into(),
            until_ms: 60_000,
        }
        .apply(&routing, 2_000);
        assert!(routing.health.admits("e", Instant::now()).is_none());
    }
}
