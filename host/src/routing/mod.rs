//! From a parsed request to an answered one: the route table, the selection pipeline, and dispatch
//! with fallback.

pub mod dispatch;
pub mod select;
pub mod table;
