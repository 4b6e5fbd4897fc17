//! Reading `/metrics` in tests: a scrape with the admin key, and one sample.

use reqwest::StatusCode;

use super::TestServer;

/// `GET /metrics` with the admin key; checks the OpenMetrics framing.
pub async fn scrape(server: &TestServer) -> String {
    let response = server
        .client
        .get(server.url("/metrics"))
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "one EOF marker at the end");
    assert_eq!(text.matches("# EOF").count(), 1);
    text
}

/// The value of the sample `series` (name with labels), 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}
