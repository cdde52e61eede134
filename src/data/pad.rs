//! Padding strategies for variable-length batches: how long a batch's rows are
//! (`max_length`: fixed; `dynamic` and `bucket`: the batch's longest, each rounded up to
//! `multiple_of`), the collation of token ids into a padded batch with its lengths, and the
//! length buckets and their deterministic batches. Counts real and padded tokens, the
//! waste the strategies differ in. No Burn here.

use crate::recipe::PaddingStrategy;
use crate::rng::SplitMix64;

use super::text::TextSet;

#[derive(Debug, Clone, PartialEq)]
pub struct Padding {
    pub strategy: PaddingStrategy,
    pub max_length: usize,
    pub multiple_of: usize,
    pub pad_id: u32,
}

/// A padded batch: `ids` is `rows × len`, row-major; `lengths` are the real tokens per row.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBatch {
    pub ids: Vec<i32>,
    pub len: usize,
    pub lengths: Vec<usize>,
}

impl TokenBatch {
    pub fn real_tokens(&self) -> usize {
        self.lengths.iter().sum()
    }
    /// All positions, real and padding.
    pub fn padded_tokens(&self) -> usize {
        self.lengths.len() * self.len
    }
}

/// Share of padded positions that are padding, in percent.
pub fn waste_pct(real: usize, padded: usize) -> f64 {
    if padded == 0 {
        0.0
    } else {
        100.0 * (padded - real) as f64 / padded as f64
    }
}

impl Padding {
    /// The row length of a batch whose longest sequence has `longest` tokens.
    pub fn row_len(&self, longest: usize) -> usize {
        let base = match self.strategy {
            PaddingStrategy::MaxLength => self.max_length,
            PaddingStrategy::Dynamic | PaddingStrategy::Bucket => longest.clamp(1, self.max_length),
        };
        base.div_ceil(self.multiple_of.max(1)) * self.multiple_of.max(1)
    }

    /// The longest row any batch can have (the Transformer's position table).
    pub fn max_row_len(&self) -> usize {
        self.max_length.div_ceil(self.multiple_of.max(1)) * self.multiple_of.max(1)
    }

    pub fn collate(&self, set: &TextSet, indices: &[usize]) -> TokenBatch {
        let longest = indices
            .iter()
            .map(|&i| set.seqs[i].len())
            .max()
            .unwrap_or(1);
        let len = self.row_len(longest);
        let mut ids = vec![self.pad_id as i32; indices.len() * len];
        let mut lengths = Vec::with_capacity(indices.len());
        for (row, &i) in ids.chunks_exact_mut(len).zip(indices) {
            let s = &set.seqs[i][..set.seqs[i].len().min(len)];
            for (slot, &t) in row.iter_mut().zip(s) {
                *slot = t as i32;
            }
            lengths.push(s.len());
        }
        TokenBatch { ids, len, lengths }
    }
}

/// Upper bounds (inclusive) of `buckets` length buckets at quantiles of `lengths`; the last
/// is the longest length. Equal bounds merge, so there may be fewer buckets.
pub fn bucket_bounds(lengths: &[usize], buckets: usize) -> Vec<usize> {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let Some(&max) = sorted.last() else {
        return vec![];
    };
    // Past one more than the lengths, every length is already a bound: the same bounds,
    // without a list of `buckets` entries (10^12 of them aborted the run).
    let buckets = buckets.min(sorted.len() + 1);
    let mut bounds: Vec<usize> = (1..buckets.max(1))
        .map(|k| sorted[(k * sorted.len() / buckets).min(sorted.len() - 1)])
        .collect();
    bounds.push(max);
    bounds.dedup();
    bounds
}

/// One epoch of bucketed batches: each sample goes to the first bucket whose bound holds its
/// length; each bucket is shuffled (by seed and epoch); the buckets are laid end to end in
/// length order and cut into optimizer steps of `batch_size × step_batches` samples, so a
/// step holds one bucket's samples (or, where two buckets meet, two neighbours'); the whole
/// steps are shuffled, the short one (if any, unless `drop_last` drops it) kept last, as an
/// epoch's last step is without buckets; then each step is cut into its `step_batches`
/// batches. Every sample is in exactly one batch, and an epoch has as many batches as
/// without buckets. With accumulation, a step's micro-batches are the samples one batch of
/// the step's size would hold (they were shuffled one by one: a step mixed buckets, and a
/// short micro-batch fell mid-epoch).
#[allow(clippy::too_many_arguments)]
pub fn bucket_batches(
    lengths: &[usize],
    bounds: &[usize],
    batch_size: usize,
    step_batches: usize,
    shuffle: bool,
    drop_last: bool,
    seed: u64,
    epoch: usize,
) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = vec![vec![]; bounds.len().max(1)];
    for (i, &l) in lengths.iter().enumerate() {
        let b = bounds
            .iter()
            .position(|&u| l <= u)
            .unwrap_or(bounds.len().saturating_sub(1));
        buckets[b].push(i);
    }
    let rng = SplitMix64::new(seed ^ 0xB0C4_E7B0).fork(epoch as u64);
    let mut order = Vec::with_capacity(lengths.len());
    for (b, mut members) in buckets.into_iter().enumerate() {
        if shuffle {
            rng.fork(b as u64).shuffle(&mut members);
        }
        order.extend(members);
    }
    let bs = batch_size.max(1);
    let step = bs.saturating_mul(step_batches.max(1));
    let mut steps: Vec<&[usize]> = order.chunks(step).collect();
    let short = steps
        .last()
        .filter(|s| s.len() < step)
        .is_some()
        .then(|| steps.pop())
        .flatten();
    if shuffle {
        rng.fork(u64::MAX).shuffle(&mut steps);
    }
    steps.extend(short.filter(|_| !drop_last));
    steps
        .into_iter()
        .flat_map(|s| s.chunks(bs))
        .filter(|c| !(drop_last && c.len() < bs))
        .map(<[usize]>::to_vec)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(lens: &[usize]) -> TextSet {
        TextSet {
            seqs: lens.iter().map(|&n| (1..=n as u32).collect()).collect(),
            labels: vec![0; lens.len()],
        }
    }

    fn pad(strategy: PaddingStrategy, multiple_of: usize) -> Padding {
        Padding {
            strategy,
            max_length: 6,
            multiple_of,
            pad_id: 0,
        }
    }

    #[test]
    fn waste_by_hand() {
        // Rows of 2, 5 and 3 real tokens.
        let s = set(&[2, 5, 3]);
        let d = pad(PaddingStrategy::Dynamic, 1).collate(&s, &[0, 1, 2]);
        assert_eq!((d.len, d.real_tokens(), d.padded_tokens()), (5, 10, 15));
        assert_eq!(d.ids[..5], [1, 2, 0, 0, 0]);
        assert!((waste_pct(d.real_tokens(), d.padded_tokens()) - 100.0 * 5.0 / 15.0).abs() < 1e-12);
        let m = pad(PaddingStrategy::MaxLength, 1).collate(&s, &[0, 1, 2]);
        assert_eq!(
            (m.len, m.padded_tokens()),
            (6, 18),
            "every batch padded to max_length"
        );
        assert!((waste_pct(m.real_tokens(), m.padded_tokens()) - 100.0 * 8.0 / 18.0).abs() < 1e-12);
        // Longer than max_length is cut.
        let long = set(&[9]);
        assert_eq!(
            pad(PaddingStrategy::Dynamic, 1)
                .collate(&long, &[0])
                .lengths,
            [6]
        );
    }

    #[test]
    fn multiple_of_rounds_up() {
        let p = Padding {
            strategy: PaddingStrategy::Dynamic,
            max_length: 100,
            multiple_of: 8,
            pad_id: 0,
        };
        assert_eq!(
            [1, 8, 9, 16, 17, 100].map(|l| p.row_len(l)),
            [8, 8, 16, 16, 24, 104]
        );
        assert_eq!(p.max_row_len(), 104);
        let m = Padding {
            strategy: PaddingStrategy::MaxLength,
            ..p.clone()
        };
        assert_eq!(m.row_len(3), 104);
    }

    #[test]
    fn more_buckets_than_lengths_make_every_length_a_bound_without_a_vast_list() {
        let lengths: Vec<usize> = (0..103).map(|i| (i * 37) % 50 + 1).collect();
        let mut every = lengths.clone();
        every.sort_unstable();
        every.dedup();
        for buckets in [104, 105, 1000, 1 << 40, usize::MAX] {
            assert_eq!(bucket_bounds(&lengths, buckets), every, "{buckets} buckets");
        }
    }

    #[test]
    fn buckets_cover_each_sample_once_and_are_deterministic() {
        let lengths: Vec<usize> = (0..103).map(|i| (i * 37) % 50 + 1).collect();
        let bounds = bucket_bounds(&lengths, 4);
        assert_eq!(bounds.len(), 4);
        assert_eq!(*bounds.last().unwrap(), 50);
        let a = bucket_batches(&lengths, &bounds, 8, 1, true, false, 3, 0);
        assert_eq!(
            a,
            bucket_batches(&lengths, &bounds, 8, 1, true, false, 3, 0),
            "same seed, same batches"
        );
        assert_ne!(
            a,
            bucket_batches(&lengths, &bounds, 8, 1, true, false, 3, 1),
            "a new order each epoch"
        );
        let mut all: Vec<usize> = a.concat();
        all.sort();
        assert_eq!(
            all,
            (0..103).collect::<Vec<_>>(),
            "every sample exactly once"
        );
        assert_eq!(
            a.len(),
            103usize.div_ceil(8),
            "as many batches as without buckets"
        );
        let bucket = |i: usize| bounds.iter().position(|&u| lengths[i] <= u).unwrap();
        for b in &a {
            let (lo, hi) = (
                b.iter().map(|&i| bucket(i)).min().unwrap(),
                b.iter().map(|&i| bucket(i)).max().unwrap(),
            );
            assert!(hi - lo <= 1, "a batch spans buckets {lo}..={hi}");
        }
        let mixed = a
            .iter()
            .filter(|b| b.iter().any(|&i| bucket(i) != bucket(b[0])))
            .count();
        assert!(mixed < bounds.len(), "only where buckets meet");
        let dropped = bucket_batches(&lengths, &bounds, 8, 1, true, true, 3, 0);
        assert!(dropped.iter().all(|b| b.len() == 8) && dropped.len() == 103 / 8);
        // The short batch is the epoch's last, as without buckets.
        assert_eq!(a.last().map(Vec::len), Some(103 % 8));
        // Steps of 4 batches of 2: each step is one batch of 8 of the unaccumulated
        // epoch, cut in four (its short batch, the last).
        let steps = bucket_batches(&lengths, &bounds, 2, 4, true, false, 3, 0);
        let joined: Vec<Vec<usize>> = steps.chunks(4).map(|s| s.concat()).collect();
        assert_eq!(joined, a);
        let dropped_steps = bucket_batches(&lengths, &bounds, 2, 4, true, true, 3, 0);
        assert_eq!(dropped_steps.len(), 103 / 8 * 4);
    }
}
