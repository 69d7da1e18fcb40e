//! `mango-bench ttfi --quick` runs end to end and its last line is the
//! issue's machine-readable one. Not a measurement: nothing here is timed.
//!
//! Needs `DATABASE_URL` (a server it may create databases on),
//! `mango-runner` and `mango-worker` built next to the bench
//! (`cargo build -p mango-runner -p mango-controller`), and for its Docker
//! cases `MANGO_TEST_SANDBOX_IMAGE` (`scripts/sandbox-image.sh`); without
//! that image the Docker figures must be `n/a`, and with `CI` set the test
//! fails instead.

use std::path::Path;
use std::process::Command;

const KEYS: [&str; 9] = [
    "ttfi_cold_p50_ms",
    "ttfi_warm_p50_ms",
    "ttfi_kept_p50_ms",
    "ttfi_sdk_p50_ms",
    "warm_first_beat_p50_ms",
    "warm_first_beat_p99_ms",
    "burst20_max_ms",
    "k8s_warm_delivered_p50_ms",
    "supervisor_warm_rss_mib",
];
/// Figures of the Docker cases.
const DOCKER_KEYS: [&str; 6] = [
    "ttfi_cold_p50_ms",
    "ttfi_warm_p50_ms",
    "ttfi_kept_p50_ms",
    "warm_first_beat_p50_ms",
    "burst20_max_ms",
    "supervisor_warm_rss_mib",
];

/// The line's values by key, in order; a panic unless it is exactly `KEYS`.
fn parse(line: &str) -> Vec<(String, Option<f64>)> {
    let pairs: Vec<(String, Option<f64>)> = line
        .split(' ')
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {pair:?} in {line}"));
            let value = match value {
                "n/a" => None,
                v => Some(
                    v.parse::<f64>()
                        .unwrap_or_else(|_| panic!("{key}={v} is neither a number nor n/a")),
                ),
            };
            (key.to_string(), value)
        })
        .collect();
    let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, KEYS, "the last line's keys: {line}");
    pairs
}

#[test]
fn the_quick_run_reports_every_figure_on_its_last_line() {
    let bench = Path::new(env!("CARGO_BIN_EXE_mango-bench"));
    for beside in ["mango-runner", "mango-worker"] {
        assert!(
            bench.with_file_name(beside).is_file(),
            "{beside} is not built next to {}: cargo build -p mango-runner -p mango-controller",
            bench.display()
        );
    }
    let database = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL: a PostgreSQL server to create the bench's database on");
    let image = std::env::var("MANGO_TEST_SANDBOX_IMAGE").ok();
    assert!(
        image.is_some() || std::env::var_os("CI").is_none(),
        "CI is set and MANGO_TEST_SANDBOX_IMAGE is not: the Docker cases cannot run"
    );
    let mut command = Command::new(bench);
    command
        .arg("ttfi")
        .arg("--quick")
        .env("MANGO_DATABASE_URL", &database)
        // Without the test's image, one that does not exist: the Docker cases report n/a.
        .env(
            "MANGO_BENCH_SANDBOX_IMAGE",
            image
                .as_deref()
                .unwrap_or("mango-sandbox:absent-for-the-ttfi-smoke-test"),
        );
    let out = command.output().expect("running mango-bench ttfi --quick");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mango-bench ttfi --quick failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let figures = parse(last);
    let value = |key: &str| figures.iter().find(|(k, _)| k == key).and_then(|(_, v)| *v);
    for key in DOCKER_KEYS {
        match &image {
            Some(_) => assert!(
                value(key).is_some_and(|v| v > 0.0),
                "{key} with Docker: {last}\n{stdout}"
            ),
            None => assert_eq!(value(key), None, "{key} without the sandbox image: {last}"),
        }
    }
    if image.is_some() {
        assert!(
            stdout.contains("measured turns were served by the Session's kept sandbox"),
            "the kept case says how many follow-ups found their sandbox kept: {stdout}"
        );
    }
    // The strict fake needs no engine: the Kubernetes figure is always there.
    assert!(
        value("k8s_warm_delivered_p50_ms").is_some_and(|v| v > 0.0),
        "k8s_warm_delivered_p50_ms: {last}\n{stdout}"
    );
    // Kubernetes kept runs the real runner in the fake's Pods: its
    // follow-ups are served by the Session's kept Pod.
    assert!(
        stdout.contains("measured turns were served by the Session's kept Pod"),
        "the Kubernetes kept case says how many follow-ups found their Pod kept: {stdout}"
    );
    // Where a case cannot run its reason is printed above the line.
    if value("ttfi_sdk_p50_ms").is_none() {
        assert!(
            stdout.contains("sdk case n/a"),
            "the SDK case's reason: {stdout}"
        );
    }
    // The ratios against Docker cold are printed with the figures.
    if image.is_some() {
        assert!(stdout.contains("× Docker cold's"), "{stdout}");
    }
}

#[test]
fn a_line_of_other_keys_is_refused() {
    let ok = KEYS.map(|k| format!("{k}=n/a")).join(" ");
    assert_eq!(parse(&ok).len(), 9);
    let missing = ok.replace("ttfi_kept_p50_ms=n/a ", "");
    assert!(std::panic::catch_unwind(|| parse(&missing)).is_err());
    let garbage = ok.replace("burst20_max_ms=n/a", "burst20_max_ms=fast");
    assert!(std::panic::catch_unwind(|| parse(&garbage)).is_err());
}
