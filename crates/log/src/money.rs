//! Money as the log keeps it: whole millionths of a dollar (micro-USD), so spend adds up
//! exactly over thousands of calls. Dollars appear only at the edges (the API, the CLI,
//! configuration), converted here and nowhere else.

/// Millionths in a dollar.
const MICROS_PER_USD: f64 = 1_000_000.0;

/// `usd` dollars in millionths of a dollar, rounded to the nearest (a negative or
/// non-finite amount is 0).
pub fn micro_usd(usd: f64) -> u64 {
    (usd * MICROS_PER_USD).round() as u64
}

/// `micro` millionths of a dollar in dollars.
pub fn usd(micro: u64) -> f64 {
    micro as f64 / MICROS_PER_USD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_and_millionths_round_trip_at_the_edges() {
        assert_eq!(micro_usd(2.5), 2_500_000);
        assert_eq!(micro_usd(0.0000014), 1);
        assert_eq!(micro_usd(-1.0), 0);
        assert_eq!(micro_usd(f64::NAN), 0);
        assert_eq!(usd(2_500_000), 2.5);
        assert_eq!(usd(micro_usd(0.084)), 0.084);
    }
}
