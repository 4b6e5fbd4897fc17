//! The Python plugin SDK (`sdk/python`): builds its wheel, installs it into the
//! venv that `.ci/python-sdk` creates, and runs the SDK's own pytest suite
//! against this build's `toolgate` binary. Fails when the venv is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where the test finds the venv's python: this variable (set by `.ci/test`),
/// else the venv `.ci/python-sdk` creates.
const PYTHON_ENV: &str = "TOOLGATE_SDK_PYTHON";
const DEFAULT_VENV_PYTHON: &str = "target/python-sdk-venv/bin/python";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn venv_python() -> PathBuf {
    let python = std::env::var_os(PYTHON_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(DEFAULT_VENV_PYTHON));
    assert!(
        python.is_file(),
        "the Python SDK's venv is missing ({} not found): create it with `bash .ci/python-sdk` \
         or run the whole suite with `bash .ci/test`, or point {PYTHON_ENV} at a python that has \
         .ci/python-sdk-requirements.txt installed",
        python.display()
    );
    python
}

/// Runs `python args...` in `dir`; panics with its output unless it succeeded.
fn run_python(python: &Path, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let output = Command::new(python)
        .args(args)
        .current_dir(dir)
        // No bytecode files in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|err| panic!("running {} {args:?}: {err}", python.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        python.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Builds the wheel (as `pip install ./sdk/python` would) and checks it is typed.
fn build_wheel(python: &Path, out: &Path) -> PathBuf {
    let sdk = repo().join("sdk/python");
    run_python(
        python,
        &sdk,
        &[
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            out.to_str().expect("utf-8 temp path"),
            ".",
        ],
        &[],
    );
    let wheels: Vec<PathBuf> = std::fs::read_dir(out)
        .expect("wheel dir")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "expected one wheel, got {wheels:?}");
    let wheel = wheels[0].clone();
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("toolgate_plugin-"), "{name}");
    let listing = run_python(
        python,
        out,
        &["-m", "zipfile", "-l", wheel.to_str().unwrap()],
        &[],
    );
    let listing = String::from_utf8_lossy(&listing.stdout);
    for file in ["toolgate_plugin/py.typed", "toolgate_plugin/__init__.py"] {
        assert!(
            listing.contains(file),
            "{file} missing from {name}:\n{listing}"
        );
    }
    wheel
}

#[test]
fn the_python_sdk_suite_passes_against_this_binary() {
    let python = venv_python();
    let wheels = tempfile::tempdir().expect("temp dir");
    let wheel = build_wheel(&python, wheels.path());
    // The venv is a cache shared between runs: this build's SDK replaces the last one.
    run_python(
        &python,
        wheels.path(),
        &[
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            wheel.to_str().unwrap(),
        ],
        &[],
    );
    let output = run_python(
        &python,
        &repo().join("sdk/python"),
        &["-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"],
        &[("TOOLGATE_BIN", env!("CARGO_BIN_EXE_toolgate"))],
    );
    let summary = String::from_utf8_lossy(&output.stdout);
    println!("{summary}");
    // A suite that collected nothing, or skipped a test, has not shown anything.
    assert!(
        summary.contains(" passed"),
        "pytest ran no test:\n{summary}"
    );
    assert!(
        !summary.contains("skipped"),
        "pytest skipped tests:\n{summary}"
    );
}
