//! The replay's figures: each setting's calls summed up overall and per harness, printed as
//! text, serialised as one JSON object (`docs/eval.md`, "Replayed agent sessions"), and drawn
//! as support against forwarded size.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::drive::{Found, Measured};
use super::transcript::{Harness, ReadCounts};
use crate::measure::median;

/// Price of input a prefix cache serves, against uncached input (list prices: a cache read
/// is a tenth of the base price).
pub const CACHED_PRICE: f64 = 0.1;

/// Price of input the cache does not serve, against the base price (list prices: writing the
/// cache costs a quarter more).
pub const UNCACHED_PRICE: f64 = 1.25;

/// Prompt lengths (characters) at which the buckets of [`Summary::prompts_whole`] change.
pub const PROMPT_BUCKETS: [(usize, &str); 3] =
    [(4_000, "<4k"), (16_000, "4k-16k"), (usize::MAX, ">=16k")];

/// A share of terms found, two ways.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Share {
    /// Found terms over all terms of the class (`None` without any).
    pub pooled: Option<f64>,
    /// The mean over calls holding terms of the class of each call's share.
    pub mean_per_call: Option<f64>,
}

/// One class of the answers' terms and how much of it each way of sending held.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Support {
    pub terms: usize,
    /// Calls whose answer holds terms of the class.
    pub calls: usize,
    pub proxy: Share,
    pub truncation: Share,
    pub clearing: Share,
}

/// Live prompts of one length bucket, and how many arrived whole in the forwarded request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prompts {
    pub bucket: &'static str,
    pub calls: usize,
    pub whole: usize,
}

/// Conversation bytes sent, directly and through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bytes {
    pub direct_total: usize,
    pub proxy_total: usize,
    pub direct_median: f64,
    pub proxy_median: f64,
    /// The median over calls of forwarded bytes over the harness's own.
    pub median_ratio: f64,
    /// The median over calls of the live turn's bytes (its prompt and tool round, forwarded
    /// whole) over the harness's own: the least any frame could forward.
    pub median_turn_ratio: f64,
}

/// Mean prefix shares of one way of sending.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefixShares {
    /// Over the calls that continue a turn, against the call before.
    pub tool_steps: Option<f64>,
    /// Over the calls that open a later turn of a session, against the last call before.
    pub new_turns: Option<f64>,
}

/// What a prefix cache serves, directly and through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prefix {
    pub direct: PrefixShares,
    pub proxy: PrefixShares,
    /// Estimated billed input through the proxy over direct: the bytes each request shares
    /// with its session's previous one at [`CACHED_PRICE`], the rest at [`UNCACHED_PRICE`].
    pub billed_input_ratio: f64,
}

/// One group of calls at one setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub calls: usize,
    /// Calls that open a turn.
    pub turns: usize,
    pub current_turn: Support,
    pub earlier_turns: Support,
    pub cross_session: Support,
    pub prompts_whole: Vec<Prompts>,
    pub bytes: Bytes,
    pub prefix: Prefix,
}

/// One replay: its setting and figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SettingReport {
    pub session_tokens: usize,
    /// Whether this is the shipped default.
    pub shipped: bool,
    /// Calls the proxy did not forward or did not answer 200 (not measured), and the first.
    pub failed_calls: usize,
    pub first_failure: Option<String>,
    pub seconds: f64,
    pub overall: Summary,
    pub by_harness: BTreeMap<&'static str, Summary>,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub harnesses: Vec<&'static str>,
    pub sessions: usize,
    pub calls: usize,
    pub read: ReadCounts,
    pub settings: Vec<SettingReport>,
}

/// `part / whole`, `None` over nothing.
fn ratio(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

/// The mean of `values`, `None` over none.
fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    ratio(sum, n as f64)
}

/// The support of one class over `calls` (`class` picks it from a call).
fn support(calls: &[&Measured], class: impl Fn(&Measured) -> Found) -> Support {
    let found: Vec<Found> = calls
        .iter()
        .map(|m| class(m))
        .filter(|f| f.terms > 0)
        .collect();
    let terms: usize = found.iter().map(|f| f.terms).sum();
    let share = |way: fn(&Found) -> usize| Share {
        pooled: ratio(found.iter().map(way).sum::<usize>() as f64, terms as f64),
        mean_per_call: mean(found.iter().map(|f| way(f) as f64 / f.terms as f64)),
    };
    Support {
        terms,
        calls: found.len(),
        proxy: share(|f| f.proxy),
        truncation: share(|f| f.truncation),
        clearing: share(|f| f.clearing),
    }
}

/// Input billed for one request: the cached bytes at their price, the rest at the other.
fn billed(input: usize, cached: usize) -> f64 {
    CACHED_PRICE * cached as f64 + UNCACHED_PRICE * (input - cached.min(input)) as f64
}

/// The figures of `calls`.
pub fn summarise(calls: &[&Measured]) -> Summary {
    let prompts_whole = PROMPT_BUCKETS
        .iter()
        .enumerate()
        .map(|(i, &(below, bucket))| {
            let floor = if i == 0 { 0 } else { PROMPT_BUCKETS[i - 1].0 };
            let of: Vec<bool> = calls
                .iter()
                .filter_map(|m| m.prompt)
                .filter(|&(chars, _)| chars >= floor && chars < below)
                .map(|(_, whole)| whole)
                .collect();
            Prompts {
                bucket,
                calls: of.len(),
                whole: of.iter().filter(|&&w| w).count(),
            }
        })
        .collect();
    let shares = |input: fn(&Measured) -> (usize, usize), opens: bool| {
        mean(
            calls
                .iter()
                .filter(|m| !m.first && m.opens_turn == opens)
                .map(|m| {
                    let (bytes, cached) = input(m);
                    cached as f64 / bytes.max(1) as f64
                }),
        )
    };
    let direct = |m: &Measured| (m.direct_input, m.direct_cached);
    let through = |m: &Measured| (m.forwarded_input, m.forwarded_cached);
    let bill = |input: fn(&Measured) -> (usize, usize)| {
        calls
            .iter()
            .map(|m| {
                let (bytes, cached) = input(m);
                billed(bytes, cached)
            })
            .sum::<f64>()
    };
    Summary {
        calls: calls.len(),
        turns: calls.iter().filter(|m| m.opens_turn).count(),
        current_turn: support(calls, |m| m.current),
        earlier_turns: support(calls, |m| m.earlier),
        cross_session: support(calls, |m| m.cross),
        prompts_whole,
        bytes: Bytes {
            direct_total: calls.iter().map(|m| m.direct_bytes).sum(),
            proxy_total: calls.iter().map(|m| m.forwarded_bytes).sum(),
            direct_median: median(calls.iter().map(|m| m.direct_bytes as f64).collect()),
            proxy_median: median(calls.iter().map(|m| m.forwarded_bytes as f64).collect()),
            median_ratio: median(
                calls
                    .iter()
                    .map(|m| m.forwarded_bytes as f64 / m.direct_bytes.max(1) as f64)
                    .collect(),
            ),
            median_turn_ratio: median(
                calls
                    .iter()
                    .map(|m| m.turn_bytes as f64 / m.direct_bytes.max(1) as f64)
                    .collect(),
            ),
        },
        prefix: Prefix {
            direct: PrefixShares {
                tool_steps: shares(direct, false),
                new_turns: shares(direct, true),
            },
            proxy: PrefixShares {
                tool_steps: shares(through, false),
                new_turns: shares(through, true),
            },
            billed_input_ratio: bill(through) / bill(direct).max(f64::MIN_POSITIVE),
        },
    }
}

/// The figures of one replay: overall and for each harness among the calls.
pub fn setting(
    session_tokens: usize,
    shipped: bool,
    measured: &[Measured],
    (failed_calls, first_failure): (usize, Option<String>),
    seconds: f64,
) -> SettingReport {
    let all: Vec<&Measured> = measured.iter().collect();
    let by_harness = Harness::ALL
        .into_iter()
        .filter_map(|h| {
            let of: Vec<&Measured> = measured.iter().filter(|m| m.harness == h).collect();
            (!of.is_empty()).then(|| (h.name(), summarise(&of)))
        })
        .collect();
    SettingReport {
        session_tokens,
        shipped,
        failed_calls,
        first_failure,
        seconds,
        overall: summarise(&all),
        by_harness,
    }
}

/// A share for the text report: three decimals, or `-` when there is none.
fn show(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

/// Bytes for the text report, in KB or MB.
fn size(bytes: f64) -> String {
    if bytes.is_nan() {
        "-".to_owned()
    } else if bytes >= 1e6 {
        format!("{:.1} MB", bytes / 1e6)
    } else {
        format!("{:.1} KB", bytes / 1e3)
    }
}

impl ReplayReport {
    /// The text report: what was read, the curve over the settings, then each setting's
    /// figures (overall, and per harness when there are several).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let r = &self.read;
        let _ = writeln!(
            out,
            "eval replay ({}): {} sessions, {} calls; {} files, {} lines, {} not JSON (skipped), \
             {} side-chain, {} repeated and {} synthetic records skipped, {} files without calls",
            self.harnesses.join(", "),
            self.sessions,
            self.calls,
            r.files,
            r.lines,
            r.not_json,
            r.sidechain,
            r.repeated,
            r.synthetic,
            r.without_calls
        );
        let _ = writeln!(
            out,
            "\ncurve: earlier-turn support (pooled) at the forwarded size\n  {:<22} {:>11} {:>7} {:>11} {:>9} {:>14}",
            "session_tokens", "fwd/direct", "proxy", "truncation", "clearing", "cross (proxy)"
        );
        for s in &self.settings {
            let o = &s.overall;
            let name = format!(
                "{}{}",
                s.session_tokens,
                if s.shipped { " (shipped)" } else { "" }
            );
            let _ = writeln!(
                out,
                "  {name:<22} {:>11.3} {:>7} {:>11} {:>9} {:>14}",
                o.bytes.median_ratio,
                show(o.earlier_turns.proxy.pooled),
                show(o.earlier_turns.truncation.pooled),
                show(o.earlier_turns.clearing.pooled),
                show(o.cross_session.proxy.pooled)
            );
        }
        for s in &self.settings {
            let _ = writeln!(
                out,
                "\nsession_tokens {}{}: {:.1} s{}",
                s.session_tokens,
                if s.shipped { " (shipped default)" } else { "" },
                s.seconds,
                if s.failed_calls > 0 {
                    format!(
                        "; {} calls not forwarded, first: {}",
                        s.failed_calls,
                        s.first_failure.as_deref().unwrap_or("")
                    )
                } else {
                    String::new()
                }
            );
            summary_lines(&mut out, "overall", &s.overall);
            if s.by_harness.len() > 1 {
                for (name, summary) in &s.by_harness {
                    summary_lines(&mut out, name, summary);
                }
            }
        }
        out
    }
}

/// One summary's lines of the text report.
fn summary_lines(out: &mut String, label: &str, s: &Summary) {
    let _ = writeln!(
        out,
        "  {label}: {} calls, {} turns\n    {:<16} {:>7} {:>6}  {:>15}  {:>15}  {:>15}",
        s.calls, s.turns, "terms found in", "terms", "calls", "proxy", "truncation", "clearing"
    );
    for (name, support) in [
        ("current turn", &s.current_turn),
        ("earlier turns", &s.earlier_turns),
        ("earlier sessions", &s.cross_session),
    ] {
        let pair =
            |share: &Share| format!("{} / {}", show(share.pooled), show(share.mean_per_call));
        let _ = writeln!(
            out,
            "    {name:<16} {:>7} {:>6}  {:>15}  {:>15}  {:>15}",
            support.terms,
            support.calls,
            pair(&support.proxy),
            pair(&support.truncation),
            pair(&support.clearing)
        );
    }
    let _ = writeln!(out, "    (pooled / mean per call)");
    let prompts: Vec<String> = s
        .prompts_whole
        .iter()
        .map(|p| format!("{} {}/{}", p.bucket, p.whole, p.calls))
        .collect();
    let _ = writeln!(out, "    live prompt arrived whole: {}", prompts.join(", "));
    let b = &s.bytes;
    let _ = writeln!(
        out,
        "    conversation bytes: direct {} (median {}), proxy {} (median {}); median proxy/direct {:.3} (the live turn alone {:.3})",
        size(b.direct_total as f64),
        size(b.direct_median),
        size(b.proxy_total as f64),
        size(b.proxy_median),
        b.median_ratio,
        b.median_turn_ratio
    );
    let p = &s.prefix;
    let _ = writeln!(
        out,
        "    prefix share: direct {} in tool steps, {} at new turns; proxy {} in tool steps, {} at new turns\n    billed input, proxy / direct: {:.3}",
        show(p.direct.tool_steps),
        show(p.direct.new_turns),
        show(p.proxy.tool_steps),
        show(p.proxy.new_turns),
        p.billed_input_ratio
    );
}

/// Plot size and margin, in SVG user units.
const PLOT_WIDTH: f64 = 640.0;
const PLOT_HEIGHT: f64 = 400.0;
const PLOT_MARGIN: f64 = 56.0;

/// An SVG plot of earlier-turn support (pooled) against the median forwarded size over the
/// harness's own, one point per setting for the proxy and for each baseline at its size.
pub fn plot(report: &ReplayReport) -> String {
    let points = |way: fn(&Support) -> Option<f64>| -> Vec<(f64, f64, usize)> {
        report
            .settings
            .iter()
            .filter_map(|s| {
                let x = s.overall.bytes.median_ratio;
                let y = way(&s.overall.earlier_turns)?;
                x.is_finite().then_some((x, y, s.session_tokens))
            })
            .collect()
    };
    let series = [
        ("proxy", "#1f77b4", points(|s| s.proxy.pooled)),
        ("truncation", "#d62728", points(|s| s.truncation.pooled)),
        ("clearing", "#2ca02c", points(|s| s.clearing.pooled)),
    ];
    let x_max = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|&(x, _, _)| x))
        .fold(1.0f64, f64::max);
    let (w, h, m) = (PLOT_WIDTH, PLOT_HEIGHT, PLOT_MARGIN);
    let px = |x: f64| m + x / x_max * (w - 2.0 * m);
    let py = |y: f64| h - m - y * (h - 2.0 * m);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">forwarded conversation / the harness's own (median)</text>\n\
         <text x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">earlier-turn terms supported (pooled)</text>\n",
        h - m,
        w - m,
        h - m,
        h - m,
        w / 2.0,
        h - 14.0,
        h / 2.0,
        h / 2.0
    );
    for tick in 0..=4 {
        let y = f64::from(tick) / 4.0;
        let x = x_max * f64::from(tick) / 4.0;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{y:.2}</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{x:.2}</text>",
            m - 6.0,
            py(y) + 4.0,
            px(x),
            h - m + 16.0
        );
    }
    for (i, (name, colour, points)) in series.iter().enumerate() {
        let path: Vec<String> = points
            .iter()
            .map(|&(x, y, _)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\"/>",
            path.join(" ")
        );
        for &(x, y, recent) in points {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"><title>{name}, session_tokens {recent}: {y:.3}</title></circle>",
                px(x),
                py(y)
            );
            if i == 0 {
                let _ = writeln!(
                    svg,
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{recent}</text>",
                    px(x) + 5.0,
                    py(y) - 5.0
                );
            }
        }
        let ly = m + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\">{name}</text>",
            w - m - 90.0,
            ly - 9.0,
            w - m - 75.0,
            ly
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(
        opens_turn: bool,
        first: bool,
        earlier: Found,
        prompt: Option<(usize, bool)>,
    ) -> Measured {
        Measured {
            harness: Harness::ClaudeCode,
            session: 0,
            call: 0,
            opens_turn,
            first,
            current: Found::default(),
            earlier,
            cross: Found::default(),
            direct_bytes: 1_000,
            forwarded_bytes: 250,
            turn_bytes: 100,
            direct_input: 100,
            forwarded_input: 50,
            direct_cached: if first { 0 } else { 90 },
            forwarded_cached: if first { 0 } else { 25 },
            prompt,
        }
    }

    #[test]
    fn support_is_pooled_over_terms_and_averaged_over_calls() {
        let found = |terms, proxy| Found {
            terms,
            proxy,
            truncation: 0,
            clearing: terms,
        };
        let calls = [
            call(true, true, found(4, 4), Some((100, true))),
            call(false, false, found(1, 0), None),
            call(true, false, Found::default(), Some((20_000, false))),
        ];
        let refs: Vec<&Measured> = calls.iter().collect();
        let s = summarise(&refs);
        assert_eq!((s.calls, s.turns), (3, 2));
        let e = s.earlier_turns;
        assert_eq!((e.terms, e.calls), (5, 2));
        assert_eq!(e.proxy.pooled, Some(0.8));
        assert_eq!(e.proxy.mean_per_call, Some(0.5));
        assert_eq!(e.truncation.pooled, Some(0.0));
        assert_eq!(e.clearing.mean_per_call, Some(1.0));
        assert_eq!(s.current_turn.proxy.pooled, None);
        assert_eq!(
            s.prompts_whole
                .iter()
                .map(|p| (p.calls, p.whole))
                .collect::<Vec<_>>(),
            [(1, 1), (0, 0), (1, 0)]
        );
        assert_eq!(s.bytes.median_ratio, 0.25);
        assert_eq!(s.bytes.median_turn_ratio, 0.1);
        assert_eq!(s.prefix.direct.tool_steps, Some(0.9));
        assert_eq!(s.prefix.proxy.new_turns, Some(0.5));
        let direct = billed(100, 0) + 2.0 * billed(100, 90);
        let proxy = billed(50, 0) + 2.0 * billed(50, 25);
        assert!((s.prefix.billed_input_ratio - proxy / direct).abs() < 1e-12);
    }

    #[test]
    fn the_plot_has_a_point_per_setting_and_way() {
        let calls = [call(
            true,
            true,
            Found {
                terms: 2,
                proxy: 1,
                truncation: 0,
                clearing: 2,
            },
            None,
        )];
        let report = ReplayReport {
            harnesses: vec!["claude-code"],
            sessions: 1,
            calls: 1,
            read: ReadCounts::default(),
            settings: [8_000, 24_000]
                .into_iter()
                .map(|r| setting(r, r == 24_000, &calls, (0, None), 0.0))
                .collect(),
        };
        let svg = plot(&report);
        assert_eq!(svg.matches("<circle").count(), 6);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(report.render().contains("24000 (shipped)"));
    }
}
