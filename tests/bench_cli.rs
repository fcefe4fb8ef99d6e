//! The benchmark commands' JSON contract, at a small scale: the objects scripts read, with
//! the shape they were asked for.

mod common;

use common::perpetuity;

fn json(output: &std::process::Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object on stdout")
}

fn positive(report: &serde_json::Value, field: &str) -> f64 {
    let value = report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing in {report}"));
    assert!(value > 0.0, "{field} = {value}");
    value
}

#[test]
fn bench_proxy_spreads_rows_and_requests_over_users() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let args = |users: &'static str| {
        [
            "bench",
            "proxy",
            "--rows",
            "120",
            "--users",
            users,
            "--requests",
            "6",
            "--data",
            data,
            "--json",
        ]
    };
    let report = json(&perpetuity(&args("3")));
    assert_eq!(report["rows"], 120);
    assert_eq!(report["users"], 3);
    assert_eq!(report["scope_rows"], 40);
    assert_eq!(report["requests"], 6);
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    for way in ["direct", "proxy", "proxy_recall_off"] {
        let first = positive(&report[way], "first_byte_p50_ms");
        assert!(positive(&report[way], "total_p99_ms") >= first, "{report}");
        // The bound the CPU allows is the cores over the CPU time a call.
        let cpu = positive(&report[way], "cpu_ms_per_call");
        let bound = positive(&report[way], "cpu_bound_calls_per_s");
        assert!((bound * cpu / 1e3 - cores).abs() < 1e-6 * cores, "{report}");
    }

    // The same store read again keeps its rows; another number of users is refused.
    // The first run's three rounds through the proxy captured at most a question and a reply
    // each; ingesting again would have doubled the rows.
    let again = json(&perpetuity(&args("3")));
    let rows = again["rows"].as_u64().expect("rows");
    assert!((120..=120 + 3 * 6 * 2).contains(&rows), "{again}");
    let other = perpetuity(&args("5"));
    assert!(!other.status.success());
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(stderr.contains("another number of users"), "{stderr}");
}

#[test]
fn bench_scan_prints_the_fields_scripts_read() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let report = json(&perpetuity(&[
        "bench",
        "scan",
        "--rows",
        "3000",
        "--users",
        "2",
        "--queries",
        "20",
        "--fidelity-queries",
        "10",
        "--threads",
        "2",
        "--data",
        data.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(report["rows"], 3000);
    assert_eq!(report["threads"], 2);
    for field in [
        "bytes_per_row",
        "first_pass_rows_per_s_per_core",
        "first_pass_bytes_per_s",
        "memory_read_bytes_per_s",
        "bandwidth_ratio",
        "query_p50_ms",
        "query_p99_ms",
    ] {
        positive(&report, field);
    }
    assert!(
        report["query_p99_ms"].as_f64() >= report["query_p50_ms"].as_f64(),
        "{report}"
    );
    // The two-stage search agrees with brute force on every one of the ten top-10 sets.
    assert_eq!(report["fidelity_top10"], 1.0, "{report}");
}
