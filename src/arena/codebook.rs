//! The codebook of the first pass's 2-bit codes: one per arena, computed from the rows' int8
//! vectors, stored in `pages.bin` after the header.
//!
//! For a row vector `r` (its int8 values times its scale) and `d = r − μ`, the code holds per
//! dimension a sign bit `s_i = d_i > 0` and a magnitude bit `m_i = |d_i| > τ_i`, and the row a
//! scale `α`, the least-squares fit of `|d|` by `b_i = m_i ? hi_i : lo_i`. The dense part of the
//! first pass estimates `q · r ≈ q · μ + α · Σ_i q_i · (s_i ? +1 : −1) · b_i`.

use bytemuck::{Pod, Zeroable};
use rayon::prelude::*;

use super::page::{DIMS, Page, RowCode, Sketch, WORDS};

/// Histogram bins per dimension for the median of `|d_i|`: the median is found to within
/// 1/4,096 of the dimension's largest `|d_i|`, far below the spread the code has to split.
const MEDIAN_BINS: usize = 4096;
/// Pages per task when the codebook is computed: partial sums are combined in page order, so
/// the result does not depend on the thread count.
const CHUNK_PAGES: usize = 64;
/// Rows a codebook's statistics are taken over at most: past this, every `n`-th page, so that
/// a recompute at a million rows reads a sample of them, not all (re-encoding reads all).
/// Per-dimension means and medians over this many rows are as good as over all of them.
pub const CODEBOOK_SAMPLE_ROWS: u64 = 65_536;

/// The 2-bit codebook: the rows' mean `μ`, the per-dimension median `τ` of `|d|`, and the mean
/// `|d|` at or below it (`lo`) and above it (`hi`). 4,160 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct Codebook {
    pub mean: [f32; DIMS],
    pub median: [f32; DIMS],
    pub lo: [f32; DIMS],
    pub hi: [f32; DIMS],
    /// Rows the arena held when it was computed (its statistics are over at most
    /// [`CODEBOOK_SAMPLE_ROWS`] of them); 0 before the arena first held a row.
    pub rows: u64,
    pub reserved: [u8; 52],
    /// CRC-32 of the codebook with this field zero.
    pub checksum: u32,
}

const _: () = assert!(std::mem::size_of::<Codebook>() == 4160);
const _: () = assert!(std::mem::size_of::<Codebook>().is_multiple_of(64));

/// The held rows' vectors, each as int8 values and a scale, in page order.
fn rows<'a>(pages: &[&'a Page]) -> impl Iterator<Item = (&'a [i8], f32)> {
    pages
        .iter()
        .flat_map(|page| (0..page.rows as usize).map(move |i| (page.vector(i), page.scales[i])))
}

/// `f` over chunks of [`CHUNK_PAGES`] pages on the rayon pool, the results in page order.
fn per_chunk<T: Send>(pages: &[&Page], f: impl Fn(&[&Page]) -> T + Sync + Send) -> Vec<T> {
    pages.par_chunks(CHUNK_PAGES).map(f).collect()
}

impl Codebook {
    /// The codebook of an arena without rows: every code all zero with `α` 0.
    pub fn empty() -> Self {
        let mut book = Self::zeroed();
        book.checksum = book.compute_checksum();
        book
    }

    /// The codebook of the rows held by `pages`, its statistics over every `n`-th page where
    /// they hold more than [`CODEBOOK_SAMPLE_ROWS`]. Deterministic: the same rows in the same
    /// pages give the same codebook on any number of threads.
    pub fn compute(pages: &[Page]) -> Self {
        let held: u64 = pages.iter().map(|p| u64::from(p.rows)).sum();
        if held == 0 {
            return Self::empty();
        }
        let step = held.div_ceil(CODEBOOK_SAMPLE_ROWS) as usize;
        let sample: Vec<&Page> = pages.iter().step_by(step).collect();
        let pages = &sample[..];
        let count: u64 = pages.iter().map(|p| u64::from(p.rows)).sum();
        let mut book = Self::zeroed();
        book.rows = held;
        let n = count as f64;

        let sums = per_chunk(pages, |chunk| {
            let mut sum = [0f64; DIMS];
            for (values, scale) in rows(chunk) {
                for (s, &v) in sum.iter_mut().zip(values) {
                    *s += f64::from(f32::from(v) * scale);
                }
            }
            sum
        });
        for i in 0..DIMS {
            book.mean[i] = (sums.iter().map(|s| s[i]).sum::<f64>() / n) as f32;
        }

        let maxima = per_chunk(pages, |chunk| {
            let mut max = [0f32; DIMS];
            for (values, scale) in rows(chunk) {
                for (d, m) in book.deviations(values, scale).zip(&mut max) {
                    *m = m.max(d.abs());
                }
            }
            max
        });
        let max: Vec<f32> = (0..DIMS)
            .map(|i| maxima.iter().map(|m| m[i]).fold(0.0, f32::max))
            .collect();
        let bin = |i: usize, d: f32| {
            if max[i] > 0.0 {
                ((d.abs() / max[i] * MEDIAN_BINS as f32) as usize).min(MEDIAN_BINS - 1)
            } else {
                0
            }
        };
        // Integer counts: summed in any order, the same histogram; one per task, not per chunk.
        let histogram = pages
            .par_chunks(CHUNK_PAGES)
            .fold(
                || vec![0u64; DIMS * MEDIAN_BINS],
                |mut histogram, chunk| {
                    for (values, scale) in rows(chunk) {
                        for (i, d) in book.deviations(values, scale).enumerate() {
                            histogram[i * MEDIAN_BINS + bin(i, d)] += 1;
                        }
                    }
                    histogram
                },
            )
            .reduce_with(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            })
            .expect("at least one page");
        for i in 0..DIMS {
            let mut below = 0u64;
            let half = count.div_ceil(2);
            for b in 0..MEDIAN_BINS {
                below += histogram[i * MEDIAN_BINS + b];
                if below >= half {
                    book.median[i] = (b + 1) as f32 / MEDIAN_BINS as f32 * max[i];
                    break;
                }
            }
        }

        let buckets = per_chunk(pages, |chunk| {
            // Per dimension: sum and count at or below the median, then above it.
            let mut bucket = vec![(0f64, 0u64, 0f64, 0u64); DIMS];
            for (values, scale) in rows(chunk) {
                for ((d, t), b) in book
                    .deviations(values, scale)
                    .zip(&book.median)
                    .zip(&mut bucket)
                {
                    if d.abs() > *t {
                        (b.2, b.3) = (b.2 + f64::from(d.abs()), b.3 + 1);
                    } else {
                        (b.0, b.1) = (b.0 + f64::from(d.abs()), b.1 + 1);
                    }
                }
            }
            bucket
        });
        for i in 0..DIMS {
            let (mut lo, mut lo_n, mut hi, mut hi_n) = (0f64, 0u64, 0f64, 0u64);
            for b in &buckets {
                (lo, lo_n, hi, hi_n) = (lo + b[i].0, lo_n + b[i].1, hi + b[i].2, hi_n + b[i].3);
            }
            let mean = |sum: f64, n: u64| {
                if n > 0 {
                    (sum / n as f64) as f32
                } else {
                    book.median[i]
                }
            };
            book.lo[i] = mean(lo, lo_n);
            book.hi[i] = mean(hi, hi_n);
        }
        book.checksum = book.compute_checksum();
        book
    }

    /// `r − μ` per dimension for a row of int8 `values` and `scale`.
    fn deviations<'a>(&'a self, values: &'a [i8], scale: f32) -> impl Iterator<Item = f32> + 'a {
        values
            .iter()
            .zip(&self.mean)
            .map(move |(&v, &mean)| f32::from(v) * scale - mean)
    }

    /// The 2-bit code of a row of int8 `values` and `scale`; `α` is 0 while the codebook is
    /// empty.
    pub fn encode(&self, values: &[i8], scale: f32) -> RowCode {
        let mut code = RowCode {
            signs: [0; WORDS],
            magnitudes: [0; WORDS],
            alpha: 0.0,
        };
        let (mut fit, mut norm) = (0f32, 0f32);
        for (i, d) in self.deviations(values, scale).enumerate() {
            let high = d.abs() > self.median[i];
            code.signs[i / 64] |= u64::from(d > 0.0) << (i % 64);
            code.magnitudes[i / 64] |= u64::from(high) << (i % 64);
            let b = if high { self.hi[i] } else { self.lo[i] };
            fit += d.abs() * b;
            norm += b * b;
        }
        if norm > 0.0 {
            code.alpha = fit / norm;
        }
        code
    }

    pub fn compute_checksum(&self) -> u32 {
        let mut copy = *self;
        copy.checksum = 0;
        crc32fast::hash(bytemuck::bytes_of(&copy))
    }

    /// Re-encode every row of `pages` into their sketches, `sketches[p]` being page `p`'s (in
    /// parallel, one page per task).
    pub fn encode_all(&self, pages: &mut [Page], sketches: &mut [Sketch]) {
        pages
            .par_iter_mut()
            .zip(sketches.par_iter_mut())
            .for_each(|(page, sketch)| {
                // Marked first: a process killed among the page's codes leaves it named as
                // coded under this codebook, which the next open undoes.
                page.codebook = self.checksum;
                super::in_order();
                for i in 0..page.rows as usize {
                    let code = self.encode(page.vector(i), page.scales[i]);
                    sketch.set_code(i, &code);
                    if i == 0 {
                        crate::failpoint::hit("arena.mid_recode");
                    }
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::PAGE_ROWS;

    fn page_of(rows: &[[i8; DIMS]]) -> Page {
        let mut page = Page::zeroed();
        for (i, values) in rows.iter().enumerate() {
            page.vectors[i * DIMS..(i + 1) * DIMS].copy_from_slice(values);
            page.scales[i] = 0.01;
        }
        page.rows = rows.len() as u32;
        page
    }

    #[test]
    fn the_codebook_splits_each_dimension_at_its_median() {
        // Dimension 0 takes the values −20, −10, 10, 20 (times 0.01): mean 0, |d| = 0.1, 0.1,
        // 0.2, 0.2 with median 0.1 (to a bin), lo 0.1, hi 0.2.
        let rows: Vec<[i8; DIMS]> = [-20i8, -10, 10, 20]
            .iter()
            .map(|&v| {
                let mut r = [0i8; DIMS];
                r[0] = v;
                r
            })
            .collect();
        let pages = [page_of(&rows)];
        let book = Codebook::compute(&pages);
        assert_eq!(book.rows, 4);
        assert!(book.mean[0].abs() < 1e-7);
        assert!((book.median[0] - 0.1).abs() < 0.2 / MEDIAN_BINS as f32 + 1e-6);
        assert!((book.lo[0] - 0.1).abs() < 1e-6 && (book.hi[0] - 0.2).abs() < 1e-6);
        assert_eq!(book.checksum, book.compute_checksum());
        let code = book.encode(&rows[3], 0.01);
        assert_eq!((code.signs[0] & 1, code.magnitudes[0] & 1), (1, 1));
        assert!((code.alpha - 1.0).abs() < 1e-5, "{}", code.alpha);
        let code = book.encode(&rows[1], 0.01);
        assert_eq!((code.signs[0] & 1, code.magnitudes[0] & 1), (0, 0));
    }

    #[test]
    fn past_the_sample_the_statistics_are_every_nth_pages() {
        // 1,025 full pages: 65,600 rows, two per sampled row, so every second page is read.
        let pages: Vec<Page> = (0..1_025)
            .map(|p| {
                let rows: Vec<[i8; DIMS]> = (0..PAGE_ROWS)
                    .map(|i| std::array::from_fn(|d| ((p * 7 + i * 3 + d) % 61) as i8 - 30))
                    .collect();
                page_of(&rows)
            })
            .collect();
        let sampled: Vec<Page> = pages.iter().step_by(2).copied().collect();
        let (all, sample) = (Codebook::compute(&pages), Codebook::compute(&sampled));
        assert_eq!(all.rows, 65_600);
        assert_eq!(sample.rows, 513 * PAGE_ROWS as u64);
        assert_eq!(
            (all.mean, all.median, all.lo, all.hi),
            (sample.mean, sample.median, sample.lo, sample.hi)
        );
        assert_eq!(all.checksum, all.compute_checksum());
    }

    #[test]
    fn an_empty_codebook_encodes_zero_scales() {
        let book = Codebook::compute(&[]);
        assert_eq!(book.rows, 0);
        assert_eq!(book.encode(&[5; DIMS], 0.01).alpha, 0.0);
    }
}
