//! Printing results: aligned two-column tables.

/// Prints `rows` as an aligned table under `title`.
pub fn table(title: &str, rows: &[(&str, String)]) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    outln!("{title}");
    outln!("{}", "-".repeat(title.len().max(24)));
    for (k, v) in rows {
        outln!("{k:<width$}  {v}");
    }
}

/// Formats a rate with thousands separators.
pub fn rate(v: f64) -> String {
    let n = v.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate rounded for people: three significant digits and a unit prefix (`16.4 M`, `950`,
/// `2.05 k`), for progress bars and live status lines; tables keep [`rate`]'s exact figures.
pub fn human_rate(v: f64) -> String {
    const PREFIXES: [(f64, &str); 3] = [(1e9, " G"), (1e6, " M"), (1e3, " k")];
    if !v.is_finite() || v < 0.0 {
        return "-".into();
    }
    // A value that rounds up to the next unit (999,950 -> "1.00 M") takes that unit.
    let (scale, unit) = PREFIXES.into_iter().find(|&(scale, _)| v >= scale * 0.9995).unwrap_or((1.0, ""));
    let x = v / scale;
    let digits = if scale == 1.0 || x >= 99.95 { 0 } else if x >= 9.995 { 1 } else { 2 };
    format!("{x:.digits$}{unit}")
}

/// A progress-bar style key (`{rate}`) that shows the bar's rate through [`human_rate`],
/// where indicatif's own `{per_sec}` prints `16,384,595.2101/s`.
pub fn rate_key(state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    let _ = write!(w, "{}/s", human_rate(state.per_sec()));
}

/// The median of `xs` (the mean of the middle two for an even count; NaN when empty).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::human_rate;

    #[test]
    fn human_rates_keep_three_significant_digits() {
        assert_eq!(human_rate(16_384_595.210_1), "16.4 M");
        assert_eq!(human_rate(950.4), "950");
        assert_eq!(human_rate(2_049.0), "2.05 k");
        assert_eq!(human_rate(999_960.0), "1.00 M");
        assert_eq!(human_rate(123_456_789.0), "123 M");
        assert_eq!(human_rate(3_800_000_000.0), "3.80 G");
        assert_eq!(human_rate(0.0), "0");
        assert_eq!(human_rate(f64::NAN), "-");
    }
}
