//! Baseline and Steadfast timed in alternating rounds (A B A B …), so a machine that
//! slows down or speeds up during a run moves both alike, and verdicts read the
//! median of per-round ratios rather than a ratio of two separate runs.

use std::time::Duration;

/// The rounds of one comparison.
#[derive(Debug, Default)]
pub(crate) struct Rounds {
    base: Vec<Duration>,
    ours: Vec<Duration>,
}

impl Rounds {
    /// Records one round: the baseline's time and Steadfast's, measured back to back.
    pub(crate) fn push(&mut self, base: Duration, ours: Duration) {
        self.base.push(base);
        self.ours.push(ours);
    }

    /// How many rounds were recorded.
    pub(crate) fn len(&self) -> usize {
        self.base.len()
    }

    /// The baseline's median time.
    pub(crate) fn base(&self) -> Duration {
        median(self.base.clone())
    }

    /// Steadfast's median time.
    pub(crate) fn ours(&self) -> Duration {
        median(self.ours.clone())
    }

    /// The median of the per-round ratios Steadfast / baseline.
    pub(crate) fn ratio(&self) -> f64 {
        median_f64(
            self.base
                .iter()
                .zip(&self.ours)
                .map(|(b, o)| o.as_secs_f64() / b.as_secs_f64().max(1e-9))
                .collect(),
        )
    }

    /// The median of the per-round differences Steadfast − baseline, in milliseconds.
    pub(crate) fn added_ms(&self) -> f64 {
        median_f64(
            self.base
                .iter()
                .zip(&self.ours)
                .map(|(b, o)| (o.as_secs_f64() - b.as_secs_f64()) * 1e3)
                .collect(),
        )
    }
}

/// The middle value (the upper one of an even count).
pub(crate) fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn median_f64(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_is_the_median_of_per_round_ratios() {
        let ms = Duration::from_millis;
        let mut rounds = Rounds::default();
        // The machine slows down threefold in the middle round: both sides alike.
        rounds.push(ms(10), ms(12));
        rounds.push(ms(30), ms(36));
        rounds.push(ms(10), ms(13));
        assert_eq!(rounds.len(), 3);
        assert!((rounds.ratio() - 1.2).abs() < 1e-9, "{}", rounds.ratio());
        assert_eq!(rounds.base(), ms(10));
        assert_eq!(rounds.ours(), ms(13));
        assert!((rounds.added_ms() - 3.0).abs() < 1e-9);
    }
}
