//! Secrets of the store URL stay secret, whatever becomes of the URL.

use std::error::Error as _;

use leasehold_core::Error;

use super::*;

/// Where the store URL carries a password, key or signature, the backend lists URLs with one
/// ([`SecretUrls`](crate::SecretUrls)): the test server accepting it (connects and answers), the
/// test server refusing it (a definite error, not retried as transient), a port nobody listens on
/// (a transient error), malformed URLs (an error when connecting). The secret is in no error
/// (`Display`, `Debug`, or any source) and not in the `Debug` of a store.
///
/// # Panics
///
/// When the secret shows, or an error has the wrong kind.
pub async fn secrets_stay_out_of_debug_and_errors(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "secrets_stay_out_of_debug_and_errors").await;
    let p = &scene.prefix;
    let secret = format!("S3cret{:x}", random_u64());
    let Some(urls) = scene.backend.secret_urls(&secret) else {
        return scene.not_applicable("the store URL carries no secret");
    };
    let lease = scene.lease_name();
    let mut shown = Vec::new();
    let mut check = |what: &str, texts: Vec<String>| {
        for text in &texts {
            assert!(!text.contains(&secret), "{p}: {what}: the secret shows in: {text}");
        }
        shown.extend(texts);
    };
    // Connects and makes one request: the error of whichever fails, and the store's `Debug`.
    let attempt = async |url: &str| -> (Option<String>, Option<Error>) {
        let limit = scene.ttl * 3 + Duration::from_secs(10);
        match scene.within("connecting", limit, scene.backend.connect_url(url)).await {
            Err(e) => (None, Some(e)),
            Ok(store) => {
                let debug = format!("{store:?}");
                (
                    Some(debug),
                    scene
                        .within("a first request", limit, store.inspect(&lease))
                        .await
                        .err(),
                )
            }
        }
    };
    if let Some(url) = &urls.accepted {
        let (debug, error) = attempt(url).await;
        check("a store that connected", debug.into_iter().collect());
        if let Some(e) = error {
            check("accepted", error_texts(&e));
            panic!("{p}: the test server accepts this secret, yet: {e}");
        }
    }
    if let Some(url) = &urls.refused {
        let (debug, error) = attempt(url).await;
        check("a store that connected", debug.into_iter().collect());
        let e = error.unwrap_or_else(|| panic!("{p}: a refused secret was accepted"));
        check("refused", error_texts(&e));
        assert!(
            !e.is_transient(),
            "{p}: a refused secret is a definite error, not transient: {e}"
        );
    }
    if let Some(url) = &urls.closed {
        let (debug, error) = attempt(url).await;
        check("a store that connected", debug.into_iter().collect());
        let e = error.unwrap_or_else(|| panic!("{p}: a port nobody listens on answered"));
        check("closed", error_texts(&e));
        assert!(
            e.is_transient(),
            "{p}: an unreachable server is a transient error: {e:?}"
        );
    }
    for url in &urls.malformed {
        let limit = scene.ttl * 3 + Duration::from_secs(10);
        match scene.within("connecting", limit, scene.backend.connect_url(url)).await {
            Ok(store) => panic!("{p}: a malformed URL connected: {store:?}"),
            Err(e) => check("malformed", error_texts(&e)),
        }
    }
    scene.log(format_args!(
        "{} texts without the secret, e.g. {:?}",
        shown.len(),
        shown.iter().find(|t| t.contains("***")).or(shown.first())
    ));
}

/// `Display` and `Debug` of an error and every source.
fn error_texts(error: &Error) -> Vec<String> {
    let mut texts = vec![error.to_string(), format!("{error:?}")];
    let mut source = error.source();
    while let Some(s) = source {
        texts.push(s.to_string());
        texts.push(format!("{s:?}"));
        source = s.source();
    }
    texts
}
