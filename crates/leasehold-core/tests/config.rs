//! The config layer: one URL grammar, one duration and bool grammar, secrets that never print,
//! and the redactor.

use std::time::Duration;

use leasehold_core::Error;
use leasehold_core::config::{Secret, StoreUrl, parse_bool, parse_duration, redact_url, redact_url_and_user};

/// Finding 11 of issue 12: a password with `/` or `?` was printed whole.
#[test]
fn redact_url_hides_passwords_holding_url_delimiters() {
    for (url, shown) in [
        (
            "postgres://app:pa/ss@db.internal/jobs",
            "postgres://app:***@db.internal/jobs",
        ),
        (
            "postgres://app:pa?ss@db.internal/jobs",
            "postgres://app:***@db.internal/jobs",
        ),
        (
            "postgres://app:pa#ss@db.internal/jobs",
            "postgres://app:***@db.internal/jobs",
        ),
        (
            "postgres://app:pa@ss@db.internal/jobs",
            "postgres://app:***@db.internal/jobs",
        ),
        (
            "redis://:pa/ss?x#y@h:6379/0?timeout=1s",
            "redis://:***@h:6379/0?timeout=1s",
        ),
        // Read from its first '?', the query's `password` runs to the end.
        (
            "postgres://app:pa?password=x@db/jobs?sslmode=require",
            "postgres://app:***",
        ),
        (
            "postgres://app:pa/ss@db/jobs?password=pa/ss",
            "postgres://app:***@db/jobs?password=***",
        ),
        ("app:pa/ss@db.internal/jobs", "app:***@db.internal/jobs"),
        ("not a url app:pa/ss@db", "not a url app:***@db"),
    ] {
        let redacted = redact_url(url);
        assert_eq!(redacted, shown, "{url}");
        assert!(!redacted.contains("pa/ss") && !redacted.contains("ss@"), "{redacted}");
    }
}

#[test]
fn redact_url_hides_secret_options_whatever_their_spelling() {
    for (url, shown) in [
        ("etcd://h/p?x=1&PassWord=s3", "etcd://h/p?x=1&PassWord=***"),
        ("etcd://h/p?x=1&p%61ssword=s3", "etcd://h/p?x=1&p%61ssword=***"),
        ("etcd://h/p?password=s3&cr3t&x=1", "etcd://h/p?password=***"),
        ("etcd://h/p?password=s3#cr3t&x=1", "etcd://h/p?password=***"),
        ("etcd://h/p?password=s3?cr3t&x=1", "etcd://h/p?password=***"),
        ("etcd://h/p?password=s3@cr:3t&x=1", "etcd://h/p?password=***"),
        ("azure://acct/c?sv=2022&sig=abc%2Bdef", "azure://acct/c?sv=2022&sig=***"),
        ("etcd://h/p?password=", "etcd://h/p?password=***"),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
}

/// The leak this layer fixes: the key of an `&`-split password fragment (`pa&ss=x`) was
/// shown, in the user info's query reading and in a `password=` option.
#[test]
fn redact_url_hides_the_key_of_an_ampersand_split_secret() {
    for (url, shown) in [
        ("postgres://u:pa&ss=x@h/db", "postgres://u:***@h/db"),
        ("postgres://u:pa?x&ss=y@h/db", "postgres://u:***@h/db"),
        ("postgres://h/db?password=pa&ss", "postgres://h/db?password=***"),
        ("postgres://h/db?password=pa&ss=x", "postgres://h/db?password=***"),
        (
            "postgres://h/db?password=pa&ss=x&sslmode=require",
            "postgres://h/db?password=***",
        ),
        ("azblob://a/c?sig=ab&cd=ef&se=1", "azblob://a/c?sig=***"),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
    // With the store's option names, known options after the secret are shown again.
    assert_eq!(
        StoreUrl::parse("postgres://h/db?password=pa&ss=x&sslmode=require", "postgres")
            .unwrap()
            .known_options(&["sslmode"])
            .to_string(),
        "postgres://h/db?password=***&sslmode=require"
    );
    // A known secret option after a secret is hidden too.
    assert_eq!(
        StoreUrl::parse("redis://h?password=a&b=1&token=c&x=1", "redis")
            .unwrap()
            .known_options(&["token", "x"])
            .to_string(),
        "redis://h?password=***&token=***&x=1"
    );
}

#[test]
fn redact_url_leaves_urls_without_secrets_alone() {
    for url in [
        "postgres://app@db:5432/jobs?sslmode=require",
        "postgres://db:5432/jobs",
        "postgres://app@[::1]:5433/jobs",
        "sqlite:///var/lib/app/leases.db?busy_timeout=1s",
        "sqlite::memory:",
        "dynamodb://leases?endpoint=http://127.0.0.1:8000&region=eu-west-1",
        "postgres://h/db@x",
    ] {
        assert_eq!(redact_url(url), url);
    }
    // The price of hiding passwords that hold '/' and '?': an '@' after the host hides
    // everything from the first ':' to it.
    assert_eq!(
        redact_url("postgres://u:pw@h/a:b@c?sslmode=require"),
        "postgres://u:***@c?sslmode=require"
    );
}

#[test]
fn redact_url_and_user_hides_the_whole_user_info() {
    assert_eq!(
        redact_url_and_user("dynamodb://AKID:pa/ss@t?x=1"),
        "dynamodb://***@t?x=1"
    );
    assert_eq!(redact_url_and_user("dynamodb://AKID@t"), "dynamodb://***@t");
    assert_eq!(redact_url_and_user("dynamodb://t?session_token=a@b"), "dynamodb://***");
    assert_eq!(redact_url_and_user("dynamodb://t?region=x"), "dynamodb://t?region=x");
}

#[test]
fn durations_need_a_unit() {
    for (text, millis) in [
        ("0ms", 0),
        ("250ms", 250),
        ("10s", 10_000),
        ("1.5s", 1_500),
        ("0.25s", 250),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("1.5ms", 1),
    ] {
        assert_eq!(parse_duration(text).map(|d| d.as_millis()), Ok(millis), "{text}");
    }
    assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_micros(1500)));
    assert_eq!(parse_duration("10"), Err("needs a unit, e.g. 10s or 10ms".to_string()));
    for bad in [
        "", "s", "1.s", ".5s", "1..5s", "1.2.3s", "5 s", "-1s", "1d", "1S", "1sec", "1e3ms",
    ] {
        let err = parse_duration(bad).unwrap_err();
        assert!(err.contains("expected a number and a unit"), "{bad:?}: {err}");
    }
    assert_eq!(parse_duration("99999999999999999999999h"), Err("too large".to_string()));
    assert!(parse_duration("1.0000000001s").is_err());
}

#[test]
fn bools_are_true_or_false() {
    assert_eq!(parse_bool("true"), Ok(true));
    assert_eq!(parse_bool("false"), Ok(false));
    for bad in ["", "1", "0", "yes", "no", "TRUE", "on"] {
        assert!(parse_bool(bad).is_err(), "{bad}");
    }
}

#[test]
fn secrets_never_print() {
    let secret = Secret::new("hunter2");
    let shown = format!("{secret} {secret:?} {:?}", Some(secret.clone()));
    assert!(!shown.contains("hunter2"), "{shown}");
    assert_eq!(secret.expose(), "hunter2");
}

fn reason(err: Error) -> String {
    match err {
        Error::InvalidUrl { reason, .. } => reason,
        other => panic!("not InvalidUrl: {other}"),
    }
}

#[test]
fn store_urls_parse_the_common_forms() {
    let url = StoreUrl::parse("Postgres://app:p%40ss@db.internal:5432/jobs?schema=x", "postgres").unwrap();
    assert_eq!(url.scheme(), "postgres");
    assert_eq!(url.username(), Some("app"));
    assert_eq!(url.password().unwrap().expose(), "p@ss");
    assert_eq!(url.host(), Some("db.internal"));
    assert_eq!(url.port(), Some(5432));
    assert_eq!(url.path(), "/jobs");
    assert_eq!(url.options().string("schema").as_deref(), Some("x"));

    let url = StoreUrl::parse("zk://a:2181,b,[::1]:2182/app", "zookeeper").unwrap();
    let hosts: Vec<(&str, Option<u16>)> = url.hosts().iter().map(|h| (h.name.as_str(), h.port)).collect();
    assert_eq!(hosts, [("a", Some(2181)), ("b", None), ("[::1]", Some(2182))]);

    let url = StoreUrl::parse("sqlite:///var/lib/x.db", "sqlite").unwrap();
    assert!(url.has_authority() && url.hosts().is_empty());
    assert_eq!(url.path(), "/var/lib/x.db");
    let url = StoreUrl::parse("sqlite::memory:", "sqlite").unwrap();
    assert_eq!((url.has_authority(), url.path()), (false, ":memory:"));
    let url = StoreUrl::parse("redis://:pw@h", "redis").unwrap();
    assert_eq!((url.username(), url.path()), (None, ""));
    let url = StoreUrl::parse("dynamodb://leases?endpoint=http://127.0.0.1:8000", "dynamodb").unwrap();
    assert_eq!(
        url.options().string("endpoint").as_deref(),
        Some("http://127.0.0.1:8000")
    );
}

#[test]
fn malformed_store_urls_name_the_problem_and_hide_the_password() {
    for (text, expected) in [
        ("no scheme here", "expected SCHEME://"),
        ("redis://h:port/0", "the port of host h must be a number"),
        ("redis://h:99999", "the port of host h must be a number"),
        ("etcd://a,,b", "an empty host"),
        ("etcd://[::1/x", "closing ']'"),
        ("postgres://u:pa/ss@h/db", "an unescaped '@' after the host"),
        ("postgres://u:pa#ss@h/db", "an unescaped '@' after the host"),
        ("etcd://h/p#frag", "a '#'"),
        ("redis://u:s3cr%zz@h", "the password: bad %-escape"),
        ("redis://h?timeout", "option timeout has no value"),
        (
            "redis://h?password=s3&cr3t",
            "the value of option password holds an unescaped '&'",
        ),
        ("redis://h?timeout=1s&timeout=2s", "option timeout is given twice"),
        ("redis://h?t%41=1&tA=2", "option tA is given twice"),
    ] {
        let err = StoreUrl::parse(text, "redis").unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains(expected), "{text}: {shown}");
        for secret in ["pa/ss", "pa#ss", "s3cr", "cr3t"] {
            assert!(
                !shown.contains(secret) && !format!("{err:?}").contains(secret),
                "{shown}"
            );
        }
    }
}

#[test]
fn options_are_typed_and_unknown_ones_named() {
    let url = StoreUrl::parse("redis://h?timeout=10&tls=yes&size=7&token=s3cr3t&prefix=a%26b", "redis").unwrap();
    let mut options = url.options();
    assert_eq!(
        reason(options.duration("timeout").unwrap_err()),
        "option timeout=\"10\": needs a unit, e.g. 10s or 10ms"
    );
    assert_eq!(
        reason(options.bool("tls").unwrap_err()),
        "option tls=\"yes\": expected true or false"
    );
    assert_eq!(options.parse::<u8>("size").unwrap(), Some(7));
    let err = options.parse::<u8>("token").unwrap_err();
    assert!(!err.to_string().contains("s3cr3t"), "{err}");
    assert_eq!(options.string("prefix").as_deref(), Some("a&b"));
    assert_eq!(options.string("absent"), None);
    assert!(options.finish().is_ok());

    let url = StoreUrl::parse("redis://h?tls=true&colour=blue&shape=round", "redis")
        .unwrap()
        .known_options(&["timeout"]);
    let mut options = url.options();
    assert_eq!(options.bool("tls").unwrap(), Some(true));
    assert_eq!(
        reason(options.finish().unwrap_err()),
        "unknown options colour, shape (known: tls, timeout)"
    );
    assert!(!format!("{:?}", url.options()).contains("blue"));
}

#[test]
fn an_unknown_option_after_a_secret_is_not_named() {
    let url = StoreUrl::parse("redis://h?password=pa&zq=xy&timeout=1s", "redis").unwrap();
    let mut options = url.options();
    assert!(options.secret("password").is_some());
    assert!(options.duration("timeout").unwrap().is_some());
    let err = options.finish().unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains("option password holds an unescaped '&'"), "{shown}");
    assert!(!shown.contains("zq") && !shown.contains("xy"), "{shown}");
}
