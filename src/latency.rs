//! Latency histograms, recorded one way everywhere: microseconds in an auto-resizing
//! hdrhistogram (3 significant figures), read back in milliseconds.
//!
//! `Histogram::saturating_record` never resizes: on a histogram made by `Histogram::new` it
//! clamps every value above its initial range (2,047) to that range's top, so it must not be used
//! for latencies.

use std::time::Duration;

use hdrhistogram::Histogram;

/// An empty latency histogram.
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures is a valid precision")
}

/// Record `elapsed` in microseconds, growing the histogram as needed.
pub fn record(histogram: &mut Histogram<u64>, elapsed: Duration) {
    histogram
        .record(elapsed.as_micros().min(u128::from(u64::MAX >> 1)) as u64)
        .expect("an auto-resizing histogram takes any latency");
}

/// The value at quantile `q`, in milliseconds.
pub fn ms(histogram: &Histogram<u64>, q: f64) -> f64 {
    histogram.value_at_quantile(q) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_latencies_are_kept_not_clamped() {
        let mut h = histogram();
        for ms in [1u64, 3, 45, 30_000] {
            record(&mut h, Duration::from_millis(ms));
        }
        assert!(
            (super::ms(&h, 1.0) - 30_000.0).abs() < 30.0,
            "{}",
            super::ms(&h, 1.0)
        );
        assert!(
            (super::ms(&h, 0.75) - 45.0).abs() < 0.1,
            "{}",
            super::ms(&h, 0.75)
        );
        assert!((super::ms(&h, 0.25) - 1.0).abs() < 0.01);
    }
}
