//! Latency statistics: nearest-rank percentiles over the per-iteration samples.

/// Summary of one size's latency samples (µs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatStats {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
    /// Minimum.
    pub min: f64,
    /// Samples.
    pub n: usize,
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of sorted `v`: the smallest sample with at
/// least p% of the samples ≤ it. `None` for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Summarises samples (µs). `None` for no samples.
pub fn summarize(samples: &[f64]) -> Option<LatStats> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(LatStats {
        p50: percentile(&v, 50.0)?,
        p99: percentile(&v, 99.0)?,
        mean: v.iter().sum::<f64>() / v.len() as f64,
        min: v[0],
        n: v.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), Some(2.0));
        assert_eq!(percentile(&v, 99.0), Some(4.0));
    }

    #[test]
    fn summary_unsorted_input() {
        let s = summarize(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.p50, 3.0);
        assert_eq!(s.p99, 5.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.mean, 3.0);
        assert_eq!(s.n, 5);
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[f64::NAN]).is_none());
    }
}
