//! The `rate-limit` plugin's counters on the fleet's Redis: one limit is one limit for the whole
//! fleet, not one per replica.
//!
//! A request's charges are decided by one Lua script, all or nothing, on Redis's own clock: rate
//! limits are the same GCRA as [`crate::server::rate_limit::gcra`] (a key's state is its TAT in
//! microseconds), concurrency limits are sorted sets of leased slots like the fleet's concurrency
//! pools ([`super::gate`]), renewed while the request runs and freed within one lease if a replica
//! dies holding them. Token corrections (`reconcile`) and releases go out in the background.
//!
//! When Redis is unreachable, or does not answer within the fleet's deadline, the request is
//! checked against this replica's own counters instead ([`InProcessLimits`]): limits hold per
//! replica until Redis is back, and the fallback is counted like the fleet's other decisions.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::Fleet;
use super::gate::SLOT_LEASE;
use crate::server::rate_limit::{
    Charge, InProcessLimits, LimitKind, LimitStore, Refusal, Standing,
};

/// Decides every charge, commits them only if all fit, and reports each counter's standing.
/// KEYS: one per charge. ARGV[1] lease ms, ARGV[2] slot member, then per charge: kind (`r` rate,
/// `c` concurrency), limit, amount. Returns {refusing charge (1-based, 0: admitted), retry after
/// µs, never (0/1), then remaining and reset µs per charge}.
const CHECK_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local window = 60000000
local lease = tonumber(ARGV[1])
local member = ARGV[2]
local n = #KEYS
local kinds, limits, amounts, tats = {}, {}, {}, {}
local refusing, retry, never = 0, 0, 0
for i = 1, n do
  kinds[i] = ARGV[3 * i]
  limits[i] = tonumber(ARGV[3 * i + 1])
  amounts[i] = tonumber(ARGV[3 * i + 2])
  if kinds[i] == 'r' then
    local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
    if tat < now then tat = now end
    local step = math.floor(amounts[i] * window / math.max(limits[i], 1))
    local new = tat + step
    if new <= now + window then
      tats[i] = new
    elseif refusing == 0 then
      refusing = i
      retry = new - (now + window)
      if step > window then never = 1 end
    end
  else
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now_ms)
    local held = redis.call('ZCARD', KEYS[i])
    if held + amounts[i] > limits[i] and refusing == 0 then
      refusing = i
      retry = 1000000
      if amounts[i] > limits[i] then never = 1 end
    end
  end
end
if refusing == 0 then
  for i = 1, n do
    if kinds[i] == 'r' then
      redis.call('SET', KEYS[i], string.format('%.0f', tats[i]), 'PX',
        math.floor((tats[i] - now) / 1000) + 1000)
    else
      for j = 1, amounts[i] do
        redis.call('ZADD', KEYS[i], now_ms + lease, member .. ':' .. j)
      end
      redis.call('PEXPIRE', KEYS[i], lease * 2)
    end
  end
end
local out = {refusing, retry, never}
for i = 1, n do
  if kinds[i] == 'r' then
    local tat = tats[i]
    if refusing ~= 0 or tat == nil then tat = tonumber(redis.call('GET', KEYS[i]) or '0') end
    if tat < now then tat = now end
    local room = now + window - tat
    if room < 0 then room = 0 end
    out[#out + 1] = math.floor(room * limits[i] / window)
    out[#out + 1] = tat - now
  else
    local held = redis.call('ZCARD', KEYS[i])
    local left = limits[i] - held
    if left < 0 then left = 0 end
    out[#out + 1] = left
    out[#out + 1] = 0
  end
end
return out
";

/// Moves a token counter's TAT by `delta` tokens (positive: charged past the limit if need be;
/// negative: given back, never beyond a full limit). KEYS[1]; ARGV[1] limit, ARGV[2] delta.
const RECONCILE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = 60000000
local limit = math.max(tonumber(ARGV[1]), 1)
local delta = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local step = math.floor(math.abs(delta) * window / limit)
if delta > 0 then
  if tat < now then tat = now end
  tat = tat + step
else
  tat = tat - step
  if tat < now then tat = now end
end
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1000)
return 1
";

/// The fleet's limit counters, with this replica's own as the fallback.
pub struct FleetLimits {
    fleet: Arc<Fleet>,
    local: InProcessLimits,
    check: redis::Script,
    reconcile: redis::Script,
    /// Slots this replica holds per concurrency counter (Redis key → members): any one of a
    /// counter's slots ends a request's charge, they are interchangeable.
    slots: Mutex<HashMap<String, Vec<String>>>,
    next_member: AtomicU64,
}

impl FleetLimits {
    pub fn new(fleet: Arc<Fleet>) -> FleetLimits {
        FleetLimits {
            fleet,
            local: InProcessLimits::default(),
            check: redis::Script::new(CHECK_SCRIPT),
            reconcile: redis::Script::new(RECONCILE_SCRIPT),
            slots: Mutex::new(HashMap::new()),
            next_member: AtomicU64::new(1),
        }
    }

    fn key(&self, charge: &Charge) -> String {
        self.fleet.key(&format!("limit:{}", charge.key))
    }

    /// The fleet's answer; `None` when Redis could not give one in time.
    async fn check_shared(&self, charges: &[Charge]) -> Option<Result<Vec<Standing>, Refusal>> {
        let member = format!(
            "{}:{}",
            self.fleet.replica,
            self.next_member.fetch_add(1, Ordering::Relaxed)
        );
        let mut call = self.check.prepare_invoke();
        for charge in charges {
            call.key(self.key(charge));
        }
        call.arg(SLOT_LEASE.as_millis() as u64).arg(&member);
        for charge in charges {
            call.arg(match charge.kind {
                LimitKind::Requests | LimitKind::Tokens => "r",
                LimitKind::Concurrent => "c",
            })
            .arg(charge.limit)
            .arg(charge.amount);
        }
        let mut conn = self.fleet.conn.clone();
        let reply: Vec<i64> = match self
            .fleet
            .within_deadline(call.invoke_async(&mut conn))
            .await
        {
            Ok(reply) => reply,
            Err(timed_out) => {
                let counter = if timed_out {
                    &self.fleet.counters.timeouts
                } else {
                    &self.fleet.counters.fallbacks
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let number = |i: usize| reply.get(i).copied().unwrap_or(0).max(0) as u64;
        let standings: Vec<Standing> = charges
            .iter()
            .enumerate()
            .map(|(i, charge)| Standing {
                limit: charge.limit,
                remaining: number(3 + 2 * i),
                reset: Duration::from_micros(number(4 + 2 * i)),
            })
            .collect();
        let refusing = number(0) as usize;
        if refusing == 0 {
            let mut slots = self.slots.lock();
            for charge in charges.iter().filter(|c| c.kind == LimitKind::Concurrent) {
                let held = slots.entry(self.key(charge)).or_default();
                let mut fleet_slots = self.fleet.held_slots.lock();
                for j in 1..=charge.amount {
                    let slot = format!("{member}:{j}");
                    fleet_slots.insert(slot.clone(), self.key(charge));
                    held.push(slot);
                }
            }
            return Some(Ok(standings));
        }
        Some(Err(Refusal {
            index: refusing - 1,
            retry_after: Duration::from_micros(number(1)),
            never: number(2) == 1,
            standings,
        }))
    }
}

#[async_trait]
impl LimitStore for FleetLimits {
    async fn check_and_reserve(&self, charges: &[Charge]) -> Result<Vec<Standing>, Refusal> {
        match self.check_shared(charges).await {
            Some(answer) => answer,
            None => self.local.check_and_reserve(charges).await,
        }
    }

    fn reconcile(&self, charge: &Charge, delta: i64) {
        if delta == 0 || charge.kind != LimitKind::Tokens {
            return;
        }
        if !self.fleet.is_connected() {
            self.local.reconcile(charge, delta);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let script = self.reconcile.clone();
        let (key, limit) = (self.key(charge), charge.limit);
        let mut conn = self.fleet.conn.clone();
        runtime.spawn(async move {
            let mut call = script.key(key);
            call.arg(limit).arg(delta);
            let _ =
                tokio::time::timeout(Duration::from_secs(2), call.invoke_async::<i64>(&mut conn))
                    .await;
        });
    }

    fn release(&self, charge: &Charge) {
        if charge.kind != LimitKind::Concurrent {
            return;
        }
        let key = self.key(charge);
        let members: Vec<String> = {
            let mut slots = self.slots.lock();
            let Some(held) = slots.get_mut(&key) else {
                // Admitted by the local fallback.
                self.local.release(charge);
                return;
            };
            let n = (charge.amount as usize).min(held.len());
            let members = held.split_off(held.len() - n);
            if held.is_empty() {
                slots.remove(&key);
            }
            members
        };
        if members.is_empty() {
            self.local.release(charge);
            return;
        }
        {
            let mut fleet_slots = self.fleet.held_slots.lock();
            for m in &members {
                fleet_slots.remove(m);
            }
        }
        self.fleet.free_slots_later(key, members);
    }
}
