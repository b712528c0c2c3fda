//! Tables, times and durations for people; lines that survive a closed pipe.

use std::io::Write;
use std::time::{Duration, SystemTime};

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

/// A short duration for people: `850ms`, `4.2s`, `10s`, `2m 5s`, `3h 20m`.
pub(crate) fn short(duration: Duration) -> String {
    let ms = duration.as_millis();
    let secs = duration.as_secs();
    if ms < 1000 {
        format!("{ms}ms")
    } else if secs < 60 {
        if ms.is_multiple_of(1000) {
            format!("{secs}s")
        } else {
            format!("{:.1}s", duration.as_secs_f64())
        }
    } else if secs < 3600 {
        match secs % 60 {
            0 => format!("{}m", secs / 60),
            s => format!("{}m {s}s", secs / 60),
        }
    } else {
        match secs % 3600 / 60 {
            0 => format!("{}h", secs / 3600),
            m => format!("{}h {m}m", secs / 3600),
        }
    }
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
        assert_eq!(short(Duration::from_millis(4200)), "4.2s");
        assert_eq!(short(Duration::from_secs(10)), "10s");
        assert_eq!(short(Duration::from_secs(125)), "2m 5s");
        assert_eq!(short(Duration::from_secs(12_000)), "3h 20m");
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
