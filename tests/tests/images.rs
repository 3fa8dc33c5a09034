//! The Dockerfiles under `images/`, read for what matters when they are
//! built: a multi-stage build of the right package from the lock file, and a
//! final stage that runs the right binary as a numeric non-root user.

use workerpool_tests::{dockerfile_instructions, read};

/// The instructions of the last stage (the image that ships).
fn final_stage(all: &[String]) -> &[String] {
    let last_from = all
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .expect("a FROM");
    &all[last_from..]
}

fn check(dockerfile: &str, package: &str, entrypoint: &[&str]) {
    let all = dockerfile_instructions(&read(dockerfile));
    let froms = all.iter().filter(|i| i.starts_with("FROM ")).count();
    assert!(froms >= 2, "{dockerfile}: multi-stage");
    assert!(
        all.iter().any(|i| i.starts_with("RUN ")
            && i.contains("cargo build --release --locked")
            && i.contains(&format!("-p {package}"))),
        "{dockerfile}: builds {package} in release mode from Cargo.lock"
    );

    let shipped = final_stage(&all);
    assert!(
        shipped.iter().any(|i| i.starts_with("COPY --from=build")),
        "{dockerfile}: the final stage copies the binary from the build stage"
    );
    assert!(
        !shipped.iter().any(|i| i.contains("cargo ")),
        "{dockerfile}: no toolchain in the final image"
    );
    let user = shipped
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix("USER "))
        .unwrap_or_else(|| panic!("{dockerfile}: the final stage sets USER"));
    let uid = user.split(':').next().unwrap_or_default();
    let uid: u32 = uid
        .parse()
        .unwrap_or_else(|_| panic!("{dockerfile}: USER {user} must be numeric for runAsNonRoot"));
    assert_ne!(uid, 0, "{dockerfile}: non-root");
    let shipped_entrypoint = shipped
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix("ENTRYPOINT "))
        .unwrap_or_else(|| panic!("{dockerfile}: the final stage sets ENTRYPOINT"));
    assert!(
        shipped_entrypoint.starts_with('[') && shipped_entrypoint.ends_with(']'),
        "{dockerfile}: exec-form entrypoint, not {shipped_entrypoint}"
    );
    assert_eq!(
        words(shipped_entrypoint),
        entrypoint,
        "{dockerfile}: entrypoint"
    );
}

#[test]
fn the_operator_image_is_a_multi_stage_build_running_the_operator_as_non_root() {
    check(
        "images/operator/Dockerfile",
        "workerpool-operator",
        &["/usr/local/bin/workerpool-operator"],
    );
}

#[test]
fn the_worker_image_runs_workerpool_worker_as_non_root_so_images_can_build_on_it() {
    // tini as PID 1 reaps the orphaned processes of handlers and forwards
    // SIGTERM to the worker, which drains.
    check(
        "images/worker/Dockerfile",
        "workerpool-worker",
        &[
            "/usr/bin/tini",
            "-s",
            "--",
            "/usr/local/bin/workerpool-worker",
        ],
    );
    let shipped = dockerfile_instructions(&read("images/worker/Dockerfile"));
    assert!(
        !final_stage(&shipped).iter().any(|i| i.starts_with("CMD ")),
        "no CMD: a pool's args (`--` and the handler command) follow the entrypoint"
    );
}

#[test]
fn the_build_context_leaves_out_build_output_and_git() {
    let ignored = read(".dockerignore");
    for entry in ["target", "target-*", ".git"] {
        assert!(
            ignored.lines().any(|l| l.trim() == entry),
            ".dockerignore lacks {entry}"
        );
    }
}

/// The value of the last `INSTRUCTION ` of the final stage, if any.
fn last(dockerfile: &str, instruction: &str) -> Option<String> {
    let all = dockerfile_instructions(&read(dockerfile));
    final_stage(&all)
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix(instruction))
        .map(|v| v.trim().to_string())
}

/// The exec-form list `["a", "b"]` as its words.
fn words(exec_form: &str) -> Vec<String> {
    exec_form
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|w| w.trim().trim_matches('"').to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

/// The values given to a repeatable flag (`--flag VALUE` or `--flag=VALUE`)
/// in a piece of shell script, in order.
fn flag_values(script: &str, flag: &str) -> Vec<String> {
    let mut values = Vec::new();
    let mut tokens = script.split_whitespace();
    while let Some(token) = tokens.next() {
        if token == flag {
            values.extend(tokens.next().map(str::to_string));
        } else if let Some(value) = token.strip_prefix(&format!("{flag}=")) {
            values.push(value.to_string());
        }
    }
    values
}

#[test]
fn the_daemonless_image_builder_gives_each_image_its_dockerfiles_user_entrypoint_and_command() {
    let script = read("scripts/images.sh");
    let (operator, worker) = script
        .split_once("# The worker:")
        .expect("scripts/images.sh builds the operator, then the worker");
    for (dockerfile, part) in [
        ("images/operator/Dockerfile", operator),
        ("images/worker/Dockerfile", worker),
    ] {
        let user = last(dockerfile, "USER ").expect("USER");
        assert!(
            part.contains(&format!("--config.user {user}")),
            "{dockerfile}: scripts/images.sh sets USER {user}"
        );
        let entrypoint = words(&last(dockerfile, "ENTRYPOINT ").expect("ENTRYPOINT"));
        assert_eq!(
            flag_values(part, "--config.entrypoint"),
            entrypoint,
            "{dockerfile}: scripts/images.sh sets ENTRYPOINT {entrypoint:?}, word by word"
        );
        match last(dockerfile, "CMD ") {
            Some(cmd) => {
                for word in words(&cmd) {
                    assert!(
                        part.contains(&format!("--config.cmd {word}")),
                        "{dockerfile}: scripts/images.sh sets CMD {cmd}"
                    );
                }
            }
            None => assert!(
                part.contains("--clear=config.cmd"),
                "{dockerfile} has no CMD: scripts/images.sh clears the base image's"
            ),
        }
        if let Some(dir) = last(dockerfile, "WORKDIR ") {
            assert!(
                part.contains(&format!("--config.workingdir {dir}")),
                "{dockerfile}: scripts/images.sh sets WORKDIR {dir}"
            );
        }
    }
}
