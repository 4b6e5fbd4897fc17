//! The sign-in page.

use maud::html;

use super::{csrf_input, layout};

/// The sign-in form, with an error line after a refused key.
pub fn login_page(csrf: &str, error: Option<&str>) -> String {
    layout(
        "Sign in",
        None,
        html! {
            @if let Some(error) = error { p.error role="alert" { (error) } }
            form.login method="post" action="/console/login" {
                (csrf_input(csrf))
                label for="api_key" { "API key" }
                input #api_key type="password" name="api_key" autocomplete="off" required;
                button type="submit" { "Sign in" }
            }
            p.hint { "The account's API key, as the API takes it (" code { "tg_…" } "). "
                "The console shows exactly what this key sees." }
        },
    )
}
