//! Maps keyed by names the operator chose: endpoint ids, model names, upstream URLs.
//!
//! The request path looks these up a dozen times per request, and SipHash, the standard map's
//! hasher, cost about 250 instructions a lookup (4,500 per request, callgrind). foldhash, seeded
//! per process, costs a fraction of that. SipHash's resistance to chosen-key flooding is not
//! needed where the keys come from config or the admin API; maps keyed by what a client sends
//! (caller keys, session ids) keep the standard hasher.

/// A `HashMap` for keys the operator chose (see the module's doc). foldhash's `std` feature stays
/// off, as hashbrown (wasmtime, cranelift) takes it: turned on here, it rebuilt all of those.
pub type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
