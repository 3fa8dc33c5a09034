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

/// scripts/images.sh's three parts: the operator's, the worker's and the
/// Python example's.
fn image_builder_parts(script: &str) -> (&str, &str, &str) {
    let (operator, rest) = script
        .split_once("# The worker:")
        .expect("scripts/images.sh builds the operator, then the worker");
    let (worker, python) = rest
        .split_once("# The Python example:")
        .expect("scripts/images.sh builds the Python example after the worker");
    (operator, worker, python)
}

#[test]
fn the_daemonless_image_builder_gives_each_image_its_dockerfiles_user_entrypoint_and_command() {
    let script = read("scripts/images.sh");
    let (operator, worker, _) = image_builder_parts(&script);
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
            Some(cmd) => assert_eq!(
                flag_values(part, "--config.cmd"),
                words(&cmd),
                "{dockerfile}: scripts/images.sh sets CMD {cmd}, word by word"
            ),
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

const EXAMPLE_DOCKERFILE: &str = "sdk/python/examples/mini_project/Dockerfile";

#[test]
fn the_python_example_image_is_the_worker_image_running_the_mini_project_as_an_exec_handler() {
    let all = dockerfile_instructions(&read(EXAMPLE_DOCKERFILE));
    let froms: Vec<&String> = all.iter().filter(|i| i.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 1, "{EXAMPLE_DOCKERFILE}: one stage");
    assert!(
        froms[0].starts_with("FROM ghcr.io/workerpool-dev/workerpool-worker:"),
        "{EXAMPLE_DOCKERFILE}: FROM the worker image, whose entrypoint is workerpool-worker: {}",
        froms[0]
    );
    assert!(
        last(EXAMPLE_DOCKERFILE, "ENTRYPOINT ").is_none(),
        "{EXAMPLE_DOCKERFILE}: keeps the worker image's entrypoint"
    );
    let cmd = words(&last(EXAMPLE_DOCKERFILE, "CMD ").expect("a CMD"));
    assert_eq!(
        cmd,
        ["--handler", "exec", "--", "python3", "-m", "mini.worker"],
        "{EXAMPLE_DOCKERFILE}: workerpool-worker --handler exec -- python3 -m <the app's module>"
    );
    let user = last(EXAMPLE_DOCKERFILE, "USER ").expect("USER");
    assert_eq!(
        user, "65532:65532",
        "{EXAMPLE_DOCKERFILE}: back to the worker image's user"
    );

    // The client README shows the same image for an app named myapp.
    let readme = read("sdk/python/README.md");
    let block = readme
        .split("```dockerfile\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("sdk/python/README.md has a Dockerfile");
    let shown: Vec<String> = dockerfile_instructions(block)
        .iter()
        .map(|i| i.replace("myapp", "mini"))
        .collect();
    assert_eq!(
        shown, all,
        "sdk/python/README.md's Dockerfile (for myapp) and {EXAMPLE_DOCKERFILE} (for mini) differ"
    );
}

#[test]
fn the_daemonless_image_builder_builds_the_python_example_as_its_dockerfile_says() {
    let script = read("scripts/images.sh");
    let (_, _, part) = image_builder_parts(&script);
    let user = last(EXAMPLE_DOCKERFILE, "USER ").expect("USER");
    assert!(
        part.contains(&format!("--config.user {user}")),
        "scripts/images.sh sets USER {user} on the Python example"
    );
    let cmd = words(&last(EXAMPLE_DOCKERFILE, "CMD ").expect("CMD"));
    assert_eq!(
        flag_values(part, "--config.cmd"),
        cmd,
        "scripts/images.sh sets the Python example's CMD, word by word"
    );
    assert!(
        flag_values(part, "--config.entrypoint").is_empty(),
        "the Python example keeps the worker image's entrypoint"
    );
    // ENV PATH=/opt/venv/bin:$PATH, the venv the RUN makes, the app the COPY puts.
    let env = last(EXAMPLE_DOCKERFILE, "ENV ").expect("ENV");
    let venv_bin = env
        .strip_prefix("PATH=")
        .and_then(|path| path.strip_suffix(":$PATH"))
        .expect("ENV PATH=<venv>/bin:$PATH");
    assert!(
        part.contains(&format!("--config.env \"PATH={venv_bin}:$")),
        "scripts/images.sh puts {venv_bin} first on PATH"
    );
    let venv = venv_bin.strip_suffix("/bin").expect("<venv>/bin");
    let all = dockerfile_instructions(&read(EXAMPLE_DOCKERFILE));
    assert!(
        all.iter()
            .any(|i| i.starts_with("RUN ") && i.contains(&format!("python3 -m venv {venv}"))),
        "{EXAMPLE_DOCKERFILE}: makes the venv {venv}"
    );
    assert!(
        part.contains(&format!("-m venv --without-pip {venv}")),
        "scripts/images.sh makes the venv {venv} with the image's python3"
    );
    let copy = last(EXAMPLE_DOCKERFILE, "COPY ").expect("COPY");
    let to = copy.split_whitespace().last().expect("a destination");
    assert!(
        part.contains(&format!("/mini\" {to} ")),
        "scripts/images.sh puts the app at {to}"
    );
}
