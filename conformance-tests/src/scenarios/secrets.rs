//! Secrets of the store URL stay secret.

use std::error::Error as _;

use super::*;

/// Where the store URL carries a password, key or signature (the backend lists such URLs: the
/// test server with a wrong secret, a port nobody listens on, an unknown option): the secret is
/// in no error of connecting or of a first request (`Display`, `Debug`, or any source), and not
/// in the `Debug` of a store that connected.
///
/// # Panics
///
/// When the secret shows.
pub async fn secrets_stay_out_of_debug_and_errors(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "secrets_stay_out_of_debug_and_errors").await;
    let p = &scene.prefix;
    let secret = format!("S3cret{:x}", random_u64());
    let urls = scene.backend.secret_urls(&secret);
    if urls.is_empty() {
        return scene.not_applicable("the store URL carries no secret");
    }
    let lease = scene.lease_name();
    let mut shown = Vec::new();
    let mut connected = 0;
    for url in &urls {
        let store = scene.within(
            "connecting",
            scene.ttl * 3 + Duration::from_secs(10),
            scene.backend.connect_url(url),
        );
        let texts = match store.await {
            Ok(store) => {
                connected += 1;
                let mut texts = vec![format!("{store:?}")];
                let first = tokio::time::timeout(scene.ttl * 3, store.inspect(&lease)).await;
                if let Ok(Err(e)) = first {
                    texts.extend(error_texts(&e));
                }
                texts
            }
            Err(e) => error_texts(&e),
        };
        for text in &texts {
            assert!(!text.contains(&secret), "{p}: the secret shows in: {text}");
        }
        shown.extend(texts);
    }
    scene.log(format_args!(
        "{} URLs ({connected} connected), {} texts without the secret, e.g. {:?}",
        urls.len(),
        shown.len(),
        shown.iter().find(|t| t.contains("***")).or(shown.first())
    ));
}

/// `Display` and `Debug` of an error and every source.
fn error_texts(error: &leasehold_core::Error) -> Vec<String> {
    let mut texts = vec![error.to_string(), format!("{error:?}")];
    let mut source = error.source();
    while let Some(s) = source {
        texts.push(s.to_string());
        texts.push(format!("{s:?}"));
        source = s.source();
    }
    texts
}
