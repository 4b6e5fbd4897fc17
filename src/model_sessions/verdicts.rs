//! What a live model session is offered, and the verdicts of one catalog
//! mutation's syncs kept by what decided them.
//!
//! A registration into every role reaches every live model session, and the
//! sessions of different characters are mostly offered the very same tools:
//! the builtins, and the plugin's registration, whose spec every role shares.
//! What a session takes depends only on its catalog's entries (which specs,
//! how available), its permissions, its slot and its model provider. So each
//! distinct combination is assembled and checked once per mutation instead
//! of once per session: the assembly, the permissions and the provider's
//! check were 9,000 of the 12,300 instructions each live session cost a
//! registration (BENCHMARKS.md, issue 20).
//!
//! Specs are compared by address. Every spec of a decided combination is
//! held here until the mutation's syncs end, so no address seen here can be
//! taken by another spec meanwhile; two equal specs at different addresses
//! only miss the sharing, never share wrongly.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use super::{AcceptedTools, ModelProvider};
use crate::catalog::{Catalog, CatalogEntry, EntryKey};
use crate::domain::tool::{Slot, ToolSpec};
use crate::permissions::ToolPermissions;

/// What a session's model is offered, before it is assembled: every
/// provider's entries and the session's permissions, as they are now.
pub struct Offer {
    pub session_id: String,
    pub entries: Vec<CatalogEntry>,
    pub permissions: ToolPermissions,
}

impl Offer {
    /// The catalog offered for `slot` (every slot's session-wide rules when
    /// `None`): the entries assembled (shared names marked as conflicts),
    /// then only what the permissions allow.
    pub fn catalog(self, slot: Option<Slot>) -> Catalog {
        let mut catalog = Catalog::assemble(&self.session_id, self.entries);
        self.permissions.apply_to_catalog(&mut catalog, slot);
        catalog
    }
}

/// What decides a session's verdict, read without building its catalog
/// entries: every provider's entry keys (in the providers' order) and the
/// session's permissions, as they are now.
pub struct OfferKey {
    pub entries: Vec<EntryKey>,
    pub permissions: ToolPermissions,
}

/// The tools a session takes, or why its provider cannot take its catalog.
pub(super) type Verdict = std::result::Result<AcceptedTools, String>;

/// One mutation's verdicts.
#[derive(Default)]
pub(super) struct Verdicts {
    decided: Vec<Decided>,
}

/// A verdict and what decided it.
struct Decided {
    hash: u64,
    slot: Slot,
    provider: ModelProvider,
    /// Each entry's spec by address, and its availability.
    tools: Vec<EntryKey>,
    permissions: ToolPermissions,
    /// The specs `tools` names, held so their addresses stay theirs.
    _specs: Vec<Arc<ToolSpec>>,
    verdict: Verdict,
}

impl Verdicts {
    /// The verdict of a combination decided earlier in this mutation whose
    /// entries and permissions `key` gives, if there is one. Only a spec
    /// held by an earlier verdict can have the address a key names, so an
    /// equal key is that very catalog.
    pub(super) fn known(
        &self,
        key: &OfferKey,
        slot: Slot,
        provider: ModelProvider,
    ) -> Option<Verdict> {
        let hash = hash_of(slot, &key.entries);
        self.find(hash, &key.entries, &key.permissions, slot, provider)
            .map(|decided| decided.verdict.clone())
    }

    fn find(
        &self,
        hash: u64,
        tools: &[EntryKey],
        permissions: &ToolPermissions,
        slot: Slot,
        provider: ModelProvider,
    ) -> Option<&Decided> {
        self.decided.iter().find(|decided| {
            decided.hash == hash
                && decided.slot == slot
                && decided.provider == provider
                && decided.tools == tools
                && decided.permissions == *permissions
        })
    }

    /// What a session offered `offer` for `slot` takes through `provider`:
    /// the verdict of an equal combination decided earlier in this mutation,
    /// or a new one.
    pub(super) fn verdict(&mut self, offer: Offer, slot: Slot, provider: ModelProvider) -> Verdict {
        let tools: Vec<EntryKey> = offer.entries.iter().map(EntryKey::of).collect();
        let hash = hash_of(slot, &tools);
        if let Some(decided) = self.find(hash, &tools, &offer.permissions, slot, provider) {
            return decided.verdict.clone();
        }
        let specs = offer
            .entries
            .iter()
            .map(|entry| entry.spec.clone())
            .collect();
        let permissions = offer.permissions.clone();
        let verdict = provider.accept(&offer.catalog(Some(slot)));
        self.decided.push(Decided {
            hash,
            slot,
            provider,
            tools,
            permissions,
            _specs: specs,
            verdict: verdict.clone(),
        });
        verdict
    }
}

fn hash_of(slot: Slot, tools: &[EntryKey]) -> u64 {
    let mut hasher = foldhash::fast::FixedState::default().build_hasher();
    slot.hash(&mut hasher);
    tools.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::tool::{SideEffectLevel, ToolMetadata};

    /// An available tool without side effects, callable from every slot.
    fn entry(name: &str, provider_id: &str) -> CatalogEntry {
        let metadata = ToolMetadata::declared(SideEffectLevel::None, Vec::new(), None);
        crate::catalog::testing::entry(name, provider_id, metadata)
    }

    fn offer(entries: &[CatalogEntry], permissions: ToolPermissions) -> Offer {
        Offer {
            session_id: "sess_test".into(),
            entries: entries.to_vec(),
            permissions,
        }
    }

    fn names(verdict: &Verdict) -> Vec<&str> {
        verdict
            .as_ref()
            .expect("accepted")
            .iter()
            .map(|tool| tool.name.as_str())
            .collect()
    }

    fn denying(name: &str) -> ToolPermissions {
        ToolPermissions {
            slot_deny_list: [(Slot::Narrator, vec![name.to_owned()])].into(),
            ..Default::default()
        }
    }

    const OPENAI: ModelProvider = ModelProvider::OpenAiCompatible;

    /// A builtin and a plugin's tool, each spec new.
    fn two_tools() -> [CatalogEntry; 2] {
        [
            entry("roll_dice", "builtin"),
            entry("weather", "remote:plugin:test"),
        ]
    }

    #[test]
    fn an_equal_combination_is_decided_once() {
        let entries = two_tools();
        let mut verdicts = Verdicts::default();
        let first = verdicts.verdict(offer(&entries, Default::default()), Slot::Narrator, OPENAI);
        let again = verdicts.verdict(offer(&entries, Default::default()), Slot::Narrator, OPENAI);
        assert_eq!(names(&first), ["roll_dice", "weather"]);
        assert_eq!(names(&again), names(&first));
        assert_eq!(
            verdicts.decided.len(),
            1,
            "the second session shared the first's"
        );
    }

    #[test]
    fn permissions_slots_availability_and_other_specs_are_decided_apart() {
        let entries = two_tools();
        let mut verdicts = Verdicts::default();
        let open = verdicts.verdict(offer(&entries, Default::default()), Slot::Narrator, OPENAI);
        assert_eq!(names(&open), ["roll_dice", "weather"]);

        let denied = verdicts.verdict(offer(&entries, denying("weather")), Slot::Narrator, OPENAI);
        assert_eq!(names(&denied), ["roll_dice"], "its own permissions");

        let other_slot =
            verdicts.verdict(offer(&entries, denying("weather")), Slot::Director, OPENAI);
        assert_eq!(names(&other_slot), ["roll_dice", "weather"], "its own slot");

        let mut unavailable = entries.to_vec();
        unavailable[1] = unavailable[1].clone().unavailable("the plugin is gone");
        let gone = verdicts.verdict(
            offer(&unavailable, Default::default()),
            Slot::Narrator,
            OPENAI,
        );
        assert_eq!(names(&gone), ["roll_dice"], "its own availability");

        // Equal content at another address is decided again, to the same end.
        let copies = two_tools();
        let copied = verdicts.verdict(offer(&copies, Default::default()), Slot::Narrator, OPENAI);
        assert_eq!(names(&copied), names(&open));
        assert_eq!(verdicts.decided.len(), 5);
    }

    fn key(entries: &[CatalogEntry], permissions: ToolPermissions) -> OfferKey {
        OfferKey {
            entries: entries.iter().map(EntryKey::of).collect(),
            permissions,
        }
    }

    #[test]
    fn a_key_finds_only_the_verdict_decided_for_its_very_specs_and_rules() {
        let entries = two_tools();
        let mut verdicts = Verdicts::default();
        let open = Default::default;
        assert!(
            verdicts
                .known(&key(&entries, open()), Slot::Narrator, OPENAI)
                .is_none(),
            "nothing decided yet"
        );
        let decided = verdicts.verdict(offer(&entries, open()), Slot::Narrator, OPENAI);
        let found = verdicts.known(&key(&entries, open()), Slot::Narrator, OPENAI);
        assert_eq!(names(&found.expect("the same specs")), names(&decided));

        let misses = [
            (key(&entries, denying("weather")), Slot::Narrator),
            (key(&entries, open()), Slot::Director),
            (key(&entries[..1], open()), Slot::Narrator),
            (key(&two_tools(), open()), Slot::Narrator),
        ];
        for (other, slot) in misses {
            assert!(verdicts.known(&other, slot, OPENAI).is_none());
        }
        let mut unavailable = entries.to_vec();
        unavailable[1] = unavailable[1].clone().unavailable("the plugin is gone");
        assert!(
            verdicts
                .known(&key(&unavailable, open()), Slot::Narrator, OPENAI)
                .is_none()
        );
    }

    #[test]
    fn a_refusal_is_shared_like_an_acceptance() {
        let entries: Vec<CatalogEntry> = (0..=ModelProvider::OPENAI_MAX_TOOLS)
            .map(|n| entry(&format!("tool_{n:03}"), "builtin"))
            .collect();
        let mut verdicts = Verdicts::default();
        let first = verdicts.verdict(offer(&entries, Default::default()), Slot::Narrator, OPENAI);
        let again = verdicts.verdict(offer(&entries, Default::default()), Slot::Narrator, OPENAI);
        let reason = first.expect_err("too many tools");
        assert!(reason.contains("at most 128"), "{reason}");
        assert_eq!(again.expect_err("too many tools"), reason);
        assert_eq!(verdicts.decided.len(), 1);
    }
}
