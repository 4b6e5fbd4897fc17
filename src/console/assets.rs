//! The console's static files, embedded in the binary: nothing to install or
//! build beside it.

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    pub content_type: &'static str,
    pub body: &'static str,
}

/// The asset served under `/console/assets/{name}`, if any.
pub fn asset(name: &str) -> Option<Asset> {
    match name {
        "console.js" => Some(Asset {
            content_type: "text/javascript; charset=utf-8",
            body: include_str!("assets/console.js"),
        }),
        "console.css" => Some(Asset {
            content_type: "text/css; charset=utf-8",
            body: include_str!("assets/console.css"),
        }),
        _ => None,
    }
}
