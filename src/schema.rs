//! JSON Schema checks: that a declared parameter schema is a valid schema, and
//! that call arguments satisfy it (draft 2020-12 unless the schema says otherwise).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;

/// Largest accepted parameter schema of a tool definition, serialized, in bytes
/// (runtime tools have `--max-tool-schema-bytes` instead).
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// Checks that `schema` is an object, at most [`MAX_SCHEMA_BYTES`], and a valid
/// JSON Schema.
pub fn check_parameter_schema(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("parameters must be a JSON Schema object".into());
    }
    if schema.to_string().len() > MAX_SCHEMA_BYTES {
        return Err(format!(
            "parameters must be at most {MAX_SCHEMA_BYTES} bytes"
        ));
    }
    check_schema_validity(schema)
}

/// Checks that `schema` is an object and a valid, usable JSON Schema, whatever
/// its size (runtime tools have their own, configurable size limit).
pub fn check_schema_validity(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("parameters must be a JSON Schema object".into());
    }
    jsonschema::meta::validate(schema).map_err(|err| {
        let path = err.instance_path().to_string();
        if path.is_empty() {
            format!("parameters is not a valid JSON Schema: {err}")
        } else {
            format!("parameters is not a valid JSON Schema at {path}: {err}")
        }
    })?;
    jsonschema::validator_for(schema)
        .map(|_| ())
        .map_err(|err| format!("parameters is not a usable JSON Schema: {err}"))
}

/// Compiled validators by schema text. Compiling a schema costs far more than
/// validating against it (BENCHMARKS.md), and a tool's schema is the same on
/// every call, so each distinct schema is compiled once.
struct ValidatorCache {
    by_schema: HashMap<String, Arc<jsonschema::Validator>>,
    bytes: usize,
}

impl ValidatorCache {
    /// Schema text kept at most; past it the cache starts over.
    const MAX_BYTES: usize = 16 * 1024 * 1024;
}

static VALIDATORS: LazyLock<Mutex<ValidatorCache>> = LazyLock::new(|| {
    Mutex::new(ValidatorCache {
        by_schema: HashMap::new(),
        bytes: 0,
    })
});

/// The compiled validator of `schema`, from the cache when it was seen before.
fn validator(schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
    let key = schema.to_string();
    // Each update is a single insert or clear: a poisoned cache is still whole.
    let cache = || VALIDATORS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(validator) = cache().by_schema.get(&key) {
        return Ok(validator.clone());
    }
    let validator = Arc::new(
        jsonschema::validator_for(schema)
            .map_err(|err| format!("the tool's parameter schema is unusable: {err}"))?,
    );
    let mut cache = cache();
    if cache.bytes + key.len() > ValidatorCache::MAX_BYTES {
        cache.by_schema.clear();
        cache.bytes = 0;
    }
    cache.bytes += key.len();
    cache.by_schema.insert(key, validator.clone());
    Ok(validator)
}

/// Validates call arguments against a tool's parameter schema.
pub fn validate_arguments(schema: &Value, args: &Value) -> Result<(), String> {
    let validator = validator(schema)?;
    let problems: Vec<String> = validator
        .iter_errors(args)
        .take(5)
        .map(|err| {
            let path = err.instance_path().to_string();
            if path.is_empty() {
                err.to_string()
            } else {
                format!("{path}: {err}")
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_non_schemas() {
        assert!(check_parameter_schema(&json!("x")).is_err());
        assert!(check_parameter_schema(&json!({"type": "nonsense"})).is_err());
        assert!(
            check_parameter_schema(&json!({"type": "object", "required": "location"})).is_err()
        );
        assert!(check_parameter_schema(&json!({"type": "object", "properties": {}})).is_ok());
    }

    #[test]
    fn validates_arguments() {
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        assert!(validate_arguments(&schema, &json!({"n": 1})).is_ok());
        let err = validate_arguments(&schema, &json!({"n": "x"})).unwrap_err();
        assert!(err.contains("/n"), "{err}");
        assert!(validate_arguments(&schema, &json!({})).is_err());
    }
}
