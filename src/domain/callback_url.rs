//! Callback URLs of remote tools: loopback HTTP(S) endpoints only.
//!
//! The Runtime Tools API is a local integration contract, so a registered callback
//! may only point back at this machine. Anything else would let a local caller turn
//! the server into a proxy towards other hosts.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use url::{Host, Url};

use crate::error::{Error, Result};

/// True for 127.0.0.0/8, `::1` and IPv4-mapped loopback (`::ffff:127.x.y.z`).
pub fn is_loopback_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => is_loopback_v6(v6),
    }
}

fn is_loopback_v6(v6: Ipv6Addr) -> bool {
    v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
}

/// A validated callback URL: `http` or `https`, host `localhost`, an address in
/// 127.0.0.0/8, `::1` or an IPv4-mapped loopback address, a non-zero port (explicit
/// or the scheme's default) and no user information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackUrl {
    /// The URL exactly as registered; shown back to the plugin.
    raw: String,
    /// The parsed URL without its fragment, as requests carry it; kept so that
    /// no call converts it again.
    uri: http::Uri,
    origin: String,
}

impl CallbackUrl {
    /// Longest accepted URL, in bytes.
    pub const MAX_LEN: usize = 2048;

    pub fn parse(raw: &str) -> Result<Self> {
        // The URL is not repeated: its path may hold the plugin's token, and
        // refusals end up in plugins' and operators' logs.
        let invalid = |why: &str| Error::validation(format!("callback_url {why}"));
        if raw.is_empty() {
            return Err(Error::validation("callback_url must not be empty"));
        }
        if raw.len() > Self::MAX_LEN {
            return Err(Error::validation(format!(
                "callback_url must be at most {} bytes",
                Self::MAX_LEN
            )));
        }
        let url = Url::parse(raw).map_err(|err| invalid(&format!("is not a valid URL: {err}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid("must use http or https"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid("must not contain user information"));
        }
        let loopback = match url.host() {
            Some(Host::Domain(domain)) => domain.eq_ignore_ascii_case("localhost"),
            Some(Host::Ipv4(v4)) => v4.is_loopback(),
            Some(Host::Ipv6(v6)) => is_loopback_v6(v6),
            None => false,
        };
        if !loopback {
            return Err(invalid(
                "must point to localhost, 127.0.0.0/8, ::1 or an IPv4-mapped loopback address",
            ));
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| invalid("has no usable port"))?;
        if port == 0 {
            return Err(invalid("must not use port 0"));
        }
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let origin = format!("{}://{}:{}", url.scheme(), host, port);
        let mut sent = url;
        sent.set_fragment(None);
        let uri = http::Uri::try_from(sent.as_str())
            .map_err(|err| invalid(&format!("is not a valid request target: {err}")))?;
        Ok(Self {
            raw: raw.to_owned(),
            uri,
            origin,
        })
    }

    /// The URL as registered.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The URL requests are sent to, as an HTTP request target.
    pub fn uri(&self) -> &http::Uri {
        &self.uri
    }

    /// `scheme://host:port` with the default port made explicit: the unit the
    /// eviction rule counts failures per.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

impl fmt::Display for CallbackUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_loopback_forms() {
        for ok in [
            "http://127.0.0.1:9333/tools/get_weather",
            "http://127.5.6.7:8080/",
            "http://localhost:9000/cb",
            "http://LOCALHOST:9000/cb",
            "https://localhost/cb",
            "http://[::1]:9000/",
            "http://[::ffff:127.0.0.1]:9000/",
            "http://[::ffff:127.9.9.9]:9000/",
            "http://127.0.0.1/",
            "http://127.0.0.1:65535/?q=1",
        ] {
            assert!(CallbackUrl::parse(ok).is_ok(), "{ok} should be accepted");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "not a url",
            "http://10.0.0.1/",
            "http://192.168.1.1:80/",
            "http://172.16.0.1/",
            "http://example.com/",
            "http://localhost.example.com/",
            "http://0.0.0.0:9000/",
            "http://[::]:9000/",
            "http://[::ffff:10.0.0.1]:9000/",
            "http://[fe80::1]:9000/",
            "ftp://127.0.0.1/",
            "file:///etc/passwd",
            "ws://127.0.0.1:9000/",
            "http://user@127.0.0.1/",
            "http://user:pw@127.0.0.1:9000/",
            "http://:pw@127.0.0.1:9000/",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:-1/",
            "http://127.0.0.1:port/",
        ] {
            assert!(CallbackUrl::parse(bad).is_err(), "{bad} should be rejected");
        }
        assert!(CallbackUrl::parse(&format!("http://127.0.0.1/{}", "a".repeat(3000))).is_err());
    }

    #[test]
    fn origin_makes_default_port_explicit() {
        let url = CallbackUrl::parse("http://127.0.0.1/cb").unwrap();
        assert_eq!(url.origin(), "http://127.0.0.1:80");
        let url = CallbackUrl::parse("https://LocalHost/cb").unwrap();
        assert_eq!(url.origin(), "https://localhost:443");
        let url = CallbackUrl::parse("http://[::1]:9000/cb").unwrap();
        assert_eq!(url.origin(), "http://[::1]:9000");
        assert_eq!(url.as_str(), "http://[::1]:9000/cb");
    }

    #[test]
    fn loopback_peers() {
        for ip in ["127.0.0.1", "127.200.0.3", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback_ip(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "10.203.0.2",
            "0.0.0.0",
            "::",
            "::ffff:10.0.0.1",
            "192.168.0.1",
        ] {
            assert!(!is_loopback_ip(ip.parse().unwrap()), "{ip}");
        }
    }
}
