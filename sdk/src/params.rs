//! `router_params`: schema and parsing.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The JSON Schema (draft 2020-12) of a params type, as the host expects from `params-schema`.
///
/// The top level always has `"additionalProperties": false`: `#[serde(deny_unknown_fields)]` produces
/// it, and it is added (or a laxer value replaced) when missing, so a typo in `router_params` is an
/// error at config load. Params should therefore be a struct with named fields.
pub fn params_schema<P: JsonSchema>() -> Value {
    let mut schema = SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<P>();
    schema.insert("additionalProperties".to_owned(), Value::Bool(false));
    schema.to_value()
}

/// Parses `router_params` JSON into `P`. The top level must be an object; blank input counts as `{}`.
///
/// Errors are single-line strings naming the offending key's path, e.g.
/// ``skip_open_circuits: invalid type: string "yes", expected a boolean at line 1 column 28``, or
/// serde's own ``unknown field `x`, expected ...`` for a key `P` does not declare.
pub fn parse_params<P: DeserializeOwned>(params_json: &str) -> Result<P, String> {
    let json = if params_json.trim().is_empty() {
        "{}"
    } else {
        params_json
    };
    if !json.trim_start().starts_with('{') {
        // Serde would otherwise accept a sequence for a struct.
        return Err("invalid router_params: expected a JSON object".to_owned());
    }
    let mut deserializer = serde_json::Deserializer::from_str(json);
    let params = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        if path == "." || path.is_empty() {
            format!("invalid router_params: {}", error.inner())
        } else {
            format!("invalid router_params: {path}: {}", error.inner())
        }
    })?;
    deserializer
        .end()
        .map_err(|error| format!("invalid router_params: {error}"))?;
    Ok(params)
}

/// Params for a strategy that takes none: accepts only `{}` (or blank), rejects any key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Example {
        #[serde(default = "yes")]
        flag: bool,
        #[serde(default)]
        nested: Nested,
    }

    #[derive(Debug, Default, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Nested {
        #[serde(default)]
        limit: u32,
    }

    fn yes() -> bool {
        true
    }

    /// No `deny_unknown_fields`: the SDK must still close the top level.
    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Lax {
        #[serde(default)]
        x: u32,
    }

    #[test]
    fn schema_is_draft_2020_12_and_closed() {
        let schema = params_schema::<Example>();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["flag"]["default"], true);
    }

    #[test]
    fn schema_is_closed_even_without_deny_unknown_fields() {
        assert_eq!(params_schema::<Lax>()["additionalProperties"], false);
        assert_eq!(params_schema::<NoParams>()["additionalProperties"], false);
        assert_eq!(params_schema::<NoParams>()["type"], "object");
    }

    #[test]
    fn parses_with_defaults_and_blank() -> Result<(), String> {
        let example: Example = parse_params("{}")?;
        assert!(example.flag);
        let example: Example = parse_params("   ")?;
        assert!(example.flag);
        let example: Example = parse_params(r#"{"flag": false, "nested": {"limit": 3}}"#)?;
        assert!(!example.flag);
        assert_eq!(example.nested.limit, 3);
        parse_params::<NoParams>("{}")?;
        Ok(())
    }

    #[test]
    fn errors_name_the_key() {
        let error = parse_params::<Example>(r#"{"flag": "yes"}"#)
            .err()
            .unwrap_or_default();
        assert!(
            error.starts_with("invalid router_params: flag: invalid type"),
            "{error}"
        );

        let error = parse_params::<Example>(r#"{"nested": {"limit": -1}}"#)
            .err()
            .unwrap_or_default();
        assert!(error.contains("nested.limit: invalid value"), "{error}");

        let error = parse_params::<Example>(r#"{"flga": true}"#)
            .err()
            .unwrap_or_default();
        assert!(error.contains("unknown field `flga`"), "{error}");

        let error = parse_params::<NoParams>(r#"{"x": 1}"#)
            .err()
            .unwrap_or_default();
        assert!(error.contains("unknown field `x`"), "{error}");
    }

    #[test]
    fn rejects_trailing_garbage_and_non_objects() {
        assert!(parse_params::<Example>("{} {}").is_err());
        assert!(parse_params::<Example>("[]").is_err());
        assert!(parse_params::<Example>("null").is_err());
    }
}
