//! Signing in to the web console over plain HTTP: the CSRF token from the
//! sign-in page, the session cookie from the answer, and posts of console
//! forms with that cookie (no redirects followed, so answers can be checked).

use reqwest::StatusCode;
use reqwest::header::{COOKIE, SET_COOKIE};

use super::TestServer;

/// A console sign-in of one API key.
pub struct ConsoleClient {
    pub base_url: String,
    pub client: reqwest::Client,
    /// `tg_console=<value>`, as the Cookie header sends it.
    pub cookie: String,
}

/// A client that never follows redirects.
pub fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Sets an url-encoded form body (reqwest's `form` needs a feature the crate
/// does not enable).
pub fn with_form(
    request: reqwest::RequestBuilder,
    fields: &[(&str, &str)],
) -> reqwest::RequestBuilder {
    request
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(fields).expect("form"))
}

/// The value of the hidden `csrf_token` input of an HTML page.
pub fn csrf_token(html: &str) -> String {
    input_value(html, "csrf_token")
}

/// The value of the (first) input named `name` of an HTML page.
pub fn input_value(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} input"))
        + marker.len();
    let end = html[start..].find('"').expect("end of the value") + start;
    unescape(&html[start..end])
}

/// The text of the textarea named `name`, as a browser posts it.
pub fn textarea_text(html: &str, name: &str) -> String {
    let at = html
        .find(&format!("<textarea name=\"{name}\""))
        .unwrap_or_else(|| panic!("no {name} textarea"));
    let start = html[at..].find('>').expect("the tag's end") + at + 1;
    let end = html[start..]
        .find("</textarea>")
        .expect("the textarea's end")
        + start;
    unescape(&html[start..end])
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The sign-in page's CSRF token.
pub async fn login_token(server: &TestServer) -> String {
    let page = plain_client()
        .get(server.url("/console/login"))
        .send()
        .await
        .expect("login page");
    assert_eq!(page.status(), StatusCode::OK);
    csrf_token(&page.text().await.expect("body"))
}

/// Posts the sign-in form with `key` and `token`, without Origin or Referer.
pub async fn post_login(server: &TestServer, token: &str, key: &str) -> reqwest::Response {
    with_form(
        plain_client().post(server.url("/console/login")),
        &[("csrf_token", token), ("api_key", key)],
    )
    .send()
    .await
    .expect("login post")
}

impl ConsoleClient {
    /// Signs `key` in; panics unless the console accepts it.
    pub async fn sign_in(server: &TestServer, key: &str) -> Self {
        let token = login_token(server).await;
        let answer = post_login(server, &token, key).await;
        assert_eq!(answer.status(), StatusCode::SEE_OTHER, "sign-in refused");
        let set_cookie = answer
            .headers()
            .get(SET_COOKIE)
            .expect("a session cookie")
            .to_str()
            .unwrap();
        let cookie = set_cookie.split(';').next().unwrap().to_owned();
        Self {
            base_url: server.base_url.clone(),
            client: plain_client(),
            cookie,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// GETs a console page with the cookie: status and body.
    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let answer = self
            .client
            .get(self.url(path))
            .header(COOKIE, &self.cookie)
            .send()
            .await
            .expect("console get");
        let status = answer.status();
        (status, answer.text().await.unwrap_or_default())
    }

    /// The status of a console GET, without reading the body (an event
    /// stream's never ends).
    pub async fn status(&self, path: &str) -> StatusCode {
        self.hold(path).await.status()
    }

    /// A console GET with the cookie, answered but not read: an event stream
    /// stays open while the answer is held.
    pub async fn hold(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .header(COOKIE, &self.cookie)
            .send()
            .await
            .expect("console get")
    }

    /// A CSRF token of this sign-in (from its sessions page).
    pub async fn token(&self) -> String {
        let (status, html) = self.get("/console/sessions").await;
        assert_eq!(status, StatusCode::OK);
        csrf_token(&html)
    }

    /// Posts a console form with the cookie and extra headers.
    pub async fn post(
        &self,
        path: &str,
        fields: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> (StatusCode, String) {
        let mut request = with_form(
            self.client
                .post(self.url(path))
                .header(COOKIE, &self.cookie),
            fields,
        );
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let answer = request.send().await.expect("console post");
        let status = answer.status();
        (status, answer.text().await.unwrap_or_default())
    }

    /// Posts a console form like a browser on the console's own page (Origin
    /// of the console), with this sign-in's CSRF token added: status, the
    /// redirect's target (if any) and body.
    pub async fn submit(&self, path: &str, fields: &[(&str, &str)]) -> Submitted {
        let token = self.token().await;
        let mut all: Vec<(&str, &str)> = vec![("csrf_token", token.as_str())];
        all.extend_from_slice(fields);
        let answer = with_form(
            self.client
                .post(self.url(path))
                .header(COOKIE, &self.cookie)
                .header("origin", &self.base_url),
            &all,
        )
        .send()
        .await
        .expect("console post");
        let status = answer.status();
        let location = answer
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        Submitted {
            status,
            location,
            body: answer.text().await.unwrap_or_default(),
        }
    }
}

/// What a console form post answered.
#[derive(Debug)]
pub struct Submitted {
    pub status: StatusCode,
    /// Where a 303 sends the browser.
    pub location: Option<String>,
    pub body: String,
}
