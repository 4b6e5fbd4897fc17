//! Per-session tool permissions (`metadata_json.tool_permissions`): their defaults,
//! how PUT replaces and PATCH merges them, and the policy every call passes
//! through, in the order DESIGN.md fixes: enabled → the tool's `allowed_slots` →
//! slot allow list → slot deny list → `allow_irreversible` → calls-per-turn.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Value, json};

use crate::catalog::{Availability, Catalog};
use crate::domain::tool::{SideEffectLevel, Slot, ToolMetadata};
use crate::error::{Error, Result};
use crate::reason::ReasonCode;

/// The key under the session's `metadata_json` holding the permissions.
pub const METADATA_KEY: &str = "tool_permissions";
/// Highest accepted `max_calls_per_turn`.
pub const MAX_CALLS_PER_TURN: u64 = 1000;
/// Highest accepted `max_steps_per_generation`.
pub const MAX_STEPS_PER_GENERATION: u64 = 100;
/// Most tool names one slot's allow or deny list may hold.
pub const MAX_NAMES_PER_SLOT: usize = 256;
/// Longest tool name accepted in a slot list, in bytes.
pub const MAX_LISTED_NAME_BYTES: usize = 256;

const FIELDS: &str = "enabled, max_calls_per_turn, max_steps_per_generation, allow_irreversible, slot_allow_list, slot_deny_list, approval_required, approval_timeout_seconds";
/// How long an approval waits when `approval_timeout_seconds` is not given.
pub const DEFAULT_APPROVAL_TIMEOUT_SECONDS: u32 = 600;
/// Longest accepted `approval_timeout_seconds` (a week).
pub const MAX_APPROVAL_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;

/// Which calls wait for an operator's decision before they run: none, the
/// named tools, or every tool of a side-effect level.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ApprovalRule {
    #[default]
    None,
    Tools(Vec<String>),
    SideEffectLevel(SideEffectLevel),
}

impl ApprovalRule {
    fn covers(&self, tool: &str, metadata: &ToolMetadata) -> bool {
        match self {
            ApprovalRule::None => false,
            ApprovalRule::Tools(names) => names.iter().any(|name| name == tool),
            ApprovalRule::SideEffectLevel(level) => metadata.side_effect_level == *level,
        }
    }

    fn to_json(&self) -> Value {
        match self {
            ApprovalRule::None => json!([]),
            ApprovalRule::Tools(names) => json!(names),
            ApprovalRule::SideEffectLevel(level) => json!({"side_effect_level": level}),
        }
    }

    fn parse(key: &str, value: &Value) -> Result<Self> {
        match value {
            Value::Array(items) if items.is_empty() => Ok(ApprovalRule::None),
            Value::Array(items) => Ok(ApprovalRule::Tools(tool_names(key, "", items)?)),
            Value::Object(fields)
                if fields.len() == 1 && fields.contains_key("side_effect_level") =>
            {
                let level = serde_json::from_value(fields["side_effect_level"].clone()).map_err(|_| {
                    Error::validation(format!(
                        "`{key}.side_effect_level` must be none, sandbox or irreversible, got {}",
                        fields["side_effect_level"]
                    ))
                })?;
                Ok(ApprovalRule::SideEffectLevel(level))
            }
            other => Err(Error::validation(format!(
                "`{key}` must be a list of tool names or {{\"side_effect_level\": \"irreversible\"}}, got {other}"
            ))),
        }
    }
}

/// Tool names per slot. A slot with no key has no list; an allow list that is
/// present but empty allows nothing.
pub type SlotLists = BTreeMap<Slot, Vec<String>>;

/// A session's base tool permissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPermissions {
    pub enabled: bool,
    pub max_calls_per_turn: u32,
    pub max_steps_per_generation: u32,
    pub allow_irreversible: bool,
    pub slot_allow_list: SlotLists,
    pub slot_deny_list: SlotLists,
    /// Calls that wait for an operator (`POST /tool-executions/{id}/approve`).
    pub approval_required: ApprovalRule,
    /// How long such a call waits before it ends `denied` (`approval_timeout`).
    pub approval_timeout_seconds: u32,
}

impl Default for ToolPermissions {
    fn default() -> Self {
        Self {
            enabled: true,
            max_calls_per_turn: 10,
            max_steps_per_generation: 5,
            allow_irreversible: false,
            slot_allow_list: SlotLists::new(),
            slot_deny_list: SlotLists::new(),
            approval_required: ApprovalRule::None,
            approval_timeout_seconds: DEFAULT_APPROVAL_TIMEOUT_SECONDS,
        }
    }
}

/// Why the policy refused a call; each variant is one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `enabled` is false.
    Disabled,
    /// The tool itself allows only other slots.
    SlotNotAllowedByTool { slot: Slot, allowed: Vec<Slot> },
    /// The slot has an allow list and the tool is not on it.
    NotOnSlotAllowList { slot: Slot },
    /// The tool is on the slot's deny list.
    OnSlotDenyList { slot: Slot },
    /// The tool is irreversible and `allow_irreversible` is false.
    IrreversibleNotAllowed,
    /// The floor has used up `max_calls_per_turn`.
    CallLimitReached { limit: u32 },
}

impl Refusal {
    /// The name of the rule that refused, as the permissions object spells it.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::Disabled => "enabled",
            Refusal::SlotNotAllowedByTool { .. } => "allowed_slots",
            Refusal::NotOnSlotAllowList { .. } => "slot_allow_list",
            Refusal::OnSlotDenyList { .. } => "slot_deny_list",
            Refusal::IrreversibleNotAllowed => "allow_irreversible",
            Refusal::CallLimitReached { .. } => "max_calls_per_turn",
        }
    }

    /// The journal's reason code of this refusal, one per rule.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            Refusal::Disabled => ReasonCode::PermissionToolsDisabled,
            Refusal::SlotNotAllowedByTool { .. } => ReasonCode::PermissionSlotNotAllowedByTool,
            Refusal::NotOnSlotAllowList { .. } => ReasonCode::PermissionSlotNotOnAllowList,
            Refusal::OnSlotDenyList { .. } => ReasonCode::PermissionSlotOnDenyList,
            Refusal::IrreversibleNotAllowed => ReasonCode::PermissionIrreversibleNotAllowed,
            Refusal::CallLimitReached { .. } => ReasonCode::PermissionMaxCallsPerTurnExceeded,
        }
    }

    /// A message the model can act on, naming the tool and the rule.
    pub fn message(&self, tool: &str) -> String {
        let why = match self {
            Refusal::Disabled => "tools are disabled for this session (enabled = false)".to_owned(),
            Refusal::SlotNotAllowedByTool { slot, allowed } => format!(
                "the tool may only be called from the slots [{}], not from {slot}",
                allowed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Refusal::NotOnSlotAllowList { slot } => {
                format!("the tool is not on the allow list of slot {slot}")
            }
            Refusal::OnSlotDenyList { slot } => {
                format!("the tool is on the deny list of slot {slot}")
            }
            Refusal::IrreversibleNotAllowed => {
                "the tool has irreversible side effects and this session does not allow them (allow_irreversible = false)".to_owned()
            }
            Refusal::CallLimitReached { limit } => format!(
                "this turn already used its {limit} tool calls (max_calls_per_turn = {limit}); answer without more tool calls"
            ),
        };
        format!(
            "tool call to {tool:?} refused by the session's tool permissions, rule `{}`: {why}",
            self.rule()
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rule())
    }
}

impl ToolPermissions {
    /// The permissions stored in a session's `metadata_json`, defaults when none
    /// are. Only this module writes them, so a stored value that does not parse is
    /// a server fault, not something to paper over with defaults.
    pub fn from_metadata(metadata: &Value) -> Result<Self> {
        match metadata.get(METADATA_KEY) {
            None | Some(Value::Null) => Ok(Self::default()),
            Some(stored) => Self::replaced(stored).map_err(|err| {
                Error::Internal(anyhow::anyhow!(
                    "stored tool_permissions do not parse: {err}"
                ))
            }),
        }
    }

    /// The permissions as the API shows and stores them: every field.
    pub fn to_json(&self) -> Value {
        let lists = |lists: &SlotLists| -> Value {
            Value::Object(
                lists
                    .iter()
                    .map(|(slot, names)| (slot.as_str().to_owned(), json!(names)))
                    .collect(),
            )
        };
        let mut shown = json!({
            "enabled": self.enabled,
            "max_calls_per_turn": self.max_calls_per_turn,
            "max_steps_per_generation": self.max_steps_per_generation,
            "allow_irreversible": self.allow_irreversible,
            "slot_allow_list": lists(&self.slot_allow_list),
            "slot_deny_list": lists(&self.slot_deny_list),
        });
        // The seed's object has six fields; the approval ones appear once used.
        let approvals = self.approval_required != ApprovalRule::None
            || self.approval_timeout_seconds != DEFAULT_APPROVAL_TIMEOUT_SECONDS;
        if let (true, Value::Object(fields)) = (approvals, &mut shown) {
            fields.insert("approval_required".into(), self.approval_required.to_json());
            fields.insert(
                "approval_timeout_seconds".into(),
                json!(self.approval_timeout_seconds),
            );
        }
        shown
    }

    /// Whether a call of `tool` waits for an operator's decision.
    pub fn needs_approval(&self, tool: &str, metadata: &ToolMetadata) -> bool {
        self.approval_required.covers(tool, metadata)
    }

    /// A PUT body: the whole object, missing fields taking their defaults.
    pub fn replaced(body: &Value) -> Result<Self> {
        let update = Update::parse(body, false)?;
        let mut permissions = Self::default();
        permissions.apply(update);
        Ok(permissions)
    }

    /// A PATCH body merged onto `self`: slot lists per slot key (a `null` list
    /// removes that slot's key), other fields overwrite. An empty body is refused.
    pub fn patched(&self, body: &Value) -> Result<Self> {
        let update = Update::parse(body, true)?;
        if update.is_empty() {
            return Err(Error::validation(format!(
                "PATCH needs at least one field; fields are {FIELDS}"
            )));
        }
        let mut permissions = self.clone();
        permissions.apply(update);
        Ok(permissions)
    }

    fn apply(&mut self, update: Update) {
        if let Some(value) = update.enabled {
            self.enabled = value;
        }
        if let Some(value) = update.max_calls_per_turn {
            self.max_calls_per_turn = value;
        }
        if let Some(value) = update.max_steps_per_generation {
            self.max_steps_per_generation = value;
        }
        if let Some(value) = update.allow_irreversible {
            self.allow_irreversible = value;
        }
        if let Some(rule) = update.approval_required {
            self.approval_required = rule;
        }
        if let Some(value) = update.approval_timeout_seconds {
            self.approval_timeout_seconds = value;
        }
        for (target, lists) in [
            (&mut self.slot_allow_list, update.slot_allow_list),
            (&mut self.slot_deny_list, update.slot_deny_list),
        ] {
            for (slot, names) in lists.into_iter().flatten() {
                match names {
                    Some(names) => {
                        target.insert(slot, names);
                    }
                    None => {
                        target.remove(&slot);
                    }
                }
            }
        }
    }

    /// The policy rules before the call budget, in their fixed order.
    pub fn check(
        &self,
        tool: &str,
        metadata: &ToolMetadata,
        slot: Slot,
    ) -> std::result::Result<(), Refusal> {
        if !self.enabled {
            return Err(Refusal::Disabled);
        }
        if !metadata.allowed_slots.is_empty() && !metadata.allowed_slots.contains(&slot) {
            return Err(Refusal::SlotNotAllowedByTool {
                slot,
                allowed: metadata.allowed_slots.clone(),
            });
        }
        if let Some(allowed) = self.slot_allow_list.get(&slot)
            && !allowed.iter().any(|name| name == tool)
        {
            return Err(Refusal::NotOnSlotAllowList { slot });
        }
        if let Some(denied) = self.slot_deny_list.get(&slot)
            && denied.iter().any(|name| name == tool)
        {
            return Err(Refusal::OnSlotDenyList { slot });
        }
        if let Some(refusal) = self.irreversible_refusal(tool, metadata) {
            return Err(refusal);
        }
        Ok(())
    }

    /// The rules that refuse a tool whatever slot calls it.
    pub fn session_wide_refusal(&self, tool: &str, metadata: &ToolMetadata) -> Option<Refusal> {
        if !self.enabled {
            Some(Refusal::Disabled)
        } else {
            self.irreversible_refusal(tool, metadata)
        }
    }

    /// An irreversible tool needs `allow_irreversible`, or an operator's
    /// approval of each call (`approval_required` covering it).
    fn irreversible_refusal(&self, tool: &str, metadata: &ToolMetadata) -> Option<Refusal> {
        let irreversible = metadata.side_effect_level == SideEffectLevel::Irreversible;
        (irreversible && !self.allow_irreversible && !self.needs_approval(tool, metadata))
            .then_some(Refusal::IrreversibleNotAllowed)
    }

    /// Applies the permissions to a catalog for display. Without a slot, tools the
    /// session refuses to every slot become `unavailable` with the rule as reason;
    /// with a slot, only the tools that slot may call now remain.
    pub fn apply_to_catalog(&self, catalog: &mut Catalog, slot: Option<Slot>) {
        match slot {
            None => {
                for entry in &mut catalog.entries {
                    if entry.availability != Availability::Available {
                        continue;
                    }
                    if let Some(refusal) =
                        self.session_wide_refusal(&entry.spec.name, &entry.spec.metadata)
                    {
                        entry.availability = Availability::Unavailable;
                        entry.availability_reason = Some(refusal.message(&entry.spec.name));
                    }
                }
            }
            Some(slot) => catalog.entries.retain(|entry| {
                entry.availability == Availability::Available
                    && self
                        .check(&entry.spec.name, &entry.spec.metadata, slot)
                        .is_ok()
            }),
        }
    }
}

/// A parsed PUT or PATCH body: `None` means "not given". In slot lists, a `None`
/// list (JSON `null`, PATCH only) removes that slot's key.
#[derive(Debug, Default)]
struct Update {
    enabled: Option<bool>,
    max_calls_per_turn: Option<u32>,
    max_steps_per_generation: Option<u32>,
    allow_irreversible: Option<bool>,
    slot_allow_list: Option<BTreeMap<Slot, Option<Vec<String>>>>,
    slot_deny_list: Option<BTreeMap<Slot, Option<Vec<String>>>>,
    approval_required: Option<ApprovalRule>,
    approval_timeout_seconds: Option<u32>,
}

impl Update {
    fn is_empty(&self) -> bool {
        self.enabled.is_none()
            && self.max_calls_per_turn.is_none()
            && self.max_steps_per_generation.is_none()
            && self.allow_irreversible.is_none()
            && self.slot_allow_list.as_ref().is_none_or(BTreeMap::is_empty)
            && self.slot_deny_list.as_ref().is_none_or(BTreeMap::is_empty)
            && self.approval_required.is_none()
            && self.approval_timeout_seconds.is_none()
    }

    /// Parses by hand rather than with serde so that every message names the field
    /// and what it must be.
    fn parse(body: &Value, allow_null_lists: bool) -> Result<Self> {
        let Value::Object(fields) = body else {
            return Err(Error::validation("tool permissions must be a JSON object"));
        };
        let mut update = Update::default();
        for (key, value) in fields {
            match key.as_str() {
                "enabled" => update.enabled = Some(boolean(key, value)?),
                "allow_irreversible" => update.allow_irreversible = Some(boolean(key, value)?),
                "max_calls_per_turn" => {
                    update.max_calls_per_turn = Some(count(key, value, MAX_CALLS_PER_TURN)?)
                }
                "max_steps_per_generation" => {
                    update.max_steps_per_generation =
                        Some(count(key, value, MAX_STEPS_PER_GENERATION)?)
                }
                "slot_allow_list" => {
                    update.slot_allow_list = Some(slot_lists(key, value, allow_null_lists)?)
                }
                "slot_deny_list" => {
                    update.slot_deny_list = Some(slot_lists(key, value, allow_null_lists)?)
                }
                "approval_required" => {
                    update.approval_required = Some(ApprovalRule::parse(key, value)?)
                }
                "approval_timeout_seconds" => {
                    // One message for every value out of range, 0 included.
                    let seconds = count(key, value, MAX_APPROVAL_TIMEOUT_SECONDS)
                        .ok()
                        .filter(|&seconds| seconds > 0)
                        .ok_or_else(|| {
                            Error::validation(format!(
                                "`{key}` must be an integer from 1 to {MAX_APPROVAL_TIMEOUT_SECONDS} seconds, got {value}"
                            ))
                        })?;
                    update.approval_timeout_seconds = Some(seconds);
                }
                other => {
                    return Err(Error::validation(format!(
                        "unknown field `{other}`; fields are {FIELDS}"
                    )));
                }
            }
        }
        Ok(update)
    }
}

fn boolean(key: &str, value: &Value) -> Result<bool> {
    value
        .as_bool()
        .ok_or_else(|| Error::validation(format!("`{key}` must be true or false, got {value}")))
}

fn count(key: &str, value: &Value, max: u64) -> Result<u32> {
    match value.as_u64() {
        Some(n) if n <= max => Ok(n as u32),
        _ => Err(Error::validation(format!(
            "`{key}` must be an integer from 0 to {max}, got {value}"
        ))),
    }
}

fn slot_lists(
    key: &str,
    value: &Value,
    allow_null_lists: bool,
) -> Result<BTreeMap<Slot, Option<Vec<String>>>> {
    let Value::Object(map) = value else {
        return Err(Error::validation(format!(
            "`{key}` must be an object mapping slot names to arrays of tool names, got {value}"
        )));
    };
    let mut lists = BTreeMap::new();
    for (raw_slot, names) in map {
        let slot =
            Slot::parse(raw_slot).map_err(|err| Error::validation(format!("`{key}`: {err}")))?;
        let names = match names {
            Value::Null if allow_null_lists => None,
            Value::Array(items) => Some(tool_names(key, raw_slot, items)?),
            other => {
                let expected = if allow_null_lists {
                    "an array of tool names, or null to remove the list"
                } else {
                    "an array of tool names"
                };
                return Err(Error::validation(format!(
                    "`{key}.{raw_slot}` must be {expected}, got {other}"
                )));
            }
        };
        lists.insert(slot, names);
    }
    Ok(lists)
}

fn tool_names(key: &str, slot: &str, items: &[Value]) -> Result<Vec<String>> {
    // A slot's list is `key.slot`; a list of its own is just `key`.
    let field = if slot.is_empty() {
        key.to_owned()
    } else {
        format!("{key}.{slot}")
    };
    if items.len() > MAX_NAMES_PER_SLOT {
        return Err(Error::validation(format!(
            "`{field}` may list at most {MAX_NAMES_PER_SLOT} tools"
        )));
    }
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        match item.as_str() {
            Some(name) if !name.is_empty() && name.len() <= MAX_LISTED_NAME_BYTES => {
                if !names.iter().any(|known| known == name) {
                    names.push(name.to_owned());
                }
            }
            _ => {
                return Err(Error::validation(format!(
                    "`{field}` must hold tool names (strings of 1-{MAX_LISTED_NAME_BYTES} bytes), got {}",
                    described(item)
                )));
            }
        }
    }
    Ok(names)
}

/// A refused list item as a refusal names it: short values whole, a long
/// string by its length only (a refusal must not echo a huge body back).
fn described(item: &Value) -> String {
    match item {
        Value::String(text) if text.len() > MAX_LISTED_NAME_BYTES => {
            format!("a string of {} bytes", text.len())
        }
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{CatalogEntry, NotCallable};

    use crate::domain::tool::{Basis, SideEffectLevel};

    fn meta(level: SideEffectLevel, slots: Vec<Slot>) -> ToolMetadata {
        ToolMetadata::declared(level, slots, None)
    }

    #[test]
    fn defaults_match_the_seed() {
        let permissions = ToolPermissions::from_metadata(&json!({})).unwrap();
        assert_eq!(
            permissions.to_json(),
            json!({
                "enabled": true,
                "max_calls_per_turn": 10,
                "max_steps_per_generation": 5,
                "allow_irreversible": false,
                "slot_allow_list": {},
                "slot_deny_list": {},
            })
        );
    }

    #[test]
    fn rules_are_checked_in_order() {
        // A call that breaks every rule is refused by the first one; lifting each
        // rule in turn reveals the next, proving the order.
        let tool = "dangerous";
        let metadata = meta(SideEffectLevel::Irreversible, vec![Slot::Director]);
        let mut permissions = ToolPermissions {
            enabled: false,
            allow_irreversible: false,
            slot_allow_list: SlotLists::from([(Slot::Narrator, vec!["other".into()])]),
            slot_deny_list: SlotLists::from([(Slot::Narrator, vec![tool.into()])]),
            ..Default::default()
        };
        let rule = |p: &ToolPermissions, m: &ToolMetadata| {
            p.check(tool, m, Slot::Narrator).err().map(|r| r.rule())
        };
        assert_eq!(rule(&permissions, &metadata), Some("enabled"));
        permissions.enabled = true;
        assert_eq!(rule(&permissions, &metadata), Some("allowed_slots"));
        let metadata = meta(SideEffectLevel::Irreversible, vec![Slot::Narrator]);
        assert_eq!(rule(&permissions, &metadata), Some("slot_allow_list"));
        permissions
            .slot_allow_list
            .insert(Slot::Narrator, vec!["other".into(), tool.into()]);
        assert_eq!(rule(&permissions, &metadata), Some("slot_deny_list"));
        permissions.slot_deny_list.clear();
        assert_eq!(rule(&permissions, &metadata), Some("allow_irreversible"));
        permissions.allow_irreversible = true;
        assert_eq!(rule(&permissions, &metadata), None);
    }

    #[test]
    fn lists_only_bind_their_own_slot() {
        let permissions = ToolPermissions {
            slot_allow_list: SlotLists::from([(Slot::Narrator, vec!["roll_dice".into()])]),
            slot_deny_list: SlotLists::from([(Slot::Verifier, vec!["get_time".into()])]),
            ..Default::default()
        };
        let metadata = meta(SideEffectLevel::None, vec![]);
        assert!(
            permissions
                .check("roll_dice", &metadata, Slot::Narrator)
                .is_ok()
        );
        assert!(
            permissions
                .check("get_time", &metadata, Slot::Narrator)
                .is_err()
        );
        assert!(
            permissions
                .check("get_time", &metadata, Slot::Director)
                .is_ok()
        );
        assert_eq!(
            permissions
                .check("get_time", &metadata, Slot::Verifier)
                .unwrap_err()
                .rule(),
            "slot_deny_list"
        );
        // An allow list that is present but empty allows nothing.
        let empty = ToolPermissions {
            slot_allow_list: SlotLists::from([(Slot::Memory, vec![])]),
            ..Default::default()
        };
        assert!(empty.check("roll_dice", &metadata, Slot::Memory).is_err());
        // Sandbox tools need no permission beyond the defaults.
        let sandbox = meta(SideEffectLevel::Sandbox, vec![]);
        assert_eq!(sandbox.side_effect_level_basis, Basis::ToolDeclared);
        assert!(
            ToolPermissions::default()
                .check("set_variable", &sandbox, Slot::Narrator)
                .is_ok()
        );
    }

    fn entry(name: &str, provider_id: &str, level: SideEffectLevel) -> CatalogEntry {
        crate::catalog::testing::entry(name, provider_id, meta(level, vec![]))
    }

    #[test]
    fn conflicts_stay_visible_but_are_never_callable() {
        let mut catalog = Catalog::assemble(
            "sess_1",
            vec![
                entry("roll_dice", "builtin", SideEffectLevel::None),
                entry("roll_dice", "remote:Lanlan", SideEffectLevel::None),
                entry("get_time", "builtin", SideEffectLevel::None),
                entry("launch", "remote:Lanlan", SideEffectLevel::Irreversible),
            ],
        );
        assert_eq!(catalog.conflicts.len(), 1);
        assert_eq!(
            catalog.conflicts[0].provider_ids,
            ["builtin", "remote:Lanlan"]
        );
        assert!(matches!(
            catalog.lookup("roll_dice"),
            Err(NotCallable::Conflict(_))
        ));
        let dice: Vec<Value> = catalog
            .entries
            .iter()
            .filter(|e| e.spec.name == "roll_dice")
            .map(CatalogEntry::to_json)
            .collect();
        assert_eq!(dice.len(), 2);
        for json in &dice {
            assert_eq!(json["availability"], "conflict");
            assert!(
                json["availability_reason"]
                    .as_str()
                    .unwrap()
                    .contains("remote:Lanlan")
            );
        }
        let mut narrowed = catalog.clone();
        ToolPermissions::default().apply_to_catalog(&mut narrowed, Some(Slot::Narrator));
        let names: Vec<&str> = narrowed
            .entries
            .iter()
            .map(|e| e.spec.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["get_time"],
            "conflicts and irreversible tools are not callable"
        );
        ToolPermissions::default().apply_to_catalog(&mut catalog, None);
        let launch = catalog
            .entries
            .iter()
            .find(|e| e.spec.name == "launch")
            .unwrap();
        assert_eq!(launch.availability, Availability::Unavailable);
        assert!(
            launch
                .availability_reason
                .as_deref()
                .unwrap()
                .contains("`allow_irreversible`")
        );
        let conflicted = catalog
            .entries
            .iter()
            .filter(|e| e.availability == Availability::Conflict);
        assert_eq!(
            conflicted.count(),
            2,
            "session-wide rules leave conflicts as they are"
        );
    }

    #[test]
    fn put_replaces_and_fills_defaults() {
        let stored = ToolPermissions::replaced(&json!({
            "max_calls_per_turn": 3,
            "slot_deny_list": {"verifier": ["set_variable", "set_variable"]},
        }))
        .unwrap();
        assert_eq!(stored.max_calls_per_turn, 3);
        assert!(stored.enabled);
        assert_eq!(stored.max_steps_per_generation, 5);
        assert_eq!(
            stored.slot_deny_list.get(&Slot::Verifier).unwrap(),
            &vec!["set_variable".to_owned()]
        );
    }

    #[test]
    fn patch_merges_slot_lists_per_key() {
        let current = ToolPermissions::replaced(&json!({
            "slot_allow_list": {"narrator": ["roll_dice", "get_time"]},
            "slot_deny_list": {"verifier": ["set_variable"]},
        }))
        .unwrap();
        let merged = current
            .patched(&json!({
                "max_calls_per_turn": 20,
                "slot_allow_list": {"director": ["get_time"]},
            }))
            .unwrap();
        assert_eq!(merged.max_calls_per_turn, 20);
        assert_eq!(
            merged.to_json()["slot_allow_list"],
            json!({"narrator": ["roll_dice", "get_time"], "director": ["get_time"]})
        );
        assert_eq!(
            merged.to_json()["slot_deny_list"],
            json!({"verifier": ["set_variable"]})
        );
        let removed = merged
            .patched(&json!({"slot_allow_list": {"narrator": null}}))
            .unwrap();
        assert_eq!(
            removed.to_json()["slot_allow_list"],
            json!({"director": ["get_time"]})
        );
    }

    #[test]
    fn bad_bodies_are_validation_errors() {
        let current = ToolPermissions::default();
        for body in [
            json!({}),
            json!([]),
            json!({"max_calls_per_turn": -1}),
            json!({"max_calls_per_turn": 1.5}),
            json!({"max_calls_per_turn": "3"}),
            json!({"max_calls_per_turn": 1001}),
            json!({"enabled": "yes"}),
            json!({"enabled": null}),
            json!({"unknown": true}),
            json!({"slot_allow_list": {"writer": ["x"]}}),
            json!({"slot_allow_list": ["x"]}),
            json!({"slot_allow_list": {"narrator": "roll_dice"}}),
            json!({"slot_allow_list": {"narrator": [1]}}),
            json!({"slot_allow_list": {"narrator": [""]}}),
        ] {
            let err = current.patched(&body).unwrap_err();
            assert!(matches!(err, Error::Validation(_)), "{body}: {err:?}");
        }
        assert!(ToolPermissions::replaced(&json!({"slot_deny_list": {"narrator": null}})).is_err());
        assert!(ToolPermissions::replaced(&json!({})).is_ok());
        // A huge refused name is described, not echoed.
        let huge = "y".repeat(200_000);
        let err = current
            .patched(&json!({"slot_deny_list": {"narrator": [huge]}}))
            .unwrap_err()
            .to_string();
        assert!(
            err.len() < 200 && err.contains("a string of 200000 bytes"),
            "{err}"
        );
    }

    #[test]
    fn every_approval_timeout_out_of_range_gets_the_same_rule() {
        let current = ToolPermissions::default();
        for value in [json!(0), json!(-1), json!(604_801), json!("60")] {
            let body = json!({ "approval_timeout_seconds": value });
            let err = current.patched(&body).unwrap_err().to_string();
            assert!(
                err.contains("must be an integer from 1 to 604800 seconds"),
                "{body}: {err}"
            );
        }
        let body = json!({"approval_timeout_seconds": 1});
        assert_eq!(current.patched(&body).unwrap().approval_timeout_seconds, 1);
    }
}
