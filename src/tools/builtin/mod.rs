//! Builtin tools. Each is one [`Builtin`] implementation with typed parameters;
//! the JSON Schema the model sees is derived from those Rust types (schemars,
//! draft 2020-12) and arguments are validated against it before the typed
//! parameters are read, so schema and code cannot drift apart.

mod character;
mod choice;
mod dice;
mod memory;
mod resources;
pub mod state;
mod time;
mod variables;

use std::future::Future;
use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use self::state::{RunSessionState, SessionState, StoreSessionState};
use crate::call::ToolOutcome;
use crate::catalog::{
    Availability, CallContext, CatalogEntry, EntryKey, ToolHandler, ToolProvider,
};
use crate::domain::tool::{ProviderType, SideEffectLevel, Slot, ToolMetadata, ToolSpec};
use crate::error::{Error, Result};
use crate::reason::ReasonCode;
use crate::store::{Run, Session, Store};

/// Which builtin provider a tool belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Needs nothing but its arguments (and the session's character); listed by
    /// `GET /tools/builtin`.
    ContextFree,
    /// Reads or writes session state: variables and memory.
    SessionContext,
    /// Manages the session's named resources.
    Resource,
}

impl Provider {
    /// The catalog's `provider_id`.
    pub fn id(self) -> &'static str {
        match self {
            Provider::ContextFree => "builtin",
            Provider::SessionContext => "builtin:session",
            Provider::Resource => "builtin:resource",
        }
    }

    /// The catalog's `source`.
    pub fn source(self) -> &'static str {
        match self {
            Provider::ContextFree | Provider::SessionContext => "builtin",
            Provider::Resource => "resource",
        }
    }
}

/// What a builtin may reach while it runs.
pub struct Context<'a> {
    pub session: &'a Session,
    pub store: &'a Store,
    /// Variables and resources; writes go through here so they can be buffered.
    pub state: &'a dyn SessionState,
}

/// A tool-level failure: the message goes to the model, which can act on it;
/// the reason goes to the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub reason: ReasonCode,
    pub message: String,
}

impl ToolError {
    /// A failure the model can act on (bad input, a missing thing).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            reason: ReasonCode::BuiltinToolError,
            message: message.into(),
        }
    }
}

impl From<Error> for ToolError {
    fn from(err: Error) -> Self {
        match err {
            Error::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "builtin tool failed");
                ToolError {
                    reason: ReasonCode::BuiltinInternalError,
                    message: "the tool failed because of a server error; try again later".into(),
                }
            }
            other => ToolError::new(other.to_string()),
        }
    }
}

/// One builtin tool with typed parameters.
pub trait Builtin: Send + Sync + 'static {
    /// The arguments; unknown fields should be denied so typos reach the model.
    type Params: DeserializeOwned + JsonSchema + Send;
    const NAME: &'static str;
    const DESCRIPTION: &'static str;
    const PROVIDER: Provider;
    const SIDE_EFFECT_LEVEL: SideEffectLevel;
    /// Slots allowed to call the tool; empty means every slot.
    const ALLOWED_SLOTS: &'static [Slot] = &[];

    /// Runs the tool on arguments that already satisfy the schema.
    fn run(
        &self,
        ctx: &Context<'_>,
        params: Self::Params,
    ) -> impl Future<Output = std::result::Result<Value, ToolError>> + Send;
}

/// Arguments the builtin's own typed parameters refuse (the dispatcher checks
/// the same schema first, so this is the second line of defence).
fn invalid_arguments(message: String) -> ToolError {
    ToolError {
        reason: ReasonCode::BuiltinInvalidArguments,
        message,
    }
}

/// The object-safe face of a [`Builtin`], so the registry can hold them all.
trait Erased: Send + Sync {
    fn call<'a>(
        &'a self,
        ctx: &'a Context<'_>,
        args: Value,
    ) -> BoxFuture<'a, std::result::Result<Value, ToolError>>;
}

impl<T: Builtin> Erased for T {
    fn call<'a>(
        &'a self,
        ctx: &'a Context<'_>,
        args: Value,
    ) -> BoxFuture<'a, std::result::Result<Value, ToolError>> {
        Box::pin(async move {
            let params: T::Params = serde_json::from_value(args)
                .map_err(|err| invalid_arguments(format!("invalid arguments: {err}")))?;
            self.run(ctx, params).await
        })
    }
}

/// A builtin with its derived schema, ready to list and call.
struct Registered {
    name: &'static str,
    spec: ToolSpec,
    provider: Provider,
    validator: jsonschema::Validator,
    tool: Box<dyn Erased>,
}

fn register<T: Builtin>(tool: T) -> Registered {
    let parameters = parameter_schema::<T::Params>();
    let validator = jsonschema::validator_for(&parameters)
        .unwrap_or_else(|err| panic!("derived schema of {} is invalid: {err}", T::NAME));
    Registered {
        name: T::NAME,
        spec: ToolSpec {
            name: T::NAME.to_owned(),
            description: T::DESCRIPTION.to_owned(),
            parameters: parameters.into(),
            validator: Default::default(),
            provider_id: T::PROVIDER.id().to_owned(),
            provider_type: ProviderType::Builtin,
            source: T::PROVIDER.source().to_owned(),
            metadata: ToolMetadata::declared(T::SIDE_EFFECT_LEVEL, T::ALLOWED_SLOTS.to_vec(), None),
        },
        provider: T::PROVIDER,
        validator,
        tool: Box::new(tool),
    }
}

/// The JSON Schema of `P` as a tool's `parameters`: draft 2020-12, subschemas
/// inlined (model APIs handle `$ref` poorly), without `$schema`, `title` and the
/// root `description` (the tool has its own), and
/// without Rust-only `format`s such as `uint32` that mean nothing to a model.
pub fn parameter_schema<P: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.meta_schema = None;
            settings.inline_subschemas = true;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<P>().to_value();
    if let Value::Object(root) = &mut schema {
        // The struct's doc comment describes Rust code, not the tool.
        root.remove("title");
        root.remove("description");
        root.entry("properties").or_insert_with(|| json!({}));
    }
    strip_numeric_formats(&mut schema);
    schema
}

fn strip_numeric_formats(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let numeric = map.get("format").and_then(Value::as_str).is_some_and(|f| {
                f.starts_with("int") || f.starts_with("uint") || f == "float" || f == "double"
            });
            if numeric {
                map.remove("format");
            }
            map.values_mut().for_each(strip_numeric_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_numeric_formats),
        _ => {}
    }
}

/// The builtin's name as a static string (a closed set: a metrics label).
pub fn static_name(name: &str) -> Option<&'static str> {
    REGISTRY
        .iter()
        .find(|tool| tool.name == name)
        .map(|tool| tool.name)
}

static REGISTRY: LazyLock<Vec<Registered>> = LazyLock::new(|| {
    vec![
        register(dice::RollDice),
        register(choice::RandomChoice),
        register(time::GetTime),
        register(character::GetCharacterInfo),
        register(variables::GetVariable),
        register(variables::SetVariable),
        register(memory::QueryMemory),
        register(resources::ListResources),
        register(resources::ReadResource),
        register(resources::WriteResource),
        register(resources::DeleteResource),
    ]
});

#[cfg(test)]
fn find(name: &str) -> Option<&'static Registered> {
    REGISTRY.iter().find(|tool| tool.spec.name == name)
}

/// The context-free builtins as `GET /tools/builtin` lists them.
pub fn context_free_listing() -> Vec<Value> {
    REGISTRY
        .iter()
        .filter(|tool| tool.provider == Provider::ContextFree)
        .map(|tool| {
            json!({
                "name": tool.spec.name,
                "description": tool.spec.description,
                "parameters": tool.spec.parameters,
                "side_effect_level": tool.spec.metadata.side_effect_level,
                "allowed_slots": tool.spec.metadata.allowed_slots,
                "source": "builtin",
            })
        })
        .collect()
}

/// The builtin provider: every builtin, in every session's catalog.
pub struct BuiltinProvider {
    handlers: Vec<(Arc<ToolSpec>, Arc<dyn ToolHandler>)>,
}

impl BuiltinProvider {
    /// Builtins read and write session state through `store`.
    pub fn new(store: Store) -> Self {
        let handlers = REGISTRY
            .iter()
            .map(|tool| {
                let handler: Arc<dyn ToolHandler> = Arc::new(BuiltinHandler {
                    tool,
                    store: store.clone(),
                });
                (Arc::new(tool.spec.clone()), handler)
            })
            .collect();
        Self { handlers }
    }
}

impl ToolProvider for BuiltinProvider {
    fn kind(&self) -> &'static str {
        "builtin"
    }

    fn entries<'a>(&'a self, _session: &'a Session) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        Box::pin(std::future::ready(Ok(self.entries_where(|_| true))))
    }

    fn entry_keys(&self, _session: &Session, keys: &mut Vec<EntryKey>) -> bool {
        // The provider holds every builtin's spec for as long as it lives.
        keys.extend(
            self.handlers
                .iter()
                .map(|(spec, _)| EntryKey::new(spec, Availability::Available)),
        );
        true
    }

    fn entries_named<'a>(
        &'a self,
        _session: &'a Session,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        let entries = self.entries_where(|spec| spec.name == name);
        Box::pin(std::future::ready(Ok(entries)))
    }
}

impl BuiltinProvider {
    /// The entries of the builtins whose spec `keep` keeps.
    fn entries_where(&self, keep: impl Fn(&ToolSpec) -> bool) -> Vec<CatalogEntry> {
        self.handlers
            .iter()
            .filter(|(spec, _)| keep(spec))
            .map(|(spec, handler)| CatalogEntry::available(spec.clone(), handler.clone()))
            .collect()
    }
}

/// Runs one builtin.
struct BuiltinHandler {
    tool: &'static Registered,
    store: Store,
}

impl std::fmt::Debug for BuiltinHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltinHandler")
            .field("tool", &self.tool.spec.name)
            .finish()
    }
}

impl ToolHandler for BuiltinHandler {
    fn invoke<'a>(
        &'a self,
        cx: &'a CallContext<'a>,
        args: &'a Value,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(call(&self.store, self.tool, cx.session, cx.run, args))
    }
}

/// Runs the builtin `tool` for `session`, inside `run` when the call names an
/// open run (its sandbox writes are then buffered until the run commits).
/// Arguments are validated against the tool's own schema here too, so no path
/// can reach a builtin unchecked.
async fn call(
    store: &Store,
    tool: &'static Registered,
    session: &Session,
    run: Option<&Run>,
    args: &Value,
) -> ToolOutcome {
    let name = tool.spec.name.as_str();
    if let Err(problems) = crate::schema::check_with(&tool.validator, args) {
        return ToolOutcome::error(
            ReasonCode::BuiltinInvalidArguments,
            format!("invalid arguments: {problems}"),
        );
    }
    let state: Box<dyn SessionState> = match run {
        Some(run) => Box::new(RunSessionState::new(
            store.clone(),
            session.id.clone(),
            run.id.clone(),
        )),
        None => Box::new(StoreSessionState::new(store.clone(), session.id.clone())),
    };
    let ctx = Context {
        session,
        store,
        state: state.as_ref(),
    };
    match tool.tool.call(&ctx, args.clone()).await {
        Ok(output) => {
            if tool.spec.metadata.side_effect_level != SideEffectLevel::None {
                match run {
                    Some(run) => {
                        tracing::info!(tool = name, session_id = ?session.id, run_id = %run.id, "builtin tool buffered a session-state change until the run commits")
                    }
                    None => {
                        tracing::info!(tool = name, session_id = ?session.id, "builtin tool changed session state")
                    }
                }
            }
            ToolOutcome::Success(output)
        }
        Err(ToolError { reason, message }) => {
            tracing::info!(tool = name, session_id = ?session.id, reason_code = reason.as_str(), message = ?message, "builtin tool answered an error");
            ToolOutcome::error(reason, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::tool::Basis;

    #[test]
    fn every_derived_schema_is_a_valid_object_schema() {
        for tool in REGISTRY.iter() {
            let schema = &tool.spec.parameters;
            crate::schema::check_parameter_schema(schema)
                .unwrap_or_else(|err| panic!("{}: {err}", tool.spec.name));
            assert_eq!(schema["type"], "object", "{}", tool.spec.name);
            assert!(schema["properties"].is_object(), "{}", tool.spec.name);
            assert_eq!(schema["additionalProperties"], false, "{}", tool.spec.name);
            assert!(schema.get("$schema").is_none() && schema.get("title").is_none());
            assert!(!schema.to_string().contains("uint"), "{schema}");
        }
    }

    #[test]
    fn names_are_unique_and_context_free_set_is_exact() {
        let mut names: Vec<&str> = REGISTRY.iter().map(|t| t.spec.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len());
        let listed: Vec<String> = context_free_listing()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            listed,
            [
                "roll_dice",
                "random_choice",
                "get_time",
                "get_character_info"
            ]
        );
    }

    #[test]
    fn builtins_declare_their_metadata() {
        for tool in REGISTRY.iter() {
            let meta = &tool.spec.metadata;
            assert_eq!(meta.side_effect_level_basis, Basis::ToolDeclared);
            assert_eq!(meta.allowed_slots_basis, Basis::ToolDeclared);
            assert_eq!(meta.parameter_schema_basis, Basis::ToolDeclared);
            assert_eq!(meta.replay_safety_basis, Basis::InferredFromExecutionPolicy);
            let writes = matches!(
                tool.spec.name.as_str(),
                "set_variable" | "write_resource" | "delete_resource"
            );
            let expected = if writes {
                SideEffectLevel::Sandbox
            } else {
                SideEffectLevel::None
            };
            assert_eq!(meta.side_effect_level, expected, "{}", tool.spec.name);
        }
    }

    #[test]
    fn schemas_carry_the_bounds_the_code_relies_on() {
        let dice = &find("roll_dice").unwrap().spec.parameters;
        assert_eq!(dice["properties"]["sides"]["minimum"], 2);
        assert_eq!(dice["properties"]["count"]["maximum"], 100);
        assert_eq!(dice["properties"]["sides"]["default"], 6);
        let validator = &find("roll_dice").unwrap().validator;
        assert!(validator.is_valid(&json!({"sides": 20, "count": 2})));
        assert!(!validator.is_valid(&json!({"sides": 0})));
        assert!(!validator.is_valid(&json!({"count": 1_000_000_000})));
        assert!(!validator.is_valid(&json!({"dice": 2})));
    }
}
