//! The web console's HTTP-free half: who is signed in (`sessions`), the CSRF
//! tokens of its forms (`csrf`), the server-rendered pages (`views`), the
//! activity figures (`activity`) and the embedded assets. The handlers that
//! serve it live in `api::console`; everything they show comes from the same
//! store and runtime calls the API makes, so an account sees exactly what its
//! key sees.

pub mod activity;
pub mod assets;
pub mod csrf;
pub mod definition_form;
pub mod forms;
pub mod sessions;
pub mod throttle;
pub mod views;

/// Name of the console's session cookie.
pub const COOKIE_NAME: &str = "tg_console";

/// Path the cookie is scoped to: the console, never the API.
pub const COOKIE_PATH: &str = "/console";

/// The Content-Security-Policy every console response carries: only the
/// console's own script and style, no inline code, no framing, forms posting
/// only to this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
