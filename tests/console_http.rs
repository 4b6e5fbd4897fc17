//! Issue 17 without a browser: the console's sign-in (wrong key 401 with the
//! form and no cookie, a reusable CSRF token, the cookie's attributes), the
//! CSP on every answer, redirects to the sign-in page, CSRF and cross-site
//! refusals, and account isolation on every console page.

mod common;

use common::console::{
    ConsoleClient, csrf_token, login_token, plain_client, post_login, with_form,
};
use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use serde_json::json;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn csp_of(answer: &reqwest::Response) -> &str {
    answer
        .headers()
        .get(CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

#[tokio::test]
async fn pages_without_a_console_session_redirect_to_the_sign_in_page_with_the_csp() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let client = plain_client();
    for path in [
        "/console".to_owned(),
        "/console/sessions".to_owned(),
        format!("/console/sessions/{session}"),
        format!("/console/sessions/{session}/events"),
        "/console/executions/exec_x".to_owned(),
        "/console/floors/floor_x".to_owned(),
        "/console/runtime-tools".to_owned(),
        "/console/definitions".to_owned(),
        "/console/activity".to_owned(),
        "/console/mcp".to_owned(),
    ] {
        let answer = client.get(server.url(&path)).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "{path}");
        assert_eq!(csp_of(&answer), CSP, "{path}");
        let location = answer.headers()[LOCATION].to_str().unwrap();
        assert!(
            location == "/console/login" || location == "/console/sessions",
            "{path}: {location}"
        );
    }
    // A made-up cookie is no sign-in either.
    let answer = client
        .get(server.url("/console/sessions"))
        .header("cookie", "tg_console=0123abcd")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    for path in [
        "/console/login",
        "/console/assets/console.js",
        "/console/assets/console.css",
    ] {
        let answer = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
        assert_eq!(csp_of(&answer), CSP, "{path}");
    }
    let login = client
        .get(server.url("/console/login"))
        .send()
        .await
        .unwrap();
    let html = login.text().await.unwrap();
    assert!(html.contains("name=\"api_key\""), "{html}");
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "inline code: {html}"
    );
}

#[tokio::test]
async fn a_wrong_key_is_refused_with_the_form_and_the_token_serves_repeated_attempts() {
    let server = spawn_app().await;
    let token = login_token(&server).await;
    for _ in 0..2 {
        let refused = post_login(&server, &token, "tg_not_a_key").await;
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert!(
            refused.headers().get(SET_COOKIE).is_none(),
            "a cookie for a wrong key"
        );
        assert_eq!(csp_of(&refused), CSP);
        let html = refused.text().await.unwrap();
        assert!(
            html.contains("name=\"api_key\"") && html.contains("not valid"),
            "{html}"
        );
    }
    let empty = post_login(&server, &token, "").await;
    assert_eq!(empty.status(), StatusCode::UNAUTHORIZED);
    // The same token, no Origin or Referer (a non-browser client): accepted.
    let accepted = post_login(&server, &token, &server.token).await;
    assert_eq!(accepted.status(), StatusCode::SEE_OTHER);
    assert_eq!(accepted.headers()[LOCATION], "/console/sessions");
    let cookie = accepted.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age="] {
        assert!(cookie.contains(attribute), "{attribute} missing: {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    // Behind a TLS-terminating proxy the cookie is Secure.
    let over_tls = with_form(
        plain_client()
            .post(server.url("/console/login"))
            .header("x-forwarded-proto", "https"),
        &[
            ("csrf_token", token.as_str()),
            ("api_key", server.token.as_str()),
        ],
    )
    .send()
    .await
    .unwrap();
    assert!(
        over_tls.headers()[SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Secure")
    );
}

#[tokio::test]
async fn sign_in_posts_without_a_valid_token_or_from_another_site_are_refused() {
    let server = spawn_app().await;
    let token = login_token(&server).await;
    for bad in ["", "1.2.3", &format!("{token}0")] {
        let refused = post_login(&server, bad, &server.token).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "token {bad:?}");
        assert!(refused.headers().get(SET_COOKIE).is_none());
    }
    let cross = with_form(
        plain_client()
            .post(server.url("/console/login"))
            .header("origin", "http://evil.example"),
        &[
            ("csrf_token", token.as_str()),
            ("api_key", server.token.as_str()),
        ],
    )
    .send()
    .await
    .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    assert!(cross.headers().get(SET_COOKIE).is_none());
}

async fn narrator_denies(server: &TestServer, session: &str) -> serde_json::Value {
    let reply = server
        .get(&format!("/sessions/{session}/tool-permissions"))
        .await;
    reply.body["data"]["slot_deny_list"]["narrator"].clone()
}

#[tokio::test]
async fn console_forms_need_this_sessions_token_and_a_same_site_post() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let other = ConsoleClient::sign_in(&server, &server.token).await;
    let token = console.token().await;
    let path = format!("/console/sessions/{session}/permissions");
    let page = format!("/console/sessions/{session}");
    let version = || async {
        let html = console.get(&page).await.1;
        let version = common::console::input_value(&html, "permissions_version");
        &*Box::leak(version.into_boxed_str())
    };
    let drawn = version().await;
    let form = |token: &'static str| {
        vec![
            ("csrf_token", token),
            ("permissions_version", drawn),
            ("enabled", "on"),
            ("max_calls_per_turn", "10"),
            ("max_steps_per_generation", "5"),
            ("deny_narrator", "get_time"),
        ]
    };
    let token: &'static str = Box::leak(token.into_boxed_str());
    let others: &'static str = Box::leak(other.token().await.into_boxed_str());
    type Pairs = Vec<(&'static str, &'static str)>;
    let refusals: Vec<(Pairs, Pairs)> = vec![
        (form(token), vec![("origin", "http://evil.example")]),
        (form(token), vec![("origin", "null")]),
        (form(token), vec![("referer", "http://evil.example/page")]),
        (form(token), vec![("sec-fetch-site", "cross-site")]),
        (form(""), vec![]),
        (form(others), vec![]),
        (form("1.2.3"), vec![]),
    ];
    for (fields, headers) in &refusals {
        let (status, html) = console.post(&path, fields, headers).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{headers:?} {fields:?}: {html}"
        );
        assert_eq!(
            narrator_denies(&server, &session).await,
            serde_json::Value::Null
        );
    }
    // Same-site (its own Origin) and header-less posts with the token pass.
    let own_origin = server.base_url.clone();
    let (status, _) = console
        .post(&path, &form(token), &[("origin", &own_origin)])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        narrator_denies(&server, &session).await,
        json!(["get_time"])
    );
    // The same form again was drawn before that save: refused, not merged.
    let (status, html) = console.post(&path, &form(token), &[]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{html}");
    let mut fresh = form(token);
    fresh[1].1 = version().await;
    let (status, _) = console.post(&path, &fresh, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    // A bad form is a 400 page, never a 500.
    let (status, html) = console
        .post(
            &path,
            &[("csrf_token", token), ("max_calls_per_turn", "many")],
            &[],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{html}");
}

#[tokio::test]
async fn sign_out_ends_the_console_session_and_its_event_streams() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let mut stream = console
        .hold(&format!("/console/sessions/{session}/events"))
        .await;
    assert_eq!(stream.status(), StatusCode::OK);
    let token = console.token().await;
    let (status, _) = console
        .post("/console/logout", &[("csrf_token", &token)], &[])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (status, _) = console.get("/console/sessions").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    // The stream opened before the sign-out ends (keep-alive comments may
    // come first); it would otherwise carry journal rows on.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(_chunk) = stream.chunk().await.expect("the stream's body") {}
    })
    .await;
    assert!(ended.is_ok(), "the event stream outlived its sign-in");
}

/// Another account's session, floor, run and execution.
struct Foreign {
    session: String,
    floor: String,
    run: String,
    execution: String,
}

async fn foreign_data(server: &TestServer, key: &str) -> Foreign {
    let character = server
        .send_as(
            key,
            reqwest::Method::POST,
            "/characters",
            Some(json!({"name": "Other"})),
        )
        .await;
    assert_eq!(character.status, StatusCode::CREATED, "{character:?}");
    let post = |path: String, body| async move {
        server
            .send_as(key, reqwest::Method::POST, &path, Some(body))
            .await
    };
    let session = post("/sessions".into(), json!({"character": "Other"})).await;
    let session = session.body["data"]["id"].as_str().unwrap().to_owned();
    let floor = post(
        format!("/sessions/{session}/floors"),
        json!({"content": "hi"}),
    )
    .await;
    let floor = floor.body["data"]["id"].as_str().unwrap().to_owned();
    let run = post(format!("/floors/{floor}/runs"), json!({})).await;
    let run = run.body["data"]["id"].as_str().unwrap().to_owned();
    let call = post(
        format!("/sessions/{session}/tool-calls"),
        json!({"name": "get_time", "arguments": {}, "floor_id": floor, "run_id": run}),
    )
    .await;
    let execution = call.body["data"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    Foreign {
        session,
        floor,
        run,
        execution,
    }
}

#[tokio::test]
async fn no_console_page_answers_another_accounts_ids_not_even_for_the_admin() {
    let server = spawn_app().await;
    let key = server.create_account("tenant").await;
    let foreign = foreign_data(&server, &key).await;
    let admin = ConsoleClient::sign_in(&server, &server.token).await;
    let tenant = ConsoleClient::sign_in(&server, &key).await;
    let pages = [
        format!("/console/sessions/{}", foreign.session),
        format!("/console/sessions/{}/events", foreign.session),
        format!("/console/executions/{}", foreign.execution),
        format!("/console/floors/{}", foreign.floor),
    ];
    for path in &pages {
        let (status, html) = admin.get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {html}");
        assert_eq!(
            tenant.status(path).await,
            StatusCode::OK,
            "{path} for its own account"
        );
    }
    let token = admin.token().await;
    let posts = [
        format!("/console/sessions/{}/permissions", foreign.session),
        format!("/console/floors/{}/runs", foreign.floor),
        format!("/console/runs/{}/commit", foreign.run),
        format!("/console/runs/{}/discard", foreign.run),
    ];
    let fields = [
        ("csrf_token", token.as_str()),
        ("max_calls_per_turn", "1"),
        ("max_steps_per_generation", "1"),
    ];
    for path in &posts {
        let (status, html) = admin.post(path, &fields, &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {html}");
    }
    let run = server
        .send_as(
            &key,
            reqwest::Method::GET,
            &format!("/runs/{}", foreign.run),
            None,
        )
        .await;
    assert_eq!(
        run.body["data"]["state"], "open",
        "the admin's posts changed nothing"
    );
    let (_, list) = admin
        .get(&format!("/console/sessions?q={}", foreign.session))
        .await;
    let link = format!("href=\"/console/sessions/{}\"", foreign.session);
    assert!(!list.contains(&link), "listed for the admin: {list}");
    let (_, list) = tenant.get("/console/sessions?q=Other").await;
    assert!(list.contains(&link), "{list}");
    let (status, html) = tenant
        .get(&format!("/console/executions/{}", foreign.execution))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains("get_time") && html.contains(&foreign.run),
        "{html}"
    );
    assert!(!csrf_token(&html).is_empty());
}

#[tokio::test]
async fn saving_the_permission_form_unchanged_keeps_every_permission() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    // Names with spaces and commas, and the approval rule the form does not
    // edit.
    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({
                "approval_required": ["hostile tool"],
                "approval_timeout_seconds": 3600,
                "slot_deny_list": {"narrator": ["web search", "a,b"]},
                // Names a textarea of one name per line cannot show: the
                // form keeps these lists as they are.
                "slot_allow_list": {"memory": ["note taker"], "director": ["web\nsearch", " padded "]},
            }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let before = reply.body["data"].clone();
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let (_, html) = console.get(&format!("/console/sessions/{session}")).await;
    // What a browser posts for the form as drawn.
    let version = common::console::input_value(&html, "permissions_version");
    let texts: Vec<(String, String)> = ["narrator", "director", "verifier", "memory"]
        .iter()
        .flat_map(|slot| [format!("allow_{slot}"), format!("deny_{slot}")])
        .map(|name| {
            if html.contains(&format!("name=\"keep_{name}\"")) {
                (format!("keep_{name}"), "on".to_owned())
            } else {
                let text = common::console::textarea_text(&html, &name);
                (name, text)
            }
        })
        .collect();
    assert!(
        texts.iter().any(|(name, _)| name == "keep_allow_director"),
        "the list the form cannot show is kept: {texts:?}"
    );
    let mut fields: Vec<(&str, &str)> = vec![
        ("permissions_version", &version),
        ("enabled", "on"),
        ("max_calls_per_turn", "10"),
        ("max_steps_per_generation", "5"),
        ("restrict_memory", "on"),
    ];
    fields.extend(
        texts
            .iter()
            .map(|(name, text)| (name.as_str(), text.as_str())),
    );
    let saved = console
        .submit(&format!("/console/sessions/{session}/permissions"), &fields)
        .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{}", saved.body);
    let after = server
        .get(&format!("/sessions/{session}/tool-permissions"))
        .await;
    assert_eq!(after.body["data"], before);
}

#[tokio::test]
async fn a_floors_journal_is_paged_and_a_notice_is_only_one_of_the_console_s_own() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let (floor, run) = server.floor_and_run(&session, "Roll").await;
    for _ in 0..55 {
        // Past the turn's call limit the calls are refused: journalled all
        // the same.
        server
            .post(
                &format!("/sessions/{session}/tool-calls"),
                json!({"name": "roll_dice", "arguments": {"sides": 6}, "floor_id": floor, "run_id": run}),
            )
            .await;
    }
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let page = format!("/console/floors/{floor}");
    let rows = |html: &str| html.matches("<tr id=\"exec-").count();
    let (_, first) = console.get(&page).await;
    assert_eq!(rows(&first), 50);
    assert!(first.contains("Rows 1–50 of 55"), "{first}");
    assert!(first.contains(&format!("{page}?offset=50")), "{first}");
    let (_, second) = console.get(&format!("{page}?offset=50")).await;
    assert_eq!(rows(&second), 5);
    assert!(second.contains("Rows 51–55 of 55"), "{second}");
    let (_, beyond) = console.get(&format!("{page}?offset=500")).await;
    assert!(beyond.contains("No rows this far"), "{beyond}");
    assert!(beyond.contains(&format!("{page}?offset=50")), "{beyond}");
    // A notice is named by its code; any other text in the URL is not shown.
    let (_, spoofed) = console
        .get(&format!(
            "{page}?notice=Sign+in+again+at+http%3A%2F%2Fevil.example"
        ))
        .await;
    assert!(!spoofed.contains("evil.example"), "{spoofed}");
    let (_, known) = console.get(&format!("{page}?notice=run_committed")).await;
    assert!(known.contains("run committed"), "{known}");
}

#[tokio::test]
async fn console_addresses_a_page_cannot_read_get_a_console_page_and_a_new_sign_in_ends_the_old() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    for (path, status) in [
        ("/console/logout".to_owned(), StatusCode::METHOD_NOT_ALLOWED),
        (
            format!("/console/sessions/{session}?offset=abc"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/console/executions/%FF".to_owned(),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let answer = console.hold(&path).await;
        assert_eq!(answer.status(), status, "{path}");
        assert!(
            answer
                .headers()
                .get(CONTENT_SECURITY_POLICY)
                .unwrap_or_else(|| panic!("{path}: {:?}", answer.headers()))
                .to_str()
                .unwrap()
                .contains("default-src 'none'"),
            "{path}"
        );
        let content_type = answer.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("text/html"),
            "{path}: {content_type}"
        );
    }
    // Signing in again from the same browser (as another account) ends the
    // sign-in whose cookie it replaces.
    let key = server.create_account("tenant").await;
    let token = login_token(&server).await;
    let answer = with_form(
        plain_client()
            .post(server.url("/console/login"))
            .header(reqwest::header::COOKIE, &console.cookie),
        &[("csrf_token", token.as_str()), ("api_key", key.as_str())],
    )
    .send()
    .await
    .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let (status, _) = console.get("/console/sessions").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "the replaced sign-in ended");
}

#[tokio::test]
async fn a_callback_urls_path_is_shown_to_the_admin_only() {
    let server = spawn_app().await;
    let key = server.create_account("tenant").await;
    server.create_session_as(&key, "Other").await;
    server.create_session().await;
    // For every character, the tenant's included.
    let token = "tok_plugin_secret_5d1c";
    common::register_remote(
        &server,
        json!({"name": "owl", "callback_url": format!("http://127.0.0.1:9/{token}/tools/owl"),
            "source": "plugin:owls"}),
    )
    .await;
    let admin = ConsoleClient::sign_in(&server, &server.token).await;
    let (_, page) = admin.get("/console/runtime-tools").await;
    assert!(page.contains(token), "{page}");
    let tenant = ConsoleClient::sign_in(&server, &key).await;
    let (status, page) = tenant.get("/console/runtime-tools").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("data-tool=\"owl\""),
        "the tenant sees the tool: {page}"
    );
    assert!(page.contains("http://127.0.0.1:9/…"), "{page}");
    assert!(!page.contains(token), "{page}");
}
