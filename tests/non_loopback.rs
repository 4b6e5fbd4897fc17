//! `/api/tools` admits loopback peers only, judged by the TCP peer address.
//!
//! The main test reaches the server from a real non-loopback address: it creates
//! a network namespace joined to the host by a veth pair (private 10.203.x.y/30
//! addresses it assigns itself), runs `curl` inside the namespace, and removes
//! everything again, also when an assertion fails. Where that is impossible (no
//! `ip`, no root, no namespaces) it prints why and skips.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use common::{SpawnOptions, spawn_with};
use serde_json::{Value, json};

/// A network namespace with a veth pair to the host; removed on drop.
struct Netns {
    name: String,
    host_if: String,
    host_ip: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|err| format!("cannot run `ip`: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Netns {
    /// Names and addresses unique to this process and call, so parallel runs on
    /// one host do not collide.
    fn create() -> Result<Self, String> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tag =
            (std::process::id() ^ nanos ^ COUNTER.fetch_add(1, Ordering::SeqCst)) & 0x00ff_ffff;
        let subnet = tag & 0xff;
        let base = ((tag >> 8) & 0x3f) * 4;
        let netns = Self {
            name: format!("toolgate-test-{tag:06x}"),
            host_if: format!("tgh{tag:06x}"),
            host_ip: format!("10.203.{subnet}.{}", base + 1),
        };
        let peer_if = format!("tgn{tag:06x}");
        let peer_ip = format!("10.203.{subnet}.{}", base + 2);
        ip(&["netns", "add", &netns.name])?;
        // From here on, Drop cleans up whatever was created.
        ip(&[
            "link",
            "add",
            &netns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &peer_if,
        ])?;
        ip(&["link", "set", &peer_if, "netns", &netns.name])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", netns.host_ip),
            "dev",
            &netns.host_if,
        ])?;
        ip(&["link", "set", &netns.host_if, "up"])?;
        let in_ns = |args: &[&str]| {
            let mut full = vec!["netns", "exec", &netns.name, "ip"];
            full.extend_from_slice(args);
            ip(&full)
        };
        in_ns(&["addr", "add", &format!("{peer_ip}/30"), "dev", &peer_if])?;
        in_ns(&["link", "set", &peer_if, "up"])?;
        in_ns(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    /// Runs curl inside the namespace; returns (status, body).
    async fn curl(&self, args: &[&str]) -> (u16, Value) {
        let output = tokio::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "curl",
                "-sS",
                "--max-time",
                "20",
            ])
            .args(["-w", "\n%{http_code}"])
            .args(args)
            .output()
            .await
            .expect("run curl in the namespace");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "curl failed: {stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let (body, status) = stdout.rsplit_once('\n').expect("status line");
        (
            status.trim().parse().expect("status code"),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys its end of the pair, which removes the
        // host end too; the explicit delete covers a half-built setup.
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

fn skip(reason: &str) {
    println!("SKIPPED non-loopback test: {reason}");
    eprintln!("SKIPPED non-loopback test: {reason}");
}

#[tokio::test]
async fn callers_from_another_address_get_403_even_with_forwarding_headers() {
    if Command::new("ip").arg("-V").output().is_err() {
        return skip("the `ip` command (iproute2) is not installed");
    }
    if Command::new("curl").arg("--version").output().is_err() {
        return skip("`curl` is not installed");
    }
    let netns = match Netns::create() {
        Ok(netns) => netns,
        Err(reason) => {
            return skip(&format!(
                "cannot create a network namespace with a veth pair (needs root and CAP_NET_ADMIN): {reason}"
            ));
        }
    };
    let server = spawn_with(SpawnOptions {
        listen: Some("0.0.0.0:0".into()),
        ..Default::default()
    })
    .await;
    let port = server.addr.port();
    let base = format!("http://{}:{port}", netns.host_ip);
    let register = json!({"name": "sneaky", "callback_url": "http://127.0.0.1:9/x"}).to_string();

    let (status, body) = netns.curl(&[&format!("{base}/api/tools")]).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "loopback_only", "{body}");

    for header in [
        "X-Forwarded-For: 127.0.0.1",
        "X-Real-IP: 127.0.0.1",
        "Forwarded: for=127.0.0.1",
    ] {
        let (status, body) = netns
            .curl(&["-H", header, &format!("{base}/api/tools")])
            .await;
        assert_eq!(status, 403, "{header}: {body}");
    }
    for path in [
        "/api/tools/register",
        "/api/tools/unregister",
        "/api/tools/clear",
    ] {
        let (status, body) = netns
            .curl(&[
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-H",
                "X-Forwarded-For: 127.0.0.1",
                "--data",
                &register,
                &format!("{base}{path}"),
            ])
            .await;
        assert_eq!(status, 403, "{path}: {body}");
    }

    // The host's own non-loopback address is not loopback either.
    let response = server
        .client
        .get(format!("{base}/api/tools"))
        .header("X-Forwarded-For", "127.0.0.1")
        .send()
        .await
        .expect("request to the veth address");
    assert_eq!(response.status(), 403);
    // A method or path no route takes tells such a caller nothing either.
    for (method, path) in [
        (reqwest::Method::PUT, "/api/tools"),
        (reqwest::Method::GET, "/api/tools/register"),
        (reqwest::Method::GET, "/api/tools/no-such-route"),
    ] {
        let response = server
            .client
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .await
            .expect("request to the veth address");
        assert_eq!(response.status(), 403, "{method} {path}");
    }
    // From loopback, the same requests are what they are.
    let response = server
        .client
        .put(server.url("/api/tools"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);

    // The same server answers loopback callers, and nothing was registered.
    let response = server
        .client
        .get(server.url("/api/tools"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["tools_by_role"], json!({"Lanlan": []}));

    // The rest of the API is not loopback-only: the namespace reaches it.
    let (status, _) = netns.curl(&[&format!("{base}/healthz")]).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn loopback_callers_are_admitted_whatever_their_headers_say() {
    let server = common::spawn_app().await;
    let response = server
        .client
        .post(server.url("/api/tools/register"))
        .header("X-Forwarded-For", "203.0.113.9")
        .header("Forwarded", "for=203.0.113.9")
        .json(&json!({"name": "local", "callback_url": "http://127.0.0.1:9/x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn ipv4_mapped_and_ipv6_loopback_peers_are_admitted() {
    // On a dual-stack socket, IPv4 clients appear as ::ffff:127.0.0.1.
    if std::net::TcpListener::bind("[::]:0").is_err() {
        return skip("IPv6 is not available, so no dual-stack listener can be bound");
    }
    let server = spawn_with(SpawnOptions {
        listen: Some("[::]:0".into()),
        ..Default::default()
    })
    .await;
    let port = server.addr.port();
    let response = server
        .client
        .get(format!("http://127.0.0.1:{port}/api/tools"))
        .send()
        .await
        .expect("IPv4 client of a dual-stack listener");
    assert_eq!(response.status(), 200);
    if std::net::TcpStream::connect(("::1", port)).is_ok() {
        let response = server
            .client
            .get(format!("http://[::1]:{port}/api/tools"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    } else {
        println!("::1 is not reachable here; only the IPv4-mapped form was checked");
    }
}
