//! From a parsed request to an answered one: the route table, the selection pipeline, and dispatch
//! with fallback.

pub mod dispatch;
pub mod health;
pub mod policy;
pub mod select;
pub mod table;
