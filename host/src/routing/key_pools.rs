//! Key pools: the upstream keys of one upstream (or one YAML route), each a candidate of its own,
//! tied together for reservations, quieting and key affinity.
//!
//! - **Reservations.** A key whose `min_role` is above the caller's role is invisible to that
//!   caller. Among the keys a caller may use, the most reserved come first, so an eligible caller
//!   drains its reserved capacity before the shared keys; ties keep declaration order, or the
//!   strategy's weighted order when the keys carry their own weights.
//! - **Quieting.** A key answered with 401, 402, 403 or 429 is out of rotation for a cooling
//!   period (`Retry-After` when the answer has one) and comes back by itself. A rejected key is
//!   the key's problem, not the upstream's: it does not count against the endpoint's health.
//! - **Exhaustion.** When no key of a pool is usable the pool is exhausted: its endpoint is charged
//!   one failure (a pool nobody can use is a failing upstream). When the only usable keys are
//!   reserved above the caller (`KeyPoolRoleRestricted`), nothing is charged: nothing was sent and
//!   the endpoint still serves the tiers that own the keys.
//! - **Key affinity.** (caller, pool) → key for five minutes, valid only for the role that made
//!   it, so prompt caches stay warm. Traffic never drops a binding; a quieted bound key is walked
//!   around and kept. A change of the pool's declarations drops exactly the bindings whose
//!   preferred key changed, and bindings to keys that left the pool.
//!
//! Requests without a user identity carry no role and may use every key.
//!
//! In a fleet, quieted keys and new bindings are announced to the other replicas
//! ([`super::peers::Peers`]), which apply them with [`KeyPools::apply_remote_quiet`] and
//! [`KeyPools::apply_remote_bind`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::{ModelUpstream, PoolKey};
use crate::entity::Role;

/// Key-pool knobs.
#[derive(Debug, Clone, Copy)]
pub struct KeyPoolConfig {
    /// Keep a caller on the key it used last (per pool).
    pub affinity_enabled: bool,
    pub affinity_ttl: Duration,
    /// Quiet period after a 429 without `Retry-After`.
    pub rate_limited_quiet: Duration,
    /// Quiet period after a 401/402/403 without `Retry-After`.
    pub rejected_quiet: Duration,
}

impl Default for KeyPoolConfig {
    fn default() -> Self {
        Self {
            affinity_enabled: true,
            affinity_ttl: Duration::from_secs(300),
            rate_limited_quiet: Duration::from_secs(30),
            rejected_quiet: Duration::from_secs(300),
        }
    }
}

/// Whether an upstream status says "this key", not "this upstream".
pub fn is_key_rejection(status: u16) -> bool {
    matches!(status, 401 | 402 | 403 | 429)
}

/// A key out of rotation.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Quiet {
    #[serde(skip)]
    pub until: Instant,
    pub status: u16,
}

#[derive(Debug, Clone)]
struct Binding {
    fingerprint: String,
    role: Option<Role>,
    expires: Instant,
}

/// One pool's declarations: (fingerprint, min_role) in declaration order.
type Declarations = Vec<(String, Role)>;

/// The process's key-pool state.
#[derive(Debug)]
pub struct KeyPools {
    config: KeyPoolConfig,
    /// By key fingerprint: a credential is quieted wherever it is configured.
    quiet: Mutex<HashMap<String, Quiet>>,
    bindings: Mutex<HashMap<(Arc<str>, String), Binding>>,
    declarations: Mutex<HashMap<String, Declarations>>,
    /// Bumped whenever a pool's declarations change.
    generation: AtomicU64,
    peers: OnceLock<Arc<dyn super::peers::Peers>>,
}

/// How one pool stands for one request.
#[derive(Debug, Default, Clone, Copy)]
pub struct PoolTally {
    pub usable: usize,
    /// Reserved above the caller and not quieted: the pool could still serve a higher tier.
    pub role_restricted: usize,
    pub quieted: usize,
}

impl KeyPools {
    pub fn new(config: KeyPoolConfig) -> Self {
        Self {
            config,
            quiet: Mutex::new(HashMap::new()),
            bindings: Mutex::new(HashMap::new()),
            declarations: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            peers: OnceLock::new(),
        }
    }

    /// Announces quieted keys and new bindings to `peers` from now on.
    pub fn set_peers(&self, peers: Arc<dyn super::peers::Peers>) {
        let _ = self.peers.set(peers);
    }

    /// Another replica quieted the key `fingerprint` until `until`.
    pub fn apply_remote_quiet(&self, fingerprint: &str, status: u16, until: Instant) {
        let mut quiet = self.quiet.lock();
        if quiet.get(fingerprint).is_none_or(|q| q.until < until) {
            quiet.insert(fingerprint.to_owned(), Quiet { until, status });
        }
    }

    /// Another replica bound `caller` to `fingerprint` in `pool`. Ignored unless this process
    /// declares that key in that pool (the replicas' declarations may differ for a moment).
    pub fn apply_remote_bind(
        &self,
        caller: &str,
        pool: &str,
        fingerprint: &str,
        role: Option<Role>,
        expires: Instant,
    ) {
        if !self.config.affinity_enabled {
            return;
        }
        let declared = self
            .declarations
            .lock()
            .get(pool)
            .is_some_and(|keys| keys.iter().any(|(f, _)| f == fingerprint));
        if !declared {
            return;
        }
        self.bindings.lock().insert(
            (Arc::from(caller), pool.to_owned()),
            Binding {
                fingerprint: fingerprint.to_owned(),
                role,
                expires,
            },
        );
    }

    /// The declarations' generation; see [`KeyPools::bind`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn config(&self) -> KeyPoolConfig {
        self.config
    }

    /// Whether a caller of `role` may spend a key reserved for `min_role` (no role: unrestricted).
    pub fn visible(min_role: Role, role: Option<Role>) -> bool {
        role.is_none_or(|r| r >= min_role)
    }

    /// The key's quiet period, if it is still running at `now`.
    pub fn quiet_until(&self, fingerprint: &str, now: Instant) -> Option<Quiet> {
        let mut quiet = self.quiet.lock();
        match quiet.get(fingerprint) {
            Some(q) if q.until > now => Some(*q),
            Some(_) => {
                quiet.remove(fingerprint);
                None
            }
            None => None,
        }
    }

    /// Every declared pool with how many of its keys are quiet at `now` (for metrics). Takes one
    /// lock at a time.
    pub fn quiet_by_pool(&self, now: Instant) -> Vec<(String, usize)> {
        let pools: Vec<(String, Vec<String>)> = self
            .declarations
            .lock()
            .iter()
            .map(|(pool, keys)| (pool.clone(), keys.iter().map(|(f, _)| f.clone()).collect()))
            .collect();
        let quiet = self.quiet.lock();
        pools
            .into_iter()
            .map(|(pool, keys)| {
                let n = keys
                    .iter()
                    .filter(|f| quiet.get(*f).is_some_and(|q| q.until > now))
                    .count();
                (pool, n)
            })
            .collect()
    }

    /// Takes a key out of rotation after `status`, for `retry_after` or the default period.
    pub fn quiet(&self, key: &PoolKey, status: u16, retry_after: Option<Duration>, now: Instant) {
        let period = retry_after.unwrap_or(if status == 429 {
            self.config.rate_limited_quiet
        } else {
            self.config.rejected_quiet
        });
        tracing::info!(
            pool = %key.pool,
            key = %key.label,
            status,
            seconds = period.as_secs_f64(),
            "upstream key quieted"
        );
        self.quiet.lock().insert(
            key.fingerprint.clone(),
            Quiet {
                until: now + period,
                status,
            },
        );
        if let Some(peers) = self.peers.get() {
            peers.key_quieted(&key.fingerprint, status, period);
        }
    }

    /// The key (fingerprint) `caller` is bound to in `pool`, if the binding is live and was made
    /// for the same role.
    pub fn binding(
        &self,
        caller: &Arc<str>,
        pool: &str,
        role: Option<Role>,
        now: Instant,
    ) -> Option<String> {
        if !self.config.affinity_enabled {
            return None;
        }
        let bindings = self.bindings.lock();
        bindings
            .get(&(caller.clone(), pool.to_owned()))
            .filter(|b| b.expires > now && b.role == role)
            .map(|b| b.fingerprint.clone())
    }

    /// Binds `caller` to `fingerprint` in `pool` (refreshing the five minutes), unless the
    /// declarations changed since `generation` (the request chose under older declarations).
    pub fn bind(
        &self,
        caller: &Arc<str>,
        pool: &str,
        fingerprint: &str,
        role: Option<Role>,
        generation: u64,
        now: Instant,
    ) {
        if !self.config.affinity_enabled {
            return;
        }
        let mut bindings = self.bindings.lock();
        if self.generation() != generation {
            return;
        }
        if bindings.len() > 100_000 {
            bindings.retain(|_, b| b.expires > now);
        }
        bindings.insert(
            (caller.clone(), pool.to_owned()),
            Binding {
                fingerprint: fingerprint.to_owned(),
                role,
                expires: now + self.config.affinity_ttl,
            },
        );
        drop(bindings);
        if let Some(peers) = self.peers.get() {
            peers.key_bound(caller, pool, fingerprint, role, self.config.affinity_ttl);
        }
    }

    /// Records every pool's declarations from a new upstream table; bindings whose preferred key
    /// changed (or whose key left the pool) are dropped. Returns how many were dropped.
    pub fn update_declarations<'a>(
        &self,
        routes: impl Iterator<Item = &'a ModelUpstream>,
    ) -> usize {
        let mut next: HashMap<String, Declarations> = HashMap::new();
        for route in routes {
            if let Some(key) = &route.key {
                let pool = next.entry(key.pool.clone()).or_default();
                if !pool.iter().any(|(f, _)| *f == key.fingerprint) {
                    pool.push((key.fingerprint.clone(), route.min_role));
                }
            }
        }
        let mut declarations = self.declarations.lock();
        if *declarations == next {
            return 0;
        }
        // Under the bindings lock, so a bind made under the old declarations cannot slip in.
        let mut bindings = self.bindings.lock();
        self.generation.fetch_add(1, Ordering::AcqRel);
        let mut dropped = 0;
        bindings.retain(|(_, pool), binding| {
            let before = declarations.get(pool);
            let after = next.get(pool);
            if before == after {
                return true;
            }
            let keep = after.is_some_and(|a| {
                a.iter().any(|(f, _)| *f == binding.fingerprint)
                    && preferred(before, binding.role) == preferred(after, binding.role)
            });
            if !keep {
                dropped += 1;
            }
            keep
        });
        *declarations = next;
        dropped
    }
}

/// The key a caller of `role` would get first from `declarations`: the most reserved it may use,
/// then declaration order.
fn preferred(declarations: Option<&Declarations>, role: Option<Role>) -> Option<String> {
    let mut best: Option<&(String, Role)> = None;
    for d in declarations?.iter() {
        if KeyPools::visible(d.1, role) && best.is_none_or(|b| d.1 > b.1) {
            best = Some(d);
        }
    }
    best.map(|(f, _)| f.clone())
}

/// Reorders the keys of each pool within the positions the strategy gave that pool: the caller's
/// bound key first, then the most reserved, ties in declaration order (or kept as the strategy
/// ordered them when the keys carry their own weights). Positions of routes without a key do not
/// move, so the strategy still decides which upstream is tried when.
pub fn order_within_pools(
    routes: &[ModelUpstream],
    order: &mut [usize],
    bound: &dyn Fn(&str) -> Option<String>,
) {
    let mut pools: Vec<&str> = Vec::new();
    for &p in order.iter() {
        if let Some(key) = routes.get(p).and_then(|r| r.key.as_ref())
            && !pools.contains(&key.pool.as_str())
        {
            pools.push(&key.pool);
        }
    }
    for pool in pools {
        let slots: Vec<usize> = (0..order.len())
            .filter(|&i| {
                routes
                    .get(order[i])
                    .and_then(|r| r.key.as_ref())
                    .is_some_and(|k| k.pool == pool)
            })
            .collect();
        let mut members: Vec<(usize, usize)> = slots.iter().map(|&i| (i, order[i])).collect();
        let bound = bound(pool);
        let rank = |position: usize, strategy_rank: usize| {
            let route = &routes[position];
            let key = route.key.as_ref();
            let is_bound = bound.is_some() && key.map(|k| &k.fingerprint) == bound.as_ref();
            let tie = match key {
                Some(k) if !k.weighted => k.slot,
                _ => strategy_rank,
            };
            (!is_bound, std::cmp::Reverse(route.min_role), tie)
        };
        members.sort_by_key(|&(strategy_rank, position)| rank(position, strategy_rank));
        for (slot, (_, position)) in slots.iter().zip(members) {
            order[*slot] = position;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;

    fn route(index: u32, pool: &str, slot: usize, secret: &str, min_role: Role) -> ModelUpstream {
        ModelUpstream {
            index,
            endpoint_id: format!("m:{pool}"),
            kind: ProviderKind::OpenaiCompat,
            base_url: "http://127.0.0.1:1/v1".into(),
            provider_model_id: "m".into(),
            api_key: Some(secret.into()),
            weight: 1.0,
            declared_weight: 1.0,
            weight_note: None,
            priority: 0,
            group: "default".into(),
            min_role,
            key: Some(PoolKey {
                pool: pool.into(),
                slot,
                fingerprint: format!("fp-{secret}"),
                label: format!("k{slot}"),
                weighted: false,
            }),
            input_modalities: vec!["text".into()],
            pricing: None,
            local_deployment: true,
            metadata: Default::default(),
            capabilities: vec![],
            stream_deadlines: Default::default(),
        }
    }

    #[test]
    fn roles_order_and_visibility() {
        assert!(
            Role::Admin > Role::Internal && Role::Internal > Role::Pro && Role::Pro > Role::Free
        );
        assert!(
            KeyPools::visible(Role::Pro, None),
            "no identity: unrestricted"
        );
        assert!(KeyPools::visible(Role::Free, Some(Role::Free)));
        assert!(!KeyPools::visible(Role::Pro, Some(Role::Free)));
        assert!(KeyPools::visible(Role::Pro, Some(Role::Internal)));
        assert_eq!(Role::parse(""), Role::Free);
        assert_eq!(Role::parse("PRO "), Role::Pro);
        assert_eq!(Role::parse("gold"), Role::Free);
    }

    #[test]
    fn most_reserved_first_then_declaration_order_within_the_pools_positions() {
        let routes = vec![
            route(0, "a", 0, "shared-1", Role::Free),
            route(1, "a", 1, "pro", Role::Pro),
            route(2, "b", 0, "other", Role::Free),
            route(3, "a", 2, "internal", Role::Internal),
            route(4, "a", 3, "shared-2", Role::Free),
        ];
        // The strategy put pool b second; pool a's keys fill the other positions.
        let mut order = vec![4, 2, 0, 3, 1];
        order_within_pools(&routes, &mut order, &|_| None);
        assert_eq!(order, vec![3, 2, 1, 0, 4]);
        // A bound key goes first in its pool.
        let mut order = vec![4, 2, 0, 3, 1];
        order_within_pools(&routes, &mut order, &|pool| {
            (pool == "a").then(|| "fp-shared-2".to_owned())
        });
        assert_eq!(order, vec![4, 2, 3, 1, 0]);
    }

    #[test]
    fn weighted_pools_keep_the_strategys_order_among_equals() {
        let mut routes = vec![
            route(0, "a", 0, "x", Role::Free),
            route(1, "a", 1, "y", Role::Free),
            route(2, "a", 2, "z", Role::Pro),
        ];
        for r in &mut routes {
            if let Some(k) = &mut r.key {
                k.weighted = true;
            }
        }
        let mut order = vec![1, 0, 2];
        order_within_pools(&routes, &mut order, &|_| None);
        assert_eq!(order, vec![2, 1, 0]);
    }

    #[test]
    fn quiet_keys_come_back_by_themselves() {
        let pools = KeyPools::new(KeyPoolConfig::default());
        let r = route(0, "a", 0, "s", Role::Free);
        let key = r.key.as_ref().unwrap();
        let now = Instant::now();
        pools.quiet(key, 429, Some(Duration::from_secs(2)), now);
        assert_eq!(
            pools.quiet_until(&key.fingerprint, now).map(|q| q.status),
            Some(429)
        );
        assert!(
            pools
                .quiet_until(&key.fingerprint, now + Duration::from_secs(3))
                .is_none()
        );
        pools.quiet(key, 401, None, now);
        assert!(
            pools
                .quiet_until(&key.fingerprint, now + Duration::from_secs(299))
                .is_some()
        );
    }

    #[test]
    fn declaration_changes_drop_exactly_the_bindings_whose_preferred_key_changed() {
        let pools = KeyPools::new(KeyPoolConfig::default());
        let now = Instant::now();
        let v1 = vec![
            route(0, "a", 0, "shared", Role::Free),
            route(1, "a", 1, "second", Role::Free),
            route(2, "b", 0, "b-only", Role::Free),
        ];
        pools.update_declarations(v1.iter());
        let (free, pro): (Arc<str>, Arc<str>) = (Arc::from("free-caller"), Arc::from("pro-caller"));
        pools.bind(
            &free,
            "a",
            "fp-second",
            Some(Role::Free),
            pools.generation(),
            now,
        );
        pools.bind(
            &pro,
            "a",
            "fp-shared",
            Some(Role::Pro),
            pools.generation(),
            now,
        );
        pools.bind(
            &free,
            "b",
            "fp-b-only",
            Some(Role::Free),
            pools.generation(),
            now,
        );
        // Quieting is not a declaration change: nothing dropped.
        pools.quiet(v1[1].key.as_ref().unwrap(), 429, None, now);
        assert_eq!(pools.update_declarations(v1.iter()), 0);
        assert!(pools.binding(&free, "a", Some(Role::Free), now).is_some());
        // A role mismatch does not use the binding.
        assert!(pools.binding(&free, "a", Some(Role::Pro), now).is_none());

        // A pro key is added to pool a: the pro caller's preferred key changes (dropped); the
        // free caller's does not (kept); pool b is untouched.
        let mut v2 = v1.clone();
        v2.push(route(3, "a", 2, "reserved", Role::Pro));
        let chosen_under = pools.generation();
        assert_eq!(pools.update_declarations(v2.iter()), 1);
        assert!(pools.binding(&pro, "a", Some(Role::Pro), now).is_none());
        // A request that chose under the old declarations cannot bring the binding back.
        pools.bind(&pro, "a", "fp-shared", Some(Role::Pro), chosen_under, now);
        assert!(pools.binding(&pro, "a", Some(Role::Pro), now).is_none());
        assert_eq!(
            pools.binding(&free, "a", Some(Role::Free), now).as_deref(),
            Some("fp-second")
        );
        assert!(pools.binding(&free, "b", Some(Role::Free), now).is_some());

        // The bound key is removed: its binding goes.
        let v3: Vec<ModelUpstream> = v2.iter().filter(|r| r.index != 1).cloned().collect();
        assert_eq!(pools.update_declarations(v3.iter()), 1);
        assert!(pools.binding(&free, "a", Some(Role::Free), now).is_none());
        // Bindings expire after five minutes.
        pools.bind(
            &free,
            "b",
            "fp-b-only",
            Some(Role::Free),
            pools.generation(),
            now,
        );
        assert!(
            pools
                .binding(&free, "b", Some(Role::Free), now + Duration::from_secs(301))
                .is_none()
        );
    }
}
