//! Text of the report: µs, percents, ratios, thousands, percentile cells
//! and the one-line row of a run.

use std::time::Duration;

use crate::stats::figures::Figures;

pub fn us(v: Option<f64>) -> String {
    v.map_or_else(|| String::from("n/a"), |v| format!("{v:.1} µs"))
}

pub fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| String::from("n/a"), |v| format!("{:.0}%", v * 100.0))
}

pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}x", a / b)
    } else {
        String::from("n/a")
    }
}

pub fn ratio_opt(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => String::from("n/a"),
    }
}

pub fn dur_ratio(a: Duration, b: Duration) -> String {
    ratio(a.as_secs_f64(), b.as_secs_f64())
}

/// `12345.6` as `12,346`.
pub fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `d`'s p50 / p99 / p99.9 as ratios to `b`'s.
pub fn pct_ratios(d: &mut Figures, b: &mut Figures) -> String {
    format!(
        "{} / {} / {}",
        dur_ratio(d.pct(0.5), b.pct(0.5)),
        dur_ratio(d.pct(0.99), b.pct(0.99)),
        dur_ratio(d.pct(0.999), b.pct(0.999))
    )
}

/// p50 / p99 / p99.9 as one cell.
pub fn pcts(f: &mut Figures) -> String {
    format!(
        "{:.1?} / {:.1?} / {:.1?}",
        f.pct(0.5),
        f.pct(0.99),
        f.pct(0.999)
    )
}

/// One row of figures: rate, p50, p99, p99.9, then `note`.
pub fn print_row(name: &str, f: &mut Figures, unit: &str, note: &str) {
    println!(
        "  {name:<38} {:>9.0} {unit}  p50 {:>8.1?}  p99 {:>8.1?}  p99.9 {:>8.1?}  {note}",
        f.rate(),
        f.pct(0.50),
        f.pct(0.99),
        f.pct(0.999)
    );
}
