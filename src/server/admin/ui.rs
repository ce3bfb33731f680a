//! The dashboard page at `/ui`: one HTML page, its script and its styles,
//! embedded in the binary (no CDN, no external font: the page reaches
//! nothing but this admin API). The shell answers without a token even
//! with `--admin-read-token` (it holds no data); the page asks for a token
//! and sends it with every `/api/v1/` read.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// The embedded assets' total size in bytes.
pub const ASSET_BYTES: usize = INDEX.len() + SCRIPT.len() + STYLE.len();
// The bound: the build fails past it.
const _: () = assert!(
    ASSET_BYTES < 200_000,
    "the dashboard's assets must stay under 200 KB"
);

fn asset_response(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // The page may only talk to the server it came from.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /ui`: the page.
pub async fn page() -> Response {
    asset_response("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{asset}`: `app.js` or `app.css`.
pub async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => asset_response("text/javascript; charset=utf-8", SCRIPT),
        "app.css" => asset_response("text/css; charset=utf-8", STYLE),
        _ => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_assets_load_nothing_from_elsewhere() {
        // The only URL is the SVG namespace (a name, never fetched).
        for text in [super::INDEX, super::SCRIPT, super::STYLE] {
            let urls = text.replace("http://www.w3.org/2000/svg", "");
            assert!(
                !urls.contains("http://")
                    && !urls.contains("https://")
                    && !urls.contains("//fonts")
            );
        }
    }
}
