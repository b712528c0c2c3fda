//! The SVG chart of the report.

use std::fmt::Write as _;
use std::time::Duration;

use crate::measures::{BackendReport, Planned};
use crate::plan::Outcome;
use crate::{Stats, ms};

/// A chart's title and its bars (backend, value; `Err(why)`: no bar, `why` written instead).
type Panel<'a> = (&'static str, Vec<(&'a str, Result<Duration, &'static str>)>);

/// Bar charts, each on its own linear scale: graceful handover p50, planned handover p50 and
/// crash failover p50.
pub(super) fn svg(reports: &[BackendReport]) -> String {
    let stat = |o: &Outcome<Stats>| o.as_ref().map(|s| s.p50).map_err(|_| "not available");
    let panels: [Panel<'_>; 3] = [
        (
            "Graceful handover p50 (resign() returned -> successor Elected), ms",
            reports.iter().map(|r| (r.name, stat(&r.handover))).collect(),
        ),
        (
            "Planned handover p50 (hand_over(C) called -> C elected, B queued first), ms",
            reports
                .iter()
                .map(|r| {
                    let v = match &r.planned {
                        Ok(Planned::Measured(s)) => Ok(s.p50),
                        Ok(Planned::Unsupported) => Err("unsupported (released to everyone)"),
                        Err(_) => Err("not available"),
                    };
                    (r.name, v)
                })
                .collect(),
        ),
        (
            "Crash failover p50 (last renew -> successor Elected), ms",
            reports.iter().map(|r| (r.name, stat(&r.failover))).collect(),
        ),
    ];
    let (width, label_w, bar_h, gap) = (760.0, 110.0, 18.0, 6.0);
    let panel_h = |n: usize| 34.0 + n as f64 * (bar_h + gap);
    let height: f64 = panels.iter().map(|(_, rows)| panel_h(rows.len()) + 16.0).sum::<f64>() + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut y = 10.0;
    for (title, rows) in &panels {
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
            y + 14.0,
            escape(title)
        );
        let max = rows
            .iter()
            .filter_map(|(_, d)| d.ok())
            .map(|d| d.as_secs_f64() * 1000.0)
            .fold(0.0_f64, f64::max)
            .max(1e-3);
        let scale = (width - label_w - 120.0) / max;
        let mut by = y + 26.0;
        for (name, d) in rows {
            let _ = writeln!(s, r#"<text x="10" y="{}">{}</text>"#, by + 13.0, escape(name));
            match d {
                Ok(d) => {
                    let v = d.as_secs_f64() * 1000.0;
                    let w = (v * scale).max(1.0);
                    let _ = writeln!(
                        s,
                        r##"<rect x="{label_w}" y="{by}" width="{w:.1}" height="{bar_h}" fill="#4a7bb7"/><text x="{:.1}" y="{}">{}</text>"##,
                        label_w + w + 4.0,
                        by + 13.0,
                        ms(*d)
                    );
                }
                Err(why) => {
                    let _ = writeln!(s, r##"<text x="{label_w}" y="{}" fill="#888">{why}</text>"##, by + 13.0);
                }
            }
            by += bar_h + gap;
        }
        y += panel_h(rows.len()) + 16.0;
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
