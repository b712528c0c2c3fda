//! Tables, times and durations for people; lines that survive a closed pipe; the log on stderr.

use std::fmt::Display;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

/// Whether log lines on stderr start with the time (`run --timestamps`).
static TIMESTAMPS: AtomicBool = AtomicBool::new(false);

/// Turns the time at the start of every log line on or off.
pub(crate) fn set_timestamps(on: bool) {
    TIMESTAMPS.store(on, Ordering::Relaxed);
}

/// Whether log lines start with the time.
pub(crate) fn timestamps() -> bool {
    TIMESTAMPS.load(Ordering::Relaxed)
}

/// Whether stderr wants timestamps when nobody said: when it is not a terminal (a file, a
/// pipe to a log collector), except the systemd journal, which stamps every line itself
/// (`JOURNAL_STREAM` names stderr's device and inode there).
pub(crate) fn timestamps_by_default() -> bool {
    let stderr = std::io::stderr();
    if stderr.is_terminal() {
        return false;
    }
    !journal_is_stderr(&stderr)
}

fn journal_is_stderr(stderr: &std::io::Stderr) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(fd) = stderr.as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Writes one log line on stderr: `leasehold: TEXT`, after the time (RFC 3339, UTC, to the
/// millisecond) when timestamps are on. Durations in `TEXT` that came from elsewhere at full
/// precision are rounded for people.
pub(crate) fn log(text: impl Display) {
    let text = humanize(&text.to_string());
    if TIMESTAMPS.load(Ordering::Relaxed) {
        let now = humantime::format_rfc3339_millis(SystemTime::now());
        eprintln!("{now} leasehold: {text}");
    } else {
        eprintln!("leasehold: {text}");
    }
}

/// Rounds the durations in `text` that Rust's `Debug` wrote at full precision
/// (`667.920197ms`, `5.001257793s`) the way [`short`] writes them (`668ms`, `5.001s`).
pub(crate) fn humanize(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        let starts_token = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.');
        if !(bytes[i].is_ascii_digit() && starts_token) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == b'.') {
            j += 1;
        }
        let number = &text[i..j];
        let rest = &text[j..];
        let unit = ["ms", "µs", "us", "ns", "s"].into_iter().find(|u| rest.starts_with(u));
        let (Some(unit), Ok(value)) = (unit, number.parse::<f64>()) else {
            i = j;
            continue;
        };
        let end = j + unit.len();
        if text[end..].chars().next().is_some_and(char::is_alphanumeric) {
            i = end;
            continue;
        }
        let nanos = value
            * match unit {
                "s" => 1e9,
                "ms" => 1e6,
                "ns" => 1.0,
                _ => 1e3,
            };
        if !nanos.is_finite() || !(0.0..=1e18).contains(&nanos) {
            i = end;
            continue;
        }
        out.push_str(&text[copied..i]);
        out.push_str(&short(Duration::from_nanos(nanos.round() as u64)));
        copied = end;
        i = end;
    }
    out.push_str(&text[copied..]);
    out
}

/// Writes `text` and a newline to stdout. A closed pipe (`leasehold watch x | head -3`) ends the
/// process quietly with status 0.
pub(crate) fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Lays out `rows` under `headers` in left-aligned columns two spaces apart.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let render = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.zip(&widths).enumerate() {
            if i + 1 == widths.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_string()
    };
    let mut lines = vec![render(&mut headers.iter().copied())];
    lines.extend(rows.iter().map(|row| render(&mut row.iter().map(String::as_str))));
    lines.join("\n")
}

/// A wall-clock time in RFC 3339, UTC, to the second: `2025-05-01T02:00:00Z`.
pub(crate) fn wall(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// Milliseconds since the Unix epoch, for JSON.
pub(crate) fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whole milliseconds, for JSON.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A duration for people, to the millisecond under 10 s: `0.4ms`, `850ms`, `4.215s`, `12.3s`,
/// `2m 5s`, `3h 20m` (the library's errors print durations the same way).
pub(crate) fn short(duration: Duration) -> String {
    leasehold::time::Human(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let rows = vec![vec!["a".to_string(), "long value".to_string(), "x".to_string()]];
        assert_eq!(
            table(&["ONE", "TWO", "THREE"], &rows),
            "ONE  TWO         THREE\na    long value  x"
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(short(Duration::from_millis(850)), "850ms");
        assert_eq!(short(Duration::from_nanos(667_920_197)), "668ms");
        assert_eq!(short(Duration::from_nanos(5_001_257_793)), "5.001s");
        assert_eq!(short(Duration::from_micros(400)), "0.4ms");
        assert_eq!(short(Duration::ZERO), "0ms");
        assert_eq!(short(Duration::from_millis(4200)), "4.2s");
        assert_eq!(short(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(short(Duration::from_secs(10)), "10s");
        assert_eq!(short(Duration::from_secs(125)), "2m 5s");
        assert_eq!(short(Duration::from_secs(12_000)), "3h 20m");
    }

    #[test]
    fn durations_from_elsewhere_are_rounded() {
        assert_eq!(
            humanize("only 667.920197ms left, 5.001257793s required"),
            "only 668ms left, 5.001s required"
        );
        assert_eq!(
            humanize("did not answer renew within 2s"),
            "did not answer renew within 2s"
        );
        assert_eq!(humanize("took 1.5µs and 250ns"), "took <0.1ms and <0.1ms");
        // Not durations: ids, addresses, versions, words.
        for text in ["vm-337-6fc42f", "127.0.0.1:6379", "v1.2s3", "10sec", "x5s", "1.2.3s"] {
            assert_eq!(humanize(text), text, "{text}");
        }
    }

    #[test]
    fn wall_clock_is_rfc3339_utc() {
        assert_eq!(
            wall(SystemTime::UNIX_EPOCH + Duration::from_secs(86_400)),
            "1970-01-02T00:00:00Z"
        );
        assert_eq!(unix_ms(SystemTime::UNIX_EPOCH + Duration::from_millis(1500)), 1500);
    }
}
