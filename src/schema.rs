//! JSON Schema checks: that a declared parameter schema is a valid schema, and
//! that call arguments satisfy it (draft 2020-12 unless the schema says otherwise).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

/// What kind of JSON value `value` is, in words, for messages that name a
/// value's type without quoting it (which could be large).
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

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

/// Checks that `schema` is an object, within the cost limits and a valid,
/// usable JSON Schema, whatever its size (runtime tools have their own,
/// configurable size limit).
pub fn check_schema_validity(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("parameters must be a JSON Schema object".into());
    }
    // Tool arguments are always a JSON object: a schema of any other
    // top-level type would make the tool impossible to call.
    match schema.get("type") {
        None => {}
        Some(Value::String(kind)) if kind == "object" => {}
        Some(other) => {
            return Err(format!(
                "parameters must describe an object (\"type\": \"object\"), got type {other}"
            ));
        }
    }
    // Before compiling: a schema whose references fan out costs more to compile
    // and to validate against than its text suggests.
    check_cost(schema)?;
    jsonschema::meta::validate(schema).map_err(|err| {
        let path = err.instance_path().to_string();
        if path.is_empty() {
            format!("parameters is not a valid JSON Schema: {err}")
        } else {
            format!("parameters is not a valid JSON Schema at {path}: {err}")
        }
    })?;
    jsonschema::validator_for(schema)
        .map(drop)
        .map_err(|err| format!("parameters is not a usable JSON Schema: {err}"))
}

/// How much a schema may cost, measured on its JSON without expanding it and
/// before it is compiled.
#[derive(Debug, Clone, Copy)]
pub struct SchemaCost {
    /// JSON values in the schema text.
    pub nodes: usize,
    /// Deepest nesting of the schema text.
    pub depth: usize,
    /// JSON values the schema would have with every local `$ref` expanded in
    /// place (a reference back into its own ancestors counts once): what a
    /// validator may walk for one argument. Saturates at `usize::MAX`.
    pub expanded_nodes: usize,
    /// Whether it holds regular expressions (`pattern`, `patternProperties`),
    /// whose cost depends on the argument as much as on the schema.
    pub has_patterns: bool,
}

/// Deepest nesting accepted in a parameter schema.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Longest chain of nested values and references followed while measuring.
const MAX_REFERENCE_CHAIN: usize = 512;
/// Most JSON values a parameter schema may expand to through its references.
pub const MAX_EXPANDED_NODES: usize = 100_000;

/// Measures `schema` in one pass over its JSON plus one over its references:
/// linear in its size, whatever its references fan out to.
pub fn measure(schema: &Value) -> SchemaCost {
    let mut own = HashMap::new();
    let mut depth = 0;
    let nodes = count(schema, "", 1, &mut depth, &mut own);
    let mut memo = HashMap::new();
    let mut visiting = std::collections::HashSet::new();
    let expanded_nodes = expanded("", &own, &mut memo, &mut visiting);
    SchemaCost {
        nodes,
        depth,
        expanded_nodes,
        has_patterns: own.keys().any(|pointer| {
            pointer.ends_with("/pattern") || pointer.ends_with("/patternProperties")
        }),
    }
}

/// What one JSON value holds: its own node count (without the subtrees of its
/// nested values that are separately addressable) and the local references it
/// makes, by JSON pointer.
#[derive(Debug, Default)]
struct OwnCost {
    nodes: usize,
    refs: Vec<String>,
    children: Vec<String>,
}

fn count(
    value: &Value,
    pointer: &str,
    level: usize,
    depth: &mut usize,
    own: &mut HashMap<String, OwnCost>,
) -> usize {
    *depth = (*depth).max(level);
    let mut cost = OwnCost {
        nodes: 1,
        ..Default::default()
    };
    let mut total = 1;
    let mut visit = |key: String, child: &Value, cost: &mut OwnCost| {
        let child_pointer = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
        total += count(child, &child_pointer, level + 1, depth, own);
        cost.children.push(child_pointer);
    };
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                if (key == "$ref" || key == "$dynamicRef" || key == "$recursiveRef")
                    && let Some(target) = child.as_str()
                {
                    if let Some(local) = target.strip_prefix('#') {
                        cost.refs.push(percent_decode(local));
                    }
                    continue;
                }
                visit(key.clone(), child, &mut cost);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                visit(index.to_string(), child, &mut cost);
            }
        }
        _ => {}
    }
    own.insert(pointer.to_owned(), cost);
    total
}

fn percent_decode(pointer: &str) -> String {
    form_urlencoded::parse(format!("p={}", pointer.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_else(|| pointer.to_owned())
}

/// The expanded size of the value at `pointer`, memoised per pointer; a
/// reference to a value being expanded (recursion) counts as one node.
fn expanded(
    pointer: &str,
    own: &HashMap<String, OwnCost>,
    memo: &mut HashMap<String, usize>,
    visiting: &mut std::collections::HashSet<String>,
) -> usize {
    if let Some(size) = memo.get(pointer) {
        return *size;
    }
    let Some(cost) = own.get(pointer) else {
        // A reference to something that is not in the schema (an anchor, a
        // remote document): compiling decides whether it is usable.
        return 1;
    };
    if visiting.len() >= MAX_REFERENCE_CHAIN {
        // Deeper chains are refused as over the expansion limit, and stopping
        // here bounds this recursion.
        return usize::MAX;
    }
    if !visiting.insert(pointer.to_owned()) {
        return 1;
    }
    let mut size = cost.nodes;
    for next in cost.children.iter().chain(&cost.refs) {
        size = size.saturating_add(expanded(next, own, memo, visiting));
    }
    visiting.remove(pointer);
    memo.insert(pointer.to_owned(), size);
    size
}

/// Refuses a schema whose cost is over the limits, naming the limit.
pub fn check_cost(schema: &Value) -> Result<(), String> {
    let cost = measure(schema);
    if cost.depth > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "parameters nest {} levels deep; the limit is {MAX_SCHEMA_DEPTH}",
            cost.depth
        ));
    }
    if cost.expanded_nodes > MAX_EXPANDED_NODES {
        return Err(format!(
            "parameters expand through their $ref/allOf references to more than {MAX_EXPANDED_NODES} schema nodes (the limit); flatten the schema or share fewer references"
        ));
    }
    Ok(())
}

/// A compiled schema, and whether validating against it is cheap.
struct Compiled {
    validator: Arc<jsonschema::Validator>,
    /// Small once expanded and without regular expressions: validating a small
    /// argument against it takes microseconds, on any thread.
    cheap: bool,
}

/// Expanded size under which a schema (without patterns) is cheap to validate.
const CHEAP_EXPANDED_NODES: usize = 2_000;
/// Raw argument size under which a cheap schema is validated where the call runs.
pub const CHEAP_ARGUMENT_BYTES: usize = 8 * 1024;

/// Schema nodes whose compiled validators may be kept at once, over all tools.
/// A compiled schema takes many times its text's memory (a 100 KB schema about
/// 1 MB), so past this budget a schema is compiled for each call instead of
/// kept: slower for that tool, but memory stays bounded however many large
/// schemas are called.
pub const RETAINED_NODES_BUDGET: usize = 1_000_000;

/// Schema nodes of the compiled validators kept now.
static RETAINED_NODES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A compiled schema kept for its tool, counted against the budget until the
/// tool (its last spec) is dropped.
struct Retained {
    compiled: Result<Compiled, String>,
    nodes: usize,
}

impl Drop for Retained {
    fn drop(&mut self) {
        RETAINED_NODES.fetch_sub(self.nodes, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A tool's compiled validator, compiled on first use and then shared by every
/// copy of the tool's spec: a schema is compiled once, not per call (within
/// [`RETAINED_NODES_BUDGET`]). It keeps the schema's object form for MCP the
/// same way ([`Self::object_form`]).
#[derive(Clone, Default)]
pub struct SchemaValidator(Arc<Derived>);

/// What is derived from one schema, each on first use.
#[derive(Default)]
struct Derived {
    compiled: OnceLock<Retained>,
    /// The schema as a JSON object: MCP carries a tool's schema as one
    /// (rmcp's `Arc<JsonObject>`), and listing tools must not copy every
    /// schema per request.
    object: OnceLock<Arc<serde_json::Map<String, Value>>>,
}

impl std::fmt::Debug for SchemaValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0.compiled.get().map(|kept| &kept.compiled) {
            None => "SchemaValidator(not kept)",
            Some(Ok(_)) => "SchemaValidator(compiled)",
            Some(Err(_)) => "SchemaValidator(unusable)",
        })
    }
}

/// Derived data: two specs are equal whatever their validators' state.
impl PartialEq for SchemaValidator {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

fn compile(schema: &Value, cost: &SchemaCost) -> Result<Compiled, String> {
    jsonschema::validator_for(schema)
        .map(|validator| Compiled {
            validator: Arc::new(validator),
            cheap: cost.expanded_nodes <= CHEAP_EXPANDED_NODES && !cost.has_patterns,
        })
        .map_err(|err| format!("the tool's parameter schema is unusable: {err}"))
}

impl SchemaValidator {
    /// Whether `args_bytes` of arguments can be validated on an async worker:
    /// the schema is compiled already, cheap, and the arguments small. Anything
    /// else goes to the blocking pool with a time budget.
    pub fn is_cheap_for(&self, args_bytes: usize) -> bool {
        args_bytes <= CHEAP_ARGUMENT_BYTES
            && matches!(
                self.0.compiled.get().map(|kept| &kept.compiled),
                Some(Ok(Compiled { cheap: true, .. }))
            )
    }

    /// `schema` (the one this validator belongs to) as a JSON object, copied
    /// on first use and then shared. A schema that is not an object (a
    /// catalog's always is) gives an empty one, which accepts anything.
    pub fn object_form(&self, schema: &Value) -> Arc<serde_json::Map<String, Value>> {
        self.0
            .object
            .get_or_init(|| match schema {
                Value::Object(object) => Arc::new(object.clone()),
                _ => Arc::default(),
            })
            .clone()
    }

    /// Validates `args` against `schema`, compiling it first unless it is kept
    /// from an earlier call. CPU-heavy unless [`Self::is_cheap_for`]: run it off
    /// the async workers.
    pub fn validate(&self, schema: &Value, args: &Value) -> Result<(), String> {
        if let Some(kept) = self.0.compiled.get() {
            return Self::check(&kept.compiled, args);
        }
        let cost = measure(schema);
        let compiled = compile(schema, &cost);
        let nodes = cost.nodes;
        let before = RETAINED_NODES.fetch_add(nodes, std::sync::atomic::Ordering::SeqCst);
        if before + nodes > RETAINED_NODES_BUDGET {
            RETAINED_NODES.fetch_sub(nodes, std::sync::atomic::Ordering::SeqCst);
            tracing::debug!(
                nodes,
                "compiled validator not kept: over the retained budget"
            );
            return Self::check(&compiled, args);
        }
        // A concurrent first call may have kept its own copy; this one is then
        // dropped, and its nodes with it.
        let _ = self.0.compiled.set(Retained { compiled, nodes });
        let kept = self
            .0
            .compiled
            .get()
            .expect("set above or by a concurrent call");
        Self::check(&kept.compiled, args)
    }

    fn check(compiled: &Result<Compiled, String>, args: &Value) -> Result<(), String> {
        match compiled {
            Ok(compiled) => check_with(&compiled.validator, args),
            Err(problem) => Err(problem.clone()),
        }
    }
}

/// Checks `args` with a compiled validator; the error names up to five problems
/// with their paths.
pub fn check_with(validator: &jsonschema::Validator, args: &Value) -> Result<(), String> {
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

/// Validates call arguments against a schema (compiling it for this call only).
pub fn validate_arguments(schema: &Value, args: &Value) -> Result<(), String> {
    SchemaValidator::default().validate(schema, args)
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

    /// Ten levels of five references each: 2 KB of text, 5^10 nodes expanded.
    fn fan_out_schema(levels: usize, refs: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for level in 0..levels {
            let next: Vec<Value> = (0..refs)
                .map(|_| json!({"$ref": format!("#/$defs/l{}", level + 1)}))
                .collect();
            defs.insert(format!("l{level}"), json!({"allOf": next}));
        }
        defs.insert(format!("l{levels}"), json!({"type": "object"}));
        json!({"type": "object", "$defs": defs, "allOf": [{"$ref": "#/$defs/l0"}]})
    }

    #[test]
    fn fan_out_is_measured_without_expanding() {
        let schema = fan_out_schema(10, 5);
        assert!(schema.to_string().len() < 4096);
        let started = std::time::Instant::now();
        let cost = measure(&schema);
        assert!(cost.expanded_nodes > 5usize.pow(10), "{cost:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(
            check_parameter_schema(&schema)
                .unwrap_err()
                .contains("expand")
        );
        // A modest shared definition is fine, and so is recursion.
        assert!(check_parameter_schema(&fan_out_schema(3, 3)).is_ok());
        let tree = json!({"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}});
        assert!(check_parameter_schema(&tree).is_ok());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut schema = json!({"type": "string"});
        for _ in 0..40 {
            schema = json!({"type": "object", "properties": {"a": schema}});
        }
        assert!(
            check_parameter_schema(&schema)
                .unwrap_err()
                .contains("levels deep")
        );
    }

    #[test]
    fn kept_validators_release_their_budget_when_dropped() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let validator = SchemaValidator::default();
        assert!(!validator.is_cheap_for(10));
        validator.validate(&schema, &json!({"n": 1})).unwrap();
        assert!(validator.is_cheap_for(10), "kept after its first call");
        let copy = validator.clone();
        drop(validator);
        assert!(copy.is_cheap_for(10), "shared by every copy");
        assert!(copy.validate(&schema, &json!({"n": "x"})).is_err());
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
