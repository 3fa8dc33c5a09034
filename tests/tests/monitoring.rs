//! The chart's alerts and Grafana dashboard: the PrometheusRule as
//! `helm template` renders it, checked by the real `promtool check rules`
//! and unit-tested by `promtool test rules` with
//! charts/workerpool-operator/tests/alerts_test.yaml; and every metric the
//! alerts and the dashboard read is one the operator or the worker exports.
//!
//! `promtool` is `$PROMTOOL`, else the one on `PATH` (Debian's `prometheus`
//! package); without it these tests fail when `CI` is set and are skipped
//! with a note otherwise. `helm` is found as in tests/tests/chart.rs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use workerpool_operator::metrics::{Metrics as OperatorMetrics, Replicas};
use workerpool_queue::snapshot::{QueueFigures, Snapshot};
use workerpool_settings::metrics::{self, Section};
use workerpool_tests::{helm, on_path, read, root};
use workerpool_worker::metrics::Metrics as WorkerMetrics;

const CHART: &str = "charts/workerpool-operator";
const ALERTS_TEST: &str = "charts/workerpool-operator/tests/alerts_test.yaml";
const DASHBOARD: &str = "charts/workerpool-operator/dashboards/workerpool.json";
const NON_DEFAULT_VALUES: &str = "charts/workerpool-operator/ci/non-default-values.yaml";
/// The runbook base alerts_test.yaml expects (the default one carries the
/// chart's version).
const RUNBOOKS: &str = "prometheusRule.runbookBaseUrl=https://runbooks.example.com/workerpool";
/// Metrics the dashboard reads that other exporters provide.
const EXTERNAL: [&str; 1] = [
    // kube-state-metrics: container restarts of the worker pods.
    "kube_pod_container_status_restarts_total",
];

/// promtool, or None (after saying so) when it is missing outside CI.
fn promtool() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PROMTOOL") {
        return Some(path.into());
    }
    if let Some(found) = on_path("promtool") {
        return Some(found);
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    assert!(
        !ci,
        "no promtool binary: install Debian's prometheus package (apt-get install prometheus), or set PROMTOOL"
    );
    eprintln!(
        "skipped: no promtool (apt-get install prometheus, or set PROMTOOL); the alerts were not checked"
    );
    None
}

/// Runs a command; its stdout, or a panic with everything it printed.
fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The `spec` of the PrometheusRule the chart renders with `extra`.
fn rendered_rules(extra: &[&str]) -> Value {
    let mut args = vec![
        "template",
        "workerpool-operator",
        CHART,
        "--show-only",
        "templates/prometheusrule.yaml",
        "--set",
        "prometheusRule.enabled=true",
    ];
    args.extend_from_slice(extra);
    let yaml = run(Command::new(helm()).args(&args).current_dir(root()));
    let rule: Value = serde_yaml_ng::from_str(&yaml).expect("the PrometheusRule is YAML");
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

/// Writes the rules as a Prometheus rule file in `dir`: rules.yaml.
fn write_rules(dir: &Path, spec: &Value) -> PathBuf {
    let path = dir.join("rules.yaml");
    std::fs::write(
        &path,
        serde_yaml_ng::to_string(spec).expect("rules as YAML"),
    )
    .expect("write rules.yaml");
    path
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let Some(promtool) = promtool() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    write_rules(dir.path(), &rendered_rules(&["--set", RUNBOOKS]));
    std::fs::write(dir.path().join("alerts_test.yaml"), read(ALERTS_TEST))
        .expect("copy alerts_test.yaml");
    let checked = run(Command::new(&promtool)
        .args(["check", "rules", "rules.yaml"])
        .current_dir(dir.path()));
    assert!(checked.contains("SUCCESS: 11 rules found"), "{checked}");
    let tested = run(Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yaml"])
        .current_dir(dir.path()));
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn promtool_accepts_the_rules_rendered_with_non_default_values() {
    let Some(promtool) = promtool() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rules = write_rules(dir.path(), &rendered_rules(&["-f", NON_DEFAULT_VALUES]));
    run(Command::new(&promtool).arg("check").arg("rules").arg(rules));
}

fn alert_names(spec: &Value) -> Vec<String> {
    spec["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn every_alert_has_a_unit_test_where_it_fires_and_one_where_it_does_not() {
    let tests: Value = serde_yaml_ng::from_str(&read(ALERTS_TEST)).expect("alerts_test.yaml");
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    for alert in alert_names(&rendered_rules(&[])) {
        let of_alert: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == alert).collect();
        let fires = |c: &&&Value| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
        assert!(
            of_alert.iter().any(fires),
            "no unit test where {alert} fires"
        );
        assert!(
            of_alert.iter().any(|c| !fires(c)),
            "no unit test where {alert} stays quiet"
        );
    }
}

/// The metric names a PromQL expression reads: identifiers that are not
/// functions, keywords, label names (in `{...}` and `by (...)`), strings,
/// numbers or durations.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 23] = [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "inf",
    ];
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Index just past the bracket closing the one at `open`, strings
    // inside skipped.
    let closing = |open: usize, close: char| -> usize {
        let mut j = open + 1;
        while j < chars.len() && chars[j] != close {
            if chars[j] == '"' || chars[j] == '\'' {
                let quote = chars[j];
                j += 1;
                while j < chars.len() && chars[j] != quote {
                    j += if chars[j] == '\\' { 2 } else { 1 };
                }
            }
            j += 1;
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = closing(i, c);
        } else if c == '{' {
            i = closing(i, '}');
        } else if c == '[' {
            i = closing(i, ']');
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                let exponent =
                    matches!(chars[i], 'e' | 'E') && matches!(chars.get(i + 1), Some('+' | '-'));
                i += if exponent { 2 } else { 1 };
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if LABEL_LISTS.contains(&word.as_str()) {
                if call {
                    i = closing(next, ')');
                }
            } else if !call && !KEYWORDS.contains(&word.as_str()) && word != "nan" {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn the_metric_name_scanner_finds_metrics_and_only_metrics() {
    let expr = r#"histogram_quantile(0.95, sum by (le, queue) (rate(a_seconds_bucket{queue=~"x|y", le!="+Inf"}[$__rate_interval])))
        > 1e+06 and on (pool) group_left (queue) max without (pod) (b) / ignoring(x) c offset 5m unless bool d"#;
    assert_eq!(
        metric_names(expr),
        ["a_seconds_bucket", "b", "c", "d"].map(String::from).into()
    );
}

/// The template variable queries' expressions: `label_values(EXPR, label)`.
fn variable_expressions(dashboard: &Value) -> Vec<String> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let query = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .expect("a query");
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| panic!("not label_values(...): {query}"));
            let (expr, _label) = inner.rsplit_once(',').unwrap_or(("", inner));
            expr.to_owned()
        })
        .collect()
}

/// Every `expr` anywhere in a JSON document.
fn expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                match (key.as_str(), item) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => expressions(item, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| expressions(i, out)),
        _ => {}
    }
}

/// The names the operator and the worker export, with each histogram's
/// `_bucket`, `_sum` and `_count` series.
fn exported() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for family in gathered() {
        let name = family.name().to_owned();
        if family.get_field_type() == prometheus::proto::MetricType::HISTOGRAM {
            names.extend(["_bucket", "_sum", "_count"].map(|s| format!("{name}{s}")));
        }
        names.insert(name);
    }
    names
}

/// The reference's sections: the worker's metrics, then the operator's.
const SECTIONS: [Section; 2] = [
    workerpool_worker::metrics::SECTION,
    workerpool_operator::metrics::SECTION,
];
const METRICS_DOC: &str = "docs/metrics.md";

#[test]
fn docs_metrics_md_is_the_reference_generated_from_both_metric_tables() {
    let generated = metrics::reference(&SECTIONS);
    if std::env::var_os("UPDATE_MANIFESTS").is_some() {
        let path = root().join(METRICS_DOC);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(generated.as_str()) {
            std::fs::write(&path, &generated)
                .unwrap_or_else(|e| panic!("cannot write {METRICS_DOC}: {e}"));
        }
    }
    assert!(
        std::fs::read_to_string(root().join(METRICS_DOC)).unwrap_or_default() == generated,
        "{METRICS_DOC} is stale (a metric was added or changed in the code): run `{}`",
        metrics::REGENERATE
    );
}

#[test]
fn the_dashboard_and_the_alerts_read_only_metrics_the_code_exports() {
    let exported = exported();
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    let panels = exprs.len();
    exprs.extend(variable_expressions(&dashboard));
    let rules = rendered_rules(&[]);
    expressions(&rules, &mut exprs);
    assert!(panels > 20 && exprs.len() > panels + 6, "{exprs:?}");
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        for name in names {
            assert!(
                exported.contains(&name) || EXTERNAL.contains(&name.as_str()),
                "{name} (in {expr}) is not a metric the operator or the worker exports; exported: {exported:?}"
            );
            used.insert(name);
        }
    }
    // Every pool metric of the operator is on the dashboard.
    for name in exported
        .iter()
        .filter(|n| n.starts_with("workerpool_pool_"))
    {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}

#[test]
fn the_dashboard_has_its_variables_and_every_panel_uses_the_chosen_data_source() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let names: Vec<&str> = variables
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(names, ["datasource", "namespace", "pool", "queue"]);
    assert_eq!(variables[0]["type"], "datasource");
    assert_eq!(variables[0]["query"], "prometheus");
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert!(ids.insert(panel["id"].as_u64().expect("an id")), "{panel}");
        let grid = &panel["gridPos"];
        let (x, w) = (
            grid["x"].as_u64().expect("x"),
            grid["w"].as_u64().expect("w"),
        );
        assert!(x + w <= 24, "{}", panel["title"]);
        if panel["type"] == "row" {
            continue;
        }
        assert!(panel["description"].is_string(), "{}", panel["title"]);
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"]["uid"], "${datasource}");
            let expr = target["expr"].as_str().expect("expr");
            // The filters apply wherever their labels exist.
            if expr.contains("workerpool_pool_") {
                assert!(expr.contains(r#"pool=~"$pool""#), "{expr}");
            }
        }
    }
}

/// The operator's and the worker's metrics, each touched once so that
/// labelled families appear.
fn gathered() -> Vec<prometheus::proto::MetricFamily> {
    let operator = OperatorMetrics::new();
    let snapshot = Snapshot {
        server_time_ms: 2_000,
        queues: vec![QueueFigures {
            name: "q".into(),
            waiting: 1,
            oldest_enqueued_at_ms: Some(1_000),
            ..QueueFigures::default()
        }],
    };
    operator.observe_pool(
        "ns",
        "pool",
        Some(&snapshot),
        Replicas {
            desired: 1,
            ready: 1,
            max: Some(2),
        },
    );
    operator.observe_memory(
        "ns",
        "pool",
        &workerpool_queue::memory::Memory::parse("maxmemory_policy:noeviction\nevicted_keys:0\n"),
    );
    operator.observe_scale("ns", "pool", 0, 1);
    operator.observe_saturation(
        "ns",
        "pool",
        Some(&workerpool_operator::scaling::Saturation {
            knee: 12,
            rate: 180.0,
            measured_at: 16,
            marginal: 0.004,
            confirmed_at: 0.0,
            climbing: false,
        }),
    );
    operator
        .unreadable
        .with_label_values(&["ns", "unreadable-pool"])
        .set(1);
    operator.observe_reconcile(std::time::Duration::from_millis(1), None);
    operator
        .reconcile_errors
        .with_label_values(&["patch_status"])
        .inc();

    let worker = WorkerMetrics::new();
    worker.jobs.with_label_values(&["q", "done"]).inc();
    worker
        .dead_letters
        .with_label_values(&["q", "exhausted"])
        .inc();
    worker.job_duration.with_label_values(&["q"]).observe(0.1);
    worker.redis_errors.with_label_values(&["fetch"]).inc();
    worker.stale_acks.with_label_values(&["q"]).inc();
    worker.recovered.with_label_values(&["q"]).inc();
    worker
        .redis_policy
        .with_label_values(&["q", "noeviction"])
        .set(1);
    worker.redis_evicted_keys.with_label_values(&["q"]).set(0);
    worker
        .trace_spans_dropped
        .with_label_values(&["export_failed"])
        .inc();

    let mut all = operator.registry.gather();
    all.extend(worker.registry.gather());
    all
}
