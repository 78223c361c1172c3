//! Printing results: aligned two-column tables.

/// Prints `rows` as an aligned table under `title`.
pub fn table(title: &str, rows: &[(&str, String)]) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("{title}");
    println!("{}", "-".repeat(title.len().max(24)));
    for (k, v) in rows {
        println!("{k:<width$}  {v}");
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
