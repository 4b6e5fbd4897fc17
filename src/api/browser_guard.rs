//! Keeps browsers out of the loopback-only `/api/tools`.
//!
//! The TCP peer check alone does not stop a web page: the user's browser runs on
//! loopback, so any page can POST (even `text/plain`, which needs no preflight)
//! to `http://127.0.0.1:<port>/api/tools/...`, and a DNS-rebinding domain can use
//! any method. Browsers always say where such a request comes from, through
//! `Origin`, `Sec-Fetch-Site` and `Host`, while local plugin clients (httpx and
//! the like) send no `Origin` and a loopback `Host`. So a request is refused when
//! its `Origin` is present and not loopback, its `Sec-Fetch-Site` is
//! `cross-site`, or its `Host` is missing or not loopback.

use std::net::IpAddr;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::runtime_tools::LoopbackClient;
use crate::domain::callback_url::is_loopback_ip;

/// Why a request was judged to come from a browser page that is not local.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `Origin` is present and not a loopback origin (`null` included).
    ForeignOrigin(HeaderValue),
    /// `Sec-Fetch-Site: cross-site`.
    CrossSite(HeaderValue),
    /// `Host` (or the request target's authority) is not loopback.
    ForeignHost(HeaderValue),
    /// Neither a `Host` header nor an authority in the request target.
    MissingHost,
}

/// Whether `value` is an `Origin` of a page served from loopback: http(s) with
/// host `localhost`, 127.0.0.0/8 or `[::1]`, any port, and nothing else.
/// `null` (sandboxed frames, `file:` pages, redirects) is not.
pub fn is_loopback_origin(value: &str) -> bool {
    let Ok(url) = url::Url::parse(value) else {
        return false;
    };
    // A real origin is scheme, host and port only; anything more is not one a
    // browser sends, so it gets no benefit of the doubt.
    matches!(url.scheme(), "http" | "https")
        && url.username().is_empty()
        && url.password().is_none()
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none()
        && url.host().is_some_and(|host| is_loopback_host_name(&host))
}

/// Whether a `Sec-Fetch-Site` value says the request comes from another site.
pub fn is_cross_site(value: &[u8]) -> bool {
    value.trim_ascii().eq_ignore_ascii_case(b"cross-site")
}

/// Whether a `Host` value (host with optional port) names loopback: `localhost`,
/// an address in 127.0.0.0/8 or `[::1]`. A rebinding domain resolves to loopback
/// but keeps its own name here, which is what gives it away.
pub fn is_loopback_host(value: &str) -> bool {
    let Ok(authority) = value.parse::<axum::http::uri::Authority>() else {
        return false;
    };
    // `Authority` admits user information, which a Host never carries.
    if authority.as_str().contains('@') {
        return false;
    }
    // `Authority::host` keeps IPv6 brackets, which is the form `Host::parse` wants.
    url::Host::parse(authority.host()).is_ok_and(|host| is_loopback_host_name(&host))
}

fn is_loopback_host_name<S: AsRef<str>>(host: &url::Host<S>) -> bool {
    match host {
        url::Host::Domain(name) => name.as_ref() == "localhost",
        url::Host::Ipv4(ip) => is_loopback_ip(IpAddr::V4(*ip)),
        url::Host::Ipv6(ip) => is_loopback_ip(IpAddr::V6(*ip)),
    }
}

/// Judges a request by its headers and target alone, so it can run before the
/// body is touched.
pub fn check(headers: &HeaderMap, uri: &Uri) -> Result<(), Refusal> {
    // Every copy of a repeated header is judged: a lenient reader of the first
    // one elsewhere must not open a gap.
    for origin in headers.get_all(header::ORIGIN) {
        if !origin.to_str().is_ok_and(is_loopback_origin) {
            return Err(Refusal::ForeignOrigin(origin.clone()));
        }
    }
    for site in headers.get_all("sec-fetch-site") {
        if is_cross_site(site.as_bytes()) {
            return Err(Refusal::CrossSite(site.clone()));
        }
    }
    let mut host_seen = false;
    for host in headers.get_all(header::HOST) {
        host_seen = true;
        if !host.to_str().is_ok_and(is_loopback_host) {
            return Err(Refusal::ForeignHost(host.clone()));
        }
    }
    // HTTP/2 and absolute-form targets carry the host in the URI instead.
    if let Some(authority) = uri.authority() {
        host_seen = true;
        if !is_loopback_host(authority.as_str()) {
            let value = HeaderValue::from_str(authority.as_str())
                .unwrap_or_else(|_| HeaderValue::from_static("<unprintable>"));
            return Err(Refusal::ForeignHost(value));
        }
    }
    if host_seen {
        Ok(())
    } else {
        Err(Refusal::MissingHost)
    }
}

/// Middleware for the `/api/tools` routes: refuses browser-borne requests with
/// 403 `forbidden` before any body is read.
///
/// Taking [`LoopbackClient`] first keeps a non-loopback peer's answer the
/// familiar `loopback_only`, whatever its headers.
pub async fn refuse_browser_requests(
    _loopback: LoopbackClient,
    request: Request,
    next: Next,
) -> Response {
    let refusal = match check(request.headers(), request.uri()) {
        Ok(()) => return next.run(request).await,
        Err(refusal) => refusal,
    };
    let path = request.uri().path();
    // The values are the attacker's; `?` keeps them escaped in the log.
    match &refusal {
        Refusal::ForeignOrigin(origin) => {
            tracing::info!(origin = ?origin, path, "refused a /api/tools request from a non-loopback Origin");
        }
        Refusal::CrossSite(site) => {
            tracing::info!(sec_fetch_site = ?site, path, "refused a cross-site /api/tools request");
        }
        Refusal::ForeignHost(host) => {
            tracing::info!(host = ?host, path, "refused a /api/tools request for a non-loopback Host");
        }
        Refusal::MissingHost => {
            tracing::info!(path, "refused a /api/tools request without a Host");
        }
    }
    ApiError::forbidden(
        "the runtime tools API refuses requests from web pages: \
         send no Origin (or a loopback one) and a loopback Host",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins_are_recognised() {
        for origin in [
            "http://127.0.0.1",
            "http://127.0.0.1:8700",
            "https://127.0.0.1:8700",
            "http://127.5.6.7:1",
            "http://[::1]",
            "http://[::1]:8700",
            "https://localhost",
            "http://localhost:8700",
        ] {
            assert!(is_loopback_origin(origin), "{origin}");
        }
    }

    #[test]
    fn other_origins_are_not() {
        for origin in [
            "null",
            "",
            "http://evil.example",
            "http://127.0.0.1.evil.example",
            "http://localhost.evil.example:8700",
            "http://evil.localhost",
            "http://128.0.0.1",
            "http://10.0.0.1:8700",
            "http://[::2]",
            "ftp://127.0.0.1",
            "file:///etc/passwd",
            "chrome-extension://abcdef",
            "http://user@127.0.0.1",
            "http://127.0.0.1/path",
            "http://127.0.0.1?q",
            "127.0.0.1:8700",
        ] {
            assert!(!is_loopback_origin(origin), "{origin}");
        }
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        for host in [
            "localhost",
            "LocalHost:8700",
            "127.0.0.1",
            "127.0.0.1:8700",
            "127.255.0.9:1",
            "[::1]",
            "[::1]:8700",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn other_hosts_are_not() {
        for host in [
            "",
            "evil.example",
            "evil.example:8700",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:8700",
            "0.0.0.0:8700",
            "::1",
            "[::2]:8700",
            "user@127.0.0.1",
            "127.0.0.1/x",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn only_cross_site_fetches_are_cross_site() {
        assert!(is_cross_site(b"cross-site"));
        assert!(is_cross_site(b" Cross-Site "));
        for site in [&b"same-origin"[..], b"same-site", b"none", b""] {
            assert!(!is_cross_site(site), "{site:?}");
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn a_plugin_client_passes() {
        let uri = Uri::from_static("/api/tools/register");
        assert_eq!(check(&headers(&[("host", "127.0.0.1:8700")]), &uri), Ok(()));
        let same_origin = headers(&[
            ("host", "localhost:8700"),
            ("origin", "http://localhost:8700"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert_eq!(check(&same_origin, &uri), Ok(()));
    }

    #[test]
    fn each_browser_sign_refuses() {
        let uri = Uri::from_static("/api/tools/register");
        let cases = [
            (
                headers(&[("host", "127.0.0.1:8700"), ("origin", "null")]),
                Refusal::ForeignOrigin(HeaderValue::from_static("null")),
            ),
            (
                headers(&[
                    ("host", "127.0.0.1:8700"),
                    ("origin", "http://127.0.0.1:8700"),
                    ("origin", "http://evil.example"),
                ]),
                Refusal::ForeignOrigin(HeaderValue::from_static("http://evil.example")),
            ),
            (
                headers(&[("host", "127.0.0.1:8700"), ("sec-fetch-site", "cross-site")]),
                Refusal::CrossSite(HeaderValue::from_static("cross-site")),
            ),
            (
                headers(&[("host", "evil.example:8700")]),
                Refusal::ForeignHost(HeaderValue::from_static("evil.example:8700")),
            ),
            (headers(&[]), Refusal::MissingHost),
        ];
        for (headers, refusal) in cases {
            assert_eq!(check(&headers, &uri), Err(refusal), "{headers:?}");
        }
    }

    #[test]
    fn the_target_authority_is_judged_too() {
        let host = headers(&[("host", "127.0.0.1:8700")]);
        let uri = Uri::from_static("http://evil.example/api/tools/register");
        assert_eq!(
            check(&host, &uri),
            Err(Refusal::ForeignHost(HeaderValue::from_static(
                "evil.example"
            )))
        );
        // Without a Host header (HTTP/2), the authority alone decides.
        let uri = Uri::from_static("http://127.0.0.1:8700/api/tools");
        assert_eq!(check(&HeaderMap::new(), &uri), Ok(()));
    }
}
