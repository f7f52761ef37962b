//! Client and upstream wire protocols.

pub mod openai_chat;
