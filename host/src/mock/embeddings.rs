//! `POST /v1/embeddings`: deterministic unit vectors derived from each input's hash.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Kind, MockState, admit, error_response};
use crate::protocol::{Dialect, parse_embeddings_request};

/// Vector length when the request names no `dimensions`.
pub const DEFAULT_DIMENSIONS: usize = 16;
const MAX_DIMENSIONS: usize = 4096;

pub(super) async fn handle(
    State(state): State<Arc<MockState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let dialect = Dialect::OpenAiChat;
    if let Err((status, message)) = admit(&state, &uri, &headers, &body, Kind::Embeddings, dialect)
    {
        return error_response(dialect, status, &message);
    }
    let (model, chars) = match parse_embeddings_request(&body) {
        Ok(v) => v,
        Err(reason) => return error_response(dialect, 400, &reason.to_string()),
    };
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let dimensions = match request.get("dimensions") {
        None | Some(Value::Null) => DEFAULT_DIMENSIONS,
        Some(d) => match d.as_u64().and_then(|d| usize::try_from(d).ok()) {
            Some(d) if (1..=MAX_DIMENSIONS).contains(&d) => d,
            _ => {
                return error_response(
                    dialect,
                    400,
                    &format!("`dimensions` must be an integer from 1 to {MAX_DIMENSIONS}"),
                );
            }
        },
    };
    let base64 = request.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let inputs: Vec<String> = match &request["input"] {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        Value::String(s) => vec![s.clone()],
        other => vec![other.to_string()],
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let v = vector(input, dimensions);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens = (chars / 4).max(1);
    Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

/// A unit vector that depends only on `input` and `dimensions`.
pub fn vector(input: &str, dimensions: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(dimensions);
    let mut block = 0u32;
    while out.len() < dimensions {
        let digest = Sha256::new()
            .chain_update(input.as_bytes())
            .chain_update(block.to_le_bytes())
            .finalize();
        for chunk in digest.chunks_exact(4) {
            if out.len() == dimensions {
                break;
            }
            let n = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            out.push((f64::from(n) / f64::from(u32::MAX) * 2.0 - 1.0) as f32);
        }
        block += 1;
    }
    let norm = out.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in &mut out {
            *x /= norm;
        }
    }
    out
}
