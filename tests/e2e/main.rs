//! End-to-end tests on a real Kubernetes cluster: the chart installed with
//! helm, the operator and worker images built from this checkout, real
//! worker Pods started, probed and stopped by a kubelet.
//!
//! The cluster comes from `WORKERPOOL_E2E_K8S` (a directory whose `up.sh`
//! starts one and prints its kubeconfig's path, and whose `down.sh` stops
//! it: started once per run, stopped at the end whatever happens) or
//! `WORKERPOOL_E2E_KUBECONFIG` (a running cluster). With neither, the suite
//! prints one line saying so and passes. The scenarios run one at a time,
//! each in its own namespace, deleted at its end.
//!
//! `cargo test -p workerpool-tests --test e2e [-- NAME...]` runs the
//! scenarios whose names contain one of the NAMEs (all by default).

mod cluster;
mod disruption;
mod otel;
mod python;
mod replay;
mod saturation;
mod scenarios;
mod security;
mod tls;
mod truth;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use cluster::{Cluster, Source, root};

/// What every scenario gets: the cluster, with the operator installed by
/// the first one.
#[derive(Debug)]
pub struct E2e {
    pub cluster: Cluster,
}

type Scenario = (&'static str, fn(&E2e));

fn main() -> ExitCode {
    let (filters, skips, list) = arguments();
    let mut selected: Vec<&Scenario> = scenarios::ALL
        .iter()
        .chain(security::ALL)
        .chain(tls::ALL)
        .chain(truth::ALL)
        .chain(python::ALL)
        .chain(disruption::ALL)
        .chain(otel::ALL)
        .chain(saturation::ALL)
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        // The manual ones (minutes long, not part of the suite) only when named.
        .chain(
            replay::MANUAL
                .iter()
                .filter(|(name, _)| filters.iter().any(|f| name.contains(f.as_str()))),
        )
        .filter(|(name, _)| !skips.iter().any(|s| name.contains(s.as_str())))
        .collect();
    // Every scenario runs on the operator the first one installs.
    if !selected.is_empty() && selected[0].0 != scenarios::INSTALL {
        selected.insert(0, &scenarios::ALL[0]);
    }
    if list {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let Some(source) = Source::from_env() else {
        eprintln!(
            "e2e: SKIPPED ({} scenarios): no cluster. Set WORKERPOOL_E2E_K8S to a directory with up.sh and down.sh \
             (CI uses ../shared/k8s) or WORKERPOOL_E2E_KUBECONFIG to a running cluster; see docs/testing.md, \"End-to-end tests on a real cluster\"",
            selected.len()
        );
        return ExitCode::SUCCESS;
    };
    if selected.is_empty() {
        return ExitCode::SUCCESS;
    }

    let started = Instant::now();
    let bins = build_binaries();
    let e2e = E2e {
        cluster: Cluster::start(&source),
    };
    eprintln!("e2e: cluster ready after {:.0?}", started.elapsed());
    build_images(&bins);

    let mut failed = Vec::new();
    for (name, scenario) in &selected {
        // The operator is installed by the first scenario; without it the
        // others cannot run.
        if failed.contains(&scenarios::INSTALL) {
            eprintln!("e2e {name} ... skipped: the operator is not installed");
            failed.push(*name);
            continue;
        }
        let t = Instant::now();
        eprintln!("e2e {name} ...");
        match catch_unwind(AssertUnwindSafe(|| scenario(&e2e))) {
            Ok(()) => eprintln!("e2e {name} ... ok ({:.1?})", t.elapsed()),
            Err(_) => {
                eprintln!("e2e {name} ... FAILED ({:.1?})", t.elapsed());
                failed.push(*name);
            }
        }
    }
    scenarios::uninstall(&e2e);
    drop(e2e);
    eprintln!(
        "e2e: {} passed, {} failed in {:.0?}",
        selected.len() - failed.len(),
        failed.len(),
        started.elapsed()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        for name in failed {
            eprintln!("e2e: FAILED {name}");
        }
        ExitCode::FAILURE
    }
}

/// Positional arguments are name filters; `--skip NAME` leaves out; `--list`
/// lists. The test harness's other flags (`--nocapture`, `--test-threads N`
/// ...) do not apply: scenarios run one at a time and print as they go.
fn arguments() -> (Vec<String>, Vec<String>, bool) {
    let (mut filters, mut skips, mut list) = (Vec::new(), Vec::new(), false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--list" => list = true,
            "--skip" => skips.extend(args.next()),
            "--test-threads" | "--color" | "--format" | "-Z" => {
                args.next();
            }
            flag if flag.starts_with('-') => {}
            name => filters.push(name.to_string()),
        }
    }
    (filters, skips, list)
}

/// Builds the operator and worker binaries (debug, like the tests) into the
/// target directory this test was built in; returns that directory.
fn build_binaries() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable in <target>/<profile>/deps")
        .to_path_buf();
    let target = dir.parent().expect("target dir");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    // Without the variables cargo sets for this test's own run: build
    // scripts that track them (ring's tracks CARGO_MANIFEST_DIR) would
    // rebuild on every switch between this build and the test build.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_the_test = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ];
        if set_for_the_test.iter().any(|p| name.starts_with(p)) {
            build.env_remove(name.as_ref());
        }
    }
    // The whole workspace with its examples, as `cargo test --workspace`
    // builds it (examples, like tests, bring in the dev-dependencies): one set
    // of features for every crate, so the dependencies built for the tests
    // serve. A build of a few packages unifies their features apart and
    // compiles many dependencies again.
    let status = build
        .args(["build", "--workspace", "--bins", "--examples"])
        .arg("--target-dir")
        .arg(target)
        .current_dir(root())
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build of the binaries failed");
    dir
}

/// `scripts/images.sh` with those binaries: the images the scenarios run.
fn build_images(bins: &Path) {
    let t = Instant::now();
    let status = Command::new(root().join("scripts/images.sh"))
        .env("BIN_DIR", bins)
        .env("TAG", scenarios::IMAGE_TAG)
        .status()
        .expect("run scripts/images.sh");
    assert!(status.success(), "scripts/images.sh failed");
    eprintln!("e2e: images built and loaded in {:.0?}", t.elapsed());
}
