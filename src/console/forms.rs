//! What the console's forms post: url-encoded fields (repeated names kept, as
//! checkboxes send them), the same-site check every post passes, and the
//! translation of the permission form into the API's permissions object.

use serde_json::{Map, Value, json};

use crate::domain::tool::Slot;
use crate::error::{Error, Result};

/// Most fields one form may carry.
pub const MAX_FIELDS: usize = 2000;

/// A posted form's fields in order.
#[derive(Debug, Default, Clone)]
pub struct Fields(Vec<(String, String)>);

impl Fields {
    /// Parses an `application/x-www-form-urlencoded` body.
    pub fn parse(body: &[u8]) -> Result<Self> {
        let fields: Vec<(String, String)> = form_urlencoded::parse(body)
            .take(MAX_FIELDS + 1)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if fields.len() > MAX_FIELDS {
            return Err(Error::validation(format!(
                "a form may carry at most {MAX_FIELDS} fields"
            )));
        }
        // As the API refuses it (src/api/extract.rs): PostgreSQL cannot store it.
        if fields
            .iter()
            .any(|(key, value)| key.contains('\0') || value.contains('\0'))
        {
            return Err(Error::validation(
                "form fields must not contain U+0000 (NUL): the database cannot store it",
            ));
        }
        Ok(Self(fields))
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .collect()
    }

    /// Whether a checkbox named `name` was ticked.
    pub fn checked(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The value of `name`, required.
    pub fn required(&self, name: &str) -> Result<&str> {
        self.get(name)
            .ok_or_else(|| Error::validation(format!("the form field {name} is missing")))
    }
}

/// Whether a post comes from another site: its `Origin` (or, without one, its
/// `Referer`) names another origin than the one it was sent to, or the browser
/// says so (`Sec-Fetch-Site: cross-site`). A post with neither header (a
/// non-browser client) is not cross-site; its CSRF token still has to be valid.
pub fn is_cross_site(
    host: Option<&str>,
    origin: Option<&str>,
    referer: Option<&str>,
    sec_fetch_site: Option<&str>,
) -> bool {
    if sec_fetch_site == Some("cross-site") {
        return true;
    }
    let claimed = match (origin, referer) {
        (Some(origin), _) => origin,
        (None, Some(referer)) => referer,
        (None, None) => return false,
    };
    let Some(host) = host else {
        return true;
    };
    match url::Url::parse(claimed) {
        Ok(url) => {
            let Some(name) = url.host_str() else {
                return true;
            };
            let (host_name, host_port) = split_host(host);
            // `Host: console.example.com:443` and `Origin:
            // https://console.example.com` name the same origin.
            let scheme_default = match url.scheme() {
                "http" => Some(80),
                "https" => Some(443),
                _ => None,
            };
            let port = host_port.or(scheme_default);
            !(name.eq_ignore_ascii_case(host_name) && port == url.port_or_known_default())
        }
        // `Origin: null` (sandboxed or opaque) and anything unparsable.
        Err(_) => true,
    }
}

/// A `Host` header's name and port (`[::1]:8700` keeps its brackets, as a
/// URL's host does).
fn split_host(host: &str) -> (&str, Option<u16>) {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') || name.ends_with(']') => match port.parse() {
            Ok(port) => (name, Some(port)),
            Err(_) => (host, None),
        },
        _ => (host, None),
    }
}

/// Names from a text area, one per line: a tool's name may hold spaces and
/// commas (runtime tools may be named so), so nothing else separates them.
pub fn names(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether a stored list reads back unchanged from a textarea of one name
/// per line. The API takes names holding line breaks or edge spaces, which
/// such a textarea would split or trim: the form leaves those lists alone
/// (its `keep_allow_<slot>` / `keep_deny_<slot>` fields) instead of
/// rewriting them.
pub fn fits_one_per_line(names: &[String]) -> bool {
    names
        .iter()
        .all(|name| !name.contains(['\n', '\r']) && name.trim() == name)
}

/// The name of the permission form's hidden field holding
/// [`permissions_version`] of the permissions it was drawn from.
pub const PERMISSIONS_VERSION: &str = "permissions_version";

/// A digest of `permissions` as stored: the form sends back the one it was
/// drawn from, and a save is refused when the stored one differs (a change
/// made meanwhile, in the API or another tab, is never overwritten).
pub fn permissions_version(permissions: &Value) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(permissions.to_string().as_bytes())[..16])
}

/// The permissions fields the form shows, as a `PATCH
/// /sessions/{id}/tool-permissions` body: checkboxes `enabled`,
/// `allow_irreversible`, numbers `max_calls_per_turn`,
/// `max_steps_per_generation`, and per slot `deny_<slot>` names,
/// `allow_<slot>` names with `restrict_<slot>` ticked when the slot has an
/// allow list at all (an empty one allows nothing). A slot without a list
/// is `null` (removed). Fields the form does not show (the approval rule and
/// its timeout) are left out, so a save keeps them.
pub fn permissions_body(fields: &Fields) -> Result<Value> {
    let number = |name: &str| -> Result<Value> {
        let raw = fields.required(name)?.trim();
        raw.parse::<u64>()
            .map(|n| json!(n))
            .map_err(|_| Error::validation(format!("{name} must be a whole number")))
    };
    let mut allow = Map::new();
    let mut deny = Map::new();
    for slot in Slot::ALL {
        let slot_name = slot.as_str();
        // A list the form could not show is left out: the PATCH keeps it.
        if !fields.checked(&format!("keep_allow_{slot_name}")) {
            let listed = fields.checked(&format!("restrict_{slot_name}")).then(|| {
                json!(names(
                    fields.get(&format!("allow_{slot_name}")).unwrap_or("")
                ))
            });
            allow.insert(slot_name.to_owned(), listed.unwrap_or(Value::Null));
        }
        if !fields.checked(&format!("keep_deny_{slot_name}")) {
            let denied = names(fields.get(&format!("deny_{slot_name}")).unwrap_or(""));
            let denied = (!denied.is_empty()).then(|| json!(denied));
            deny.insert(slot_name.to_owned(), denied.unwrap_or(Value::Null));
        }
    }
    Ok(json!({
        "enabled": fields.checked("enabled"),
        "allow_irreversible": fields.checked("allow_irreversible"),
        "max_calls_per_turn": number("max_calls_per_turn")?,
        "max_steps_per_generation": number("max_steps_per_generation")?,
        "slot_allow_list": allow,
        "slot_deny_list": deny,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_site_is_decided_by_origin_then_referer() {
        let host = Some("127.0.0.1:8700");
        assert!(!is_cross_site(host, None, None, None));
        assert!(!is_cross_site(
            host,
            Some("http://127.0.0.1:8700"),
            None,
            None
        ));
        assert!(is_cross_site(host, Some("http://evil.example"), None, None));
        assert!(is_cross_site(host, Some("null"), None, None));
        assert!(!is_cross_site(
            host,
            None,
            Some("http://127.0.0.1:8700/console/x"),
            None
        ));
        assert!(is_cross_site(
            host,
            None,
            Some("https://evil.example/x"),
            None
        ));
        assert!(is_cross_site(host, None, None, Some("cross-site")));
        // A default port is the same origin with or without its number.
        for (host, origin, cross) in [
            (
                "console.example.com:443",
                "https://console.example.com",
                false,
            ),
            (
                "console.example.com",
                "https://console.example.com:443",
                false,
            ),
            ("CONSOLE.example.com", "https://console.example.com", false),
            (
                "console.example.com:80",
                "https://console.example.com",
                true,
            ),
            (
                "console.example.com",
                "http://console.example.com:8080",
                true,
            ),
            ("[::1]:8700", "http://[::1]:8700", false),
            ("[::1]:8700", "http://[::1]:8701", true),
        ] {
            assert_eq!(
                is_cross_site(Some(host), Some(origin), None, None),
                cross,
                "{host} {origin}"
            );
        }
        assert!(is_cross_site(
            None,
            Some("http://127.0.0.1:8700"),
            None,
            None
        ));
    }

    #[test]
    fn the_permission_form_becomes_the_permissions_object() {
        let fields = Fields::parse(
            b"enabled=on&max_calls_per_turn=7&max_steps_per_generation=3&deny_narrator=get_time%0D%0Aweb+search%2C+news%0A+%0A&restrict_memory=on&allow_memory=",
        )
        .unwrap();
        let body = permissions_body(&fields).unwrap();
        assert_eq!(body["enabled"], true);
        assert_eq!(body["allow_irreversible"], false);
        assert_eq!(body["max_calls_per_turn"], 7);
        // One name per line, spaces and commas kept.
        assert_eq!(
            body["slot_deny_list"]["narrator"],
            json!(["get_time", "web search, news"])
        );
        assert_eq!(body["slot_allow_list"]["memory"], json!([]));
        // A slot without a list is removed; the approval fields are not sent.
        assert_eq!(body["slot_allow_list"]["narrator"], Value::Null);
        assert_eq!(body["slot_deny_list"]["memory"], Value::Null);
        assert!(body.get("approval_required").is_none());
        assert!(body.get("approval_timeout_seconds").is_none());
        // A list the form could not show is kept as stored.
        let fields = Fields::parse(
            b"max_calls_per_turn=7&max_steps_per_generation=3&keep_allow_memory=on&keep_deny_narrator=on&deny_narrator=x",
        )
        .unwrap();
        let body = permissions_body(&fields).unwrap();
        assert!(body["slot_allow_list"].get("memory").is_none(), "{body}");
        assert!(body["slot_deny_list"].get("narrator").is_none(), "{body}");
        assert!(fits_one_per_line(&["web search".into(), "a,b".into()]));
        for odd in ["web\nsearch", "cr\ronly", " padded", "padded "] {
            assert!(!fits_one_per_line(&[odd.to_owned()]), "{odd:?}");
        }
    }
}
