//! Releases: one version for the whole project, and what the release
//! workflow publishes.
//!
//! Every place that names the version (the workspace, `Cargo.lock`, the
//! chart, the manifests, the README's install commands) must name the
//! workspace's; `scripts/release.sh VERSION` must set them all and change
//! nothing else, and its `--check` must fail when one disagrees. Both are
//! tried on copies of the tree, so that the real one is never touched. The
//! workflows' `run:` steps go through shellcheck (here, not in actionlint,
//! which `make release-check` runs with its shellcheck pass off), and the workflows and Dockerfiles are read for
//! what the release promises: static binaries for two architectures,
//! signed multi-platform images with attestations, the chart on GHCR.
//!
//! `shellcheck` is `$SHELLCHECK`, else the one on `PATH` (Debian's package).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_yaml_ng::Value;
use workerpool_tests::{dockerfile_instructions, on_path, root};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const CHART: &str = "charts/workerpool-operator";

fn read(dir: &Path, relative: &str) -> String {
    std::fs::read_to_string(dir.join(relative))
        .unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

fn write(dir: &Path, relative: &str, text: &str) {
    std::fs::write(dir.join(relative), text)
        .unwrap_or_else(|e| panic!("cannot write {relative}: {e}"));
}

/// A place that names a version: file, line (1-based) and the version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    file: String,
    line: usize,
    version: String,
}

/// The free-text places: what precedes the version, and what must follow.
/// The same list as `text_places` in scripts/release.sh.
const TEXT_PLACES: [(&str, &str); 7] = [
    ("ghcr.io/workerpool-dev/workerpool-operator:", ""),
    ("ghcr.io/workerpool-dev/workerpool-worker:", ""),
    ("helm.sh/chart: workerpool-operator-", ""),
    ("app.kubernetes.io/version: \"", "\""),
    (
        "oci://ghcr.io/workerpool-dev/charts/workerpool-operator --version ",
        "",
    ),
    ("workerpool-dev/workerpool/releases/download/v", "/"),
    ("workerpool-client==", ""),
];

/// The Python client's version file.
const PY_VERSION: &str = "sdk/python/src/workerpool_client/_version.py";
/// The Node.js client's manifest and lock file.
const NODE_FILES: [&str; 2] = ["sdk/node/package.json", "sdk/node/package-lock.json"];

/// The SemVer version at the start of `text` (1.2.3 or 1.2.3-rc.1), if any.
fn version_at(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut end = 0;
    for part in 0..3 {
        let digits = bytes[end..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        end += digits;
        if part < 2 {
            if bytes.get(end) != Some(&b'.') {
                return None;
            }
            end += 1;
        }
    }
    if bytes.get(end) == Some(&b'-') {
        let pre = bytes[end + 1..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'.' || **b == b'-')
            .count();
        if pre > 0 {
            end += 1 + pre;
        }
    }
    Some(&text[..end])
}

/// Every file of the tree outside build output, relative, sorted.
fn tree_files(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = format!("{prefix}{name}");
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                let skipped = name == ".git"
                    || name == "node_modules"
                    || (prefix.is_empty() && (name == "target" || name.starts_with("target-")));
                if !skipped {
                    walk(&entry.path(), &format!("{relative}/"), out);
                }
            } else if kind.is_file() {
                out.push(relative);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out.sort();
    out
}

/// The value of `key = "..."` on a TOML line, if the line is that.
fn toml_string<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(key)?.trim_start().strip_prefix('=')?;
    rest.trim().strip_prefix('"')?.strip_suffix('"')
}

/// The workspace's member directories and their package names.
fn members(dir: &Path) -> Vec<(String, String)> {
    let manifest = read(dir, "Cargo.toml");
    let list = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = ["))
        .and_then(|l| l.strip_suffix(']'))
        .expect("Cargo.toml lists its members on one line");
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .map(|member| {
            let name = read(dir, &format!("{member}/Cargo.toml"))
                .lines()
                .find_map(|l| toml_string(l, "name"))
                .expect("a package name")
                .to_string();
            (member, name)
        })
        .collect()
}

/// Every place in the tree at `dir` that names a version.
fn places(dir: &Path) -> Vec<Place> {
    let mut out = Vec::new();
    let place = |file: &str, line: usize, version: &str| Place {
        file: file.to_string(),
        line,
        version: version.to_string(),
    };

    // The workspace's version, and any member that does not inherit it.
    let mut section = "";
    for (i, line) in read(dir, "Cargo.toml").lines().enumerate() {
        if line.starts_with('[') {
            section = line;
        } else if section == "[workspace.package]"
            && let Some(v) = toml_string(line, "version")
        {
            out.push(place("Cargo.toml", i + 1, v));
        }
    }
    let members = members(dir);
    for (member, _) in &members {
        let file = format!("{member}/Cargo.toml");
        for (i, line) in read(dir, &file).lines().enumerate() {
            if let Some(v) = toml_string(line, "version") {
                out.push(place(&file, i + 1, v));
            }
        }
    }
    // Cargo.lock: the version line after each member's name.
    let lock = read(dir, "Cargo.lock");
    let mut pending = false;
    for (i, line) in lock.lines().enumerate() {
        if let Some(name) = toml_string(line, "name") {
            pending = members.iter().any(|(_, n)| n == name);
        } else if let Some(v) = toml_string(line, "version").filter(|_| pending) {
            out.push(place("Cargo.lock", i + 1, v));
            pending = false;
        }
    }
    // The chart: its version, appVersion, and the image tag when set.
    let chart_file = format!("{CHART}/Chart.yaml");
    for (i, line) in read(dir, &chart_file).lines().enumerate() {
        for key in ["version:", "appVersion:"] {
            if let Some(v) = line.strip_prefix(key) {
                out.push(place(&chart_file, i + 1, v.trim().trim_matches('"')));
            }
        }
    }
    let values_file = format!("{CHART}/values.yaml");
    let values = read(dir, &values_file);
    let mut block = "";
    for (i, line) in values.lines().enumerate() {
        if !line.starts_with([' ', '#']) && !line.is_empty() {
            block = line;
        } else if block == "image:"
            && let Some(v) = line.strip_prefix("  tag:")
        {
            let v = v.split('#').next().unwrap_or_default();
            let v = v.trim().trim_matches('"');
            if !v.is_empty() {
                out.push(place(&values_file, i + 1, v));
            }
        }
    }
    // The client libraries: the Python package's __version__; the Node
    // package's version, and its lock file's root package's.
    for (i, line) in read(dir, PY_VERSION).lines().enumerate() {
        if let Some(v) = toml_string(line, "__version__") {
            out.push(place(PY_VERSION, i + 1, v));
        }
    }
    for file in NODE_FILES {
        let json = |line: &str, indent: usize| {
            line.strip_prefix(&" ".repeat(indent))
                .and_then(|l| l.strip_prefix("\"version\": \""))
                .and_then(|l| l.trim_end_matches(',').strip_suffix('"'))
                .map(str::to_string)
        };
        let mut root_package = false;
        for (i, line) in read(dir, file).lines().enumerate() {
            if let Some(v) = json(line, 2) {
                out.push(place(file, i + 1, &v));
            } else if line == "    \"\": {" {
                root_package = true;
            } else if root_package && let Some(v) = json(line, 6) {
                out.push(place(file, i + 1, &v));
                root_package = false;
            } else if line.starts_with("    }") {
                root_package = false;
            }
        }
    }
    // Free text, anywhere but the changelog (its history names old versions).
    for file in tree_files(dir) {
        if file == "CHANGELOG.md" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(dir.join(&file)) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            for (prefix, suffix) in TEXT_PLACES {
                for (at, _) in line.match_indices(prefix) {
                    let rest = &line[at + prefix.len()..];
                    if let Some(v) =
                        version_at(rest).filter(|v| rest[v.len()..].starts_with(suffix))
                    {
                        out.push(place(&file, i + 1, v));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// The places whose version is not `version`, one per line.
fn disagreements(places: &[Place], version: &str) -> String {
    places
        .iter()
        .filter(|p| p.version != version)
        .map(|p| format!("{}:{}: {}\n", p.file, p.line, p.version))
        .collect()
}

/// A copy of the tree (build output left out), to run the script on.
fn copy_tree() -> tempfile::TempDir {
    let from = root();
    let to = tempfile::tempdir().expect("a temporary directory");
    for file in tree_files(&from) {
        let target = to.path().join(&file);
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("mkdir");
        std::fs::copy(from.join(&file), &target).unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
    to
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    tree_files(dir)
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(&f)).expect("readable");
            (f, bytes)
        })
        .collect()
}

/// `scripts/release.sh ARGS` in `dir`.
fn release_sh(dir: &Path, args: &[&str]) -> Output {
    Command::new("bash")
        .arg(dir.join("scripts/release.sh"))
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .expect("bash runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn every_place_that_names_the_version_names_the_workspace_version() {
    let places = places(&root());
    let wrong = disagreements(&places, VERSION);
    assert!(
        wrong.is_empty(),
        "these disagree with the workspace version {VERSION} (scripts/release.sh {VERSION} sets them):\n{wrong}"
    );
    // The check looks where the version really is: a pattern that stopped
    // matching would make it pass on nothing.
    let files: Vec<&str> = places.iter().map(|p| p.file.as_str()).collect();
    for expected in [
        "Cargo.toml",
        "Cargo.lock",
        "charts/workerpool-operator/Chart.yaml",
        "manifests/install.yaml",
        "manifests/examples/exec-pool.yaml",
        "README.md",
        PY_VERSION,
        "sdk/python/README.md",
    ] {
        assert!(files.contains(&expected), "no version found in {expected}");
    }
    let lock = places.iter().filter(|p| p.file == "Cargo.lock").count();
    assert_eq!(
        lock,
        members(&root()).len(),
        "one Cargo.lock entry per crate"
    );
    let chart = places
        .iter()
        .filter(|p| p.file.ends_with("Chart.yaml"))
        .count();
    assert_eq!(chart, 2, "the chart's version and appVersion");
    let node = |file: &str| places.iter().filter(|p| p.file == file).count();
    assert_eq!(
        (node(NODE_FILES[0]), node(NODE_FILES[1])),
        (1, 2),
        "the Node package's version, and its lock file's two"
    );
}

#[test]
fn the_release_script_sets_one_version_everywhere_and_changes_nothing_else() {
    let copy = copy_tree();
    let dir = copy.path();
    let before = snapshot(dir);
    let places_before = places(dir);
    let notes_before = text(&release_sh(dir, &["--notes", "Unreleased"]).stdout);
    assert!(
        !notes_before.trim().is_empty(),
        "CHANGELOG.md has notes under [Unreleased]"
    );

    let new = "9.8.7-rc.1";
    let out = release_sh(dir, &[new]);
    assert!(
        out.status.success(),
        "release.sh {new}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // Every place moved, none was lost or made.
    let places_after = places(dir);
    assert_eq!(disagreements(&places_after, new), "");
    let at = |ps: &[Place]| -> Vec<(String, usize)> {
        ps.iter().map(|p| (p.file.clone(), p.line)).collect()
    };
    assert_eq!(at(&places_after), at(&places_before));
    assert!(release_sh(dir, &["--check"]).status.success());

    // Nothing but the versions changed: each changed file, with the new
    // version put back, is what it was.
    let after = snapshot(dir);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (file, old_bytes) in &before {
        let new_bytes = &after[file];
        if old_bytes == new_bytes || file == "CHANGELOG.md" {
            continue;
        }
        assert!(
            places_before.iter().any(|p| &p.file == file),
            "{file} changed but names no version"
        );
        assert_eq!(
            text(new_bytes).replace(new, VERSION),
            text(old_bytes),
            "{file}: only the version changed"
        );
    }

    // The Unreleased notes became the version's, dated; Unreleased is empty.
    let changelog = read(dir, "CHANGELOG.md");
    let heading = changelog
        .lines()
        .find(|l| l.starts_with(&format!("## [{new}] - ")))
        .expect("a dated section for the version");
    assert_eq!(heading.len(), format!("## [{new}] - 2026-01-01").len());
    let notes = release_sh(dir, &["--notes", new]);
    assert!(notes.status.success());
    assert_eq!(text(&notes.stdout), notes_before);
    assert!(!release_sh(dir, &["--notes", "Unreleased"]).status.success());

    // Cargo.lock is still the lock file of the workspace: cargo accepts it
    // as it is (--locked), without the network (for this machine's
    // platform: other platforms' crates need not be in cargo's cache).
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    let host = text(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let metadata = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .args(["--filter-platform", &host])
        .current_dir(dir)
        .output()
        .expect("cargo metadata runs");
    assert!(
        metadata.status.success(),
        "cargo metadata --locked: {}",
        text(&metadata.stderr)
    );
    assert!(text(&metadata.stdout).contains(&format!("\"version\":\"{new}\"")));

    // Run again with the same version: nothing changes.
    let again = release_sh(dir, &[new]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(snapshot(dir) == after, "a second run changed files");
}

#[test]
fn a_place_that_disagrees_fails_the_test_and_the_script() {
    let copy = copy_tree();
    let dir = copy.path();
    assert!(release_sh(dir, &["--check"]).status.success());
    let other = "7.7.7";
    let edits: Vec<(String, String, String)> = vec![
        (
            format!("{CHART}/Chart.yaml"),
            format!("appVersion: \"{VERSION}\""),
            format!("appVersion: \"{other}\""),
        ),
        (
            format!("{CHART}/values.yaml"),
            "  tag: \"\"".into(),
            format!("  tag: \"{other}\""),
        ),
        (
            "Cargo.lock".into(),
            format!("name = \"workerpool-queue\"\nversion = \"{VERSION}\""),
            format!("name = \"workerpool-queue\"\nversion = \"{other}\""),
        ),
        (
            "operator/Cargo.toml".into(),
            "version.workspace = true".into(),
            format!("version = \"{other}\""),
        ),
        (
            "manifests/examples/exec-pool.yaml".into(),
            format!("workerpool-worker:{VERSION}"),
            format!("workerpool-worker:{other}"),
        ),
        (
            "README.md".into(),
            format!("workerpool-worker:{VERSION}"),
            format!("workerpool-worker:{other}"),
        ),
        (
            "manifests/install.yaml".into(),
            format!("app.kubernetes.io/version: \"{VERSION}\""),
            format!("app.kubernetes.io/version: \"{other}\""),
        ),
    ];
    for (file, from, to) in edits {
        let original = read(dir, &file);
        assert!(original.contains(&from), "{file} has {from}");
        write(dir, &file, &original.replacen(&from, &to, 1));

        let wrong = disagreements(&places(dir), VERSION);
        assert!(
            wrong.starts_with(&format!("{file}:")) && wrong.lines().count() == 1,
            "{file} edited: the test finds {wrong:?}"
        );
        let out = release_sh(dir, &["--check"]);
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success(),
            "{file} edited: release.sh --check passes"
        );
        assert!(
            stderr.contains(&format!("{file}:")) && stderr.contains(other),
            "{file} edited: release.sh --check says {stderr}"
        );

        write(dir, &file, &original);
    }
    assert!(release_sh(dir, &["--check"]).status.success());
}

#[test]
fn a_malformed_version_or_a_release_without_notes_is_refused_and_nothing_changes() {
    let copy = copy_tree();
    let dir = copy.path();
    let before = snapshot(dir);
    for bad in ["v1.2.3", "1.2", "1.2.3+build.5", "1.2.3.4", "--bogus", ""] {
        let out = release_sh(dir, &[bad]);
        assert!(!out.status.success(), "release.sh {bad:?} was accepted");
        assert!(snapshot(dir) == before, "release.sh {bad:?} changed files");
    }
    // No notes under Unreleased, and no section for the version.
    let changelog = read(dir, "CHANGELOG.md");
    let (head, _) = changelog
        .split_once("## [Unreleased]")
        .expect("an Unreleased section");
    write(
        dir,
        "CHANGELOG.md",
        &format!("{head}## [Unreleased]\n\n## [0.0.1] - 2020-01-01\n\n- old\n"),
    );
    let before = snapshot(dir);
    let out = release_sh(dir, &["2.0.0"]);
    assert!(
        !out.status.success(),
        "a release without notes was accepted"
    );
    assert!(text(&out.stderr).contains("CHANGELOG.md"));
    assert!(snapshot(dir) == before, "a refused release changed files");
}

#[test]
fn release_notes_are_the_changelog_section_of_the_version() {
    let copy = copy_tree();
    let dir = copy.path();
    write(
        dir,
        "CHANGELOG.md",
        "# Changelog\n\n## [Unreleased]\n\n## [1.1.0] - 2026-02-03\n\n### Fixed\n\n- a fix\n\n\
         ## [1.0.0] - 2026-01-02\n\n- the first\n",
    );
    let out = release_sh(dir, &["--notes", "1.1.0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "### Fixed\n\n- a fix\n");
    let out = release_sh(dir, &["--notes", "1.0.0"]);
    assert_eq!(text(&out.stdout), "- the first\n");
    for missing in ["1.2.0", "1.0", "Unreleased"] {
        let out = release_sh(dir, &["--notes", missing]);
        assert!(
            !out.status.success(),
            "notes for {missing}: {}",
            text(&out.stdout)
        );
    }
}

fn shellcheck() -> PathBuf {
    if let Some(path) = std::env::var_os("SHELLCHECK") {
        return PathBuf::from(path);
    }
    on_path("shellcheck").expect("no shellcheck: apt-get install -y shellcheck (or set SHELLCHECK)")
}

fn workflow(name: &str) -> Value {
    serde_yaml_ng::from_str(&read(&root(), &format!(".github/workflows/{name}")))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn jobs(workflow: &Value) -> Vec<(String, &Value)> {
    workflow["jobs"]
        .as_mapping()
        .expect("jobs")
        .iter()
        .map(|(k, v)| (k.as_str().expect("a job id").to_string(), v))
        .collect()
}

fn steps(job: &Value) -> &[Value] {
    job["steps"]
        .as_sequence()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Each `run:` of every step of a job, joined.
fn runs(job: &Value) -> String {
    steps(job)
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `uses:` of every step of a job.
fn uses(job: &Value) -> Vec<&str> {
    steps(job)
        .iter()
        .filter_map(|s| s["uses"].as_str())
        .collect()
}

/// `${{ ... }}` replaced by underscores, as actionlint does before it hands
/// a script to shellcheck: the expression is a plain word to the shell.
fn without_expressions(script: &str) -> String {
    let mut out = String::new();
    let mut rest = script;
    while let Some(start) = rest.find("${{") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find("}}")
            .map_or(rest.len(), |e| start + e + 2);
        out.push_str(&"_".repeat(end - start));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn every_run_step_of_the_workflows_passes_shellcheck() {
    let shellcheck = shellcheck();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut checked = 0;
    let mut findings = String::new();
    for name in ["ci.yml", "release.yml"] {
        let wf = workflow(name);
        for (id, job) in jobs(&wf) {
            for (i, step) in steps(job).iter().enumerate() {
                let Some(script) = step["run"].as_str() else {
                    continue;
                };
                let shell = step["shell"].as_str().unwrap_or("bash");
                assert_eq!(shell, "bash", "{name} {id} step {i}: a bash step");
                // What the runner runs: bash --noprofile --norc -eo pipefail.
                let file = dir.path().join(format!("{name}-{id}-{i}.sh"));
                std::fs::write(
                    &file,
                    format!(
                        "#!/usr/bin/env bash\nset -eo pipefail\n{}",
                        without_expressions(script)
                    ),
                )
                .expect("write the step's script");
                let out = Command::new(&shellcheck)
                    .arg("--shell=bash")
                    .arg(&file)
                    .output()
                    .expect("shellcheck runs");
                if !out.status.success() {
                    findings.push_str(&format!(
                        "{name}, job {id}, step {i}:\n{}\n",
                        text(&out.stdout)
                    ));
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} run steps found");
    assert!(findings.is_empty(), "{findings}");
}

#[test]
fn the_shellcheck_pass_over_run_steps_catches_a_mistake() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("step.sh");
    let script =
        without_expressions("echo ${{ github.sha }}\nfor f in $(ls dist); do echo $f; done\n");
    assert!(script.starts_with("echo ____"), "{script}");
    std::fs::write(&file, format!("#!/usr/bin/env bash\n{script}")).expect("write");
    let out = Command::new(shellcheck())
        .arg(&file)
        .output()
        .expect("shellcheck runs");
    assert!(!out.status.success(), "shellcheck passed {script}");
}

#[test]
fn the_release_workflow_publishes_what_users_install() {
    let wf = workflow("release.yml");
    assert_eq!(wf["on"]["push"]["tags"][0], "v*", "runs on v* tags");
    let jobs: BTreeMap<String, &Value> = jobs(&wf).into_iter().collect();
    let all_runs: String = jobs
        .values()
        .map(|j| runs(j))
        .collect::<Vec<_>>()
        .join("\n");

    // The tag must be the version everywhere; the notes are the changelog's.
    let version = runs(jobs["version"]);
    assert!(version.contains("scripts/release.sh --check"));
    assert!(version.contains("scripts/release.sh --notes"));
    assert!(version.contains("GITHUB_REF_NAME#v"));

    // Static binaries of the three commands, for both architectures,
    // checked static and of this version.
    let binaries = jobs["binaries"];
    let targets: Vec<&str> = binaries["strategy"]["matrix"]["include"]
        .as_sequence()
        .expect("a matrix")
        .iter()
        .filter_map(|m| m["target"].as_str())
        .collect();
    assert_eq!(
        targets,
        ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"]
    );
    let build = runs(binaries);
    assert!(build.contains("cargo build --release --locked --target"));
    for bin in ["workerpool", "workerpool-worker", "workerpool-operator"] {
        assert!(build.contains(bin), "{bin} is built and checked");
    }
    // Each binary is its package's: `workerpool` is workerpool-cli's.
    for package in ["workerpool-cli", "workerpool-worker", "workerpool-operator"] {
        assert!(
            build.contains(&format!("-p {package}")),
            "the package {package} is built"
        );
    }
    assert!(build.contains("ldd") && build.contains("--version"));

    // Both images, both platforms, with SBOM and provenance.
    let images = jobs["images"];
    let matrix = &images["strategy"]["matrix"];
    assert_eq!(
        matrix["image"],
        serde_yaml_ng::from_str::<Value>("[operator, worker]").expect("yaml")
    );
    assert_eq!(
        matrix["arch"],
        serde_yaml_ng::from_str::<Value>("[amd64, arm64]").expect("yaml")
    );
    let push = steps(images)
        .iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("docker/build-push-action@"))
        })
        .expect("a build-push step");
    assert_eq!(push["with"]["sbom"], true);
    assert_eq!(push["with"]["provenance"], "mode=max");
    assert!(
        push["with"]["outputs"]
            .as_str()
            .is_some_and(|o| o.contains("push=true"))
    );
    assert_eq!(wf["env"]["NAMESPACE"], "ghcr.io/workerpool-dev");

    // Tagged with the version (and latest), signed keylessly.
    let publish = runs(jobs["publish-images"]);
    assert!(publish.contains("\"$IMAGE:$VERSION\"") && publish.contains("\"$IMAGE:latest\""));
    assert!(publish.contains("cosign sign --yes"));

    // The chart, with the tag's version, pushed to GHCR and signed.
    let chart = runs(jobs["chart"]);
    assert!(chart.contains("--version \"$VERSION\" --app-version \"$VERSION\""));
    assert!(chart.contains("lint --strict"));
    assert!(chart.contains("\"oci://$NAMESPACE/charts\""));
    assert!(chart.contains("cosign sign --yes"));
    assert!(
        jobs["chart"]["needs"]
            .as_sequence()
            .is_some_and(|n| n.iter().any(|j| j == "publish-images")),
        "the chart is published after the images it names"
    );

    // The GitHub Release: checksums, signed, and the notes.
    let release = runs(jobs["release"]);
    assert!(release.contains("sha256sum") && release.contains("SHA256SUMS"));
    assert!(release.contains("cosign sign-blob --yes --bundle"));
    assert!(
        release.contains("gh release create") && release.contains("--notes-file release-notes.md")
    );

    // The clients: PyPI by trusted publishing, npm with provenance, each
    // from a package whose Lua scripts are checked to be the queue's own.
    let python = &jobs["python-client"];
    assert!(
        runs(python).contains("scripts/sync-sdk-lua.sh")
            && runs(python).contains("git diff --exit-code")
    );
    assert!(
        uses(python)
            .iter()
            .any(|u| u.starts_with("pypa/gh-action-pypi-publish@"))
    );
    let node = &jobs["node-client"];
    assert!(runs(node).contains("sync-sdk-lua.sh") && runs(node).contains("git diff --exit-code"));
    assert!(runs(node).contains("npm publish --provenance"));

    // An OIDC identity is needed to sign keylessly, to publish to PyPI as a
    // trusted publisher and to attach npm provenance; pushing images needs
    // packages: write; nothing gets more than it needs.
    assert!(wf["permissions"].as_mapping().is_some_and(|m| m.is_empty()));
    for (id, job) in &jobs {
        let run = runs(job);
        let needs_identity = run.contains("cosign sign")
            || run.contains("npm publish --provenance")
            || uses(job)
                .iter()
                .any(|u| u.starts_with("pypa/gh-action-pypi-publish@"));
        assert_eq!(
            job["permissions"]["id-token"] == "write",
            needs_identity,
            "{id}: id-token"
        );
        let pushes = uses(job)
            .iter()
            .any(|u| u.starts_with("docker/login-action@"));
        assert_eq!(
            job["permissions"]["packages"] == "write",
            pushes,
            "{id}: packages"
        );
    }
    assert_eq!(jobs["release"]["permissions"]["contents"], "write");
    assert!(
        !all_runs.contains("${{"),
        "expressions reach scripts through env only"
    );
}

#[test]
fn ci_runs_what_ci_run_runs_and_the_suite_on_kind() {
    let wf = workflow("ci.yml");
    assert!(wf["on"]["pull_request"].is_null() && wf["on"].get("pull_request").is_some());
    assert_eq!(wf["on"]["push"]["branches"][0], "main");
    let jobs: BTreeMap<String, &Value> = jobs(&wf).into_iter().collect();
    let all_runs: String = jobs
        .values()
        .map(|j| runs(j))
        .collect::<Vec<_>>()
        .join("\n");
    for command in ["make lint", "make release-check", "make unit", "make soak"] {
        assert!(
            all_runs.lines().any(|l| l.trim() == command),
            "CI runs {command}"
        );
    }
    assert!(
        all_runs.contains("redis-server"),
        "the tests get a real redis-server"
    );
    for (id, job) in &jobs {
        if runs(job).contains("cargo ") || runs(job).contains("make ") {
            assert!(
                uses(job)
                    .iter()
                    .any(|u| u.starts_with("Swatinem/rust-cache@")),
                "{id}: caches cargo's registry and target"
            );
        }
    }
    let e2e = jobs["e2e"];
    assert!(uses(e2e).iter().any(|u| u.starts_with("helm/kind-action@")));
    let suite = steps(e2e)
        .iter()
        .find(|s| s["run"].as_str().is_some_and(|r| r.contains("--test e2e")))
        .expect("a step that runs the end-to-end suite");
    assert!(suite["env"]["WORKERPOOL_E2E_KUBECONFIG"].is_string());
    assert!(
        suite["env"]["IMAGE_LOAD"]
            .as_str()
            .is_some_and(|l| l.starts_with("kind load"))
    );
    assert!(
        !all_runs.contains("${{"),
        "expressions reach scripts through env only"
    );
}

#[test]
fn the_images_ship_the_static_binaries_and_the_worker_runs_under_tini() {
    for image in ["operator", "worker"] {
        let file = format!("images/{image}/Dockerfile");
        let all = dockerfile_instructions(&read(&root(), &file));
        assert!(
            all.iter().any(|i| i.starts_with("RUN ")
                && i.contains("target=\"$(uname -m)-unknown-linux-musl\"")
                && i.contains("cargo build --release --locked --target \"$target\"")),
            "{file}: a static (musl) build for the platform it runs on"
        );
        assert!(
            !all.iter().any(|i| i.starts_with("HEALTHCHECK")),
            "{file}: no HEALTHCHECK (Kubernetes probes instead)"
        );
    }
    let operator = dockerfile_instructions(&read(&root(), "images/operator/Dockerfile"));
    let last_from = operator
        .iter()
        .rfind(|i| i.starts_with("FROM "))
        .expect("FROM");
    assert!(
        last_from.starts_with("FROM gcr.io/distroless/static-"),
        "the operator image has no shell and no libc: {last_from}"
    );
    let worker = dockerfile_instructions(&read(&root(), "images/worker/Dockerfile"));
    let from = worker
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .expect("FROM");
    assert!(
        worker[from..].iter().any(|i| i.starts_with("RUN ")
            && i.contains("apt-get install")
            && i.split_whitespace().any(|w| w == "tini")),
        "the worker's final stage installs tini, its PID 1"
    );
    // The image holds the `workerpool` command too, which is workerpool-cli's.
    assert!(
        worker.iter().any(|i| i.starts_with("RUN ")
            && i.contains("-p workerpool-worker -p workerpool-cli")
            && i.contains("release/workerpool\" /out/workerpool")),
        "the worker image builds both workerpool-worker and workerpool"
    );
}
