//! The shape the call-path issue asked for, checked on the source itself: no
//! circles between the crate's top-level modules (a low module never imports a
//! high one), no function in `src/` of 80 lines or more, and `axum` only in the
//! HTTP layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function body allowed, in lines (the issue: "under 80").
const MAX_FUNCTION_LINES: usize = 79;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "src/ not found at {}", src.display());
    files
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (relative, std::fs::read_to_string(&path).expect("read"))
        })
        .collect()
}

/// The code of a file without its unit tests (they may reach anywhere).
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at])
}

/// The top-level module a file belongs to (`runtime/dispatch.rs` → `runtime`).
fn module_of(relative: &str) -> String {
    relative
        .split('/')
        .next()
        .unwrap()
        .trim_end_matches(".rs")
        .to_owned()
}

/// Top-level modules named by `crate::<module>` in `code`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

/// A path through `graph` that comes back to where it started, if any.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_form_no_circle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (relative, text) in sources() {
        let module = module_of(&relative);
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(
            imports(without_tests(&text))
                .into_iter()
                .filter(|imported| *imported != module),
        );
    }
    assert!(graph.contains_key("runtime") && graph.contains_key("store"));
    assert_eq!(find_cycle(&graph), None, "module graph: {graph:#?}");
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"])]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
            .collect();
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

/// Lines of each function in `text`, found by counting braces outside string
/// and character literals.
fn function_lengths(text: &str) -> Vec<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let is_fn = [
            "fn ",
            "pub fn ",
            "async fn ",
            "pub async fn ",
            "pub(crate) fn ",
            "pub(super) fn ",
            "pub(crate) async fn ",
            "pub(super) async fn ",
            "const fn ",
        ]
        .iter()
        .any(|prefix| trimmed.starts_with(prefix));
        if !is_fn {
            continue;
        }
        let mut depth = 0i32;
        let mut opened = false;
        for (offset, body_line) in lines[start..].iter().enumerate() {
            let code = strip_literals(body_line);
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if !opened && code.trim_end().ends_with(';') {
                break; // a declaration without a body
            }
            if opened && depth <= 0 {
                found.push((offset + 1, start + 1, trimmed.to_owned()));
                break;
            }
        }
    }
    found
}

/// A line with string and character literals and comments blanked.
fn strip_literals(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '/' if chars.peek() == Some(&'/') => break,
            '\'' => {
                // A char literal such as '{' or '\n'; a lifetime has no closing quote soon.
                let rest: String = chars.clone().take(3).collect();
                if let Some(end) = rest.find('\'') {
                    for _ in 0..=end {
                        chars.next();
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn no_function_in_src_reaches_80_lines() {
    let mut longest = Vec::new();
    for (relative, text) in sources() {
        for (length, line, signature) in function_lengths(&text) {
            if length > MAX_FUNCTION_LINES {
                longest.push(format!("{relative}:{line} ({length} lines) {signature}"));
            }
        }
    }
    assert!(
        longest.is_empty(),
        "functions of 80 lines or more: {longest:#?}"
    );
}

#[test]
fn the_length_counter_counts() {
    let text = "fn a() {\n    let s = \"}\";\n    let c = '{';\n}\nfn b();\npub async fn c() {\n    if x { y }\n}\n";
    let lengths: Vec<usize> = function_lengths(text)
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    assert_eq!(lengths, [4, 3]);
}

#[test]
fn only_the_http_layer_imports_axum() {
    let allowed = ["api/", "app.rs", "listener.rs", "main.rs"];
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|(relative, _)| !allowed.iter().any(|prefix| relative.starts_with(prefix)))
        .filter(|(_, text)| without_tests(text).contains("axum::"))
        .map(|(relative, _)| relative)
        .collect();
    assert!(
        offenders.is_empty(),
        "axum outside the HTTP layer: {offenders:?}"
    );
}

/// Every statement that changes a journal row bumps its `revision`: a page
/// reuses a row's JSON written at the same revision (src/store/rendered_rows.rs),
/// so an update without the bump would leave pages showing the row as it was.
#[test]
fn every_journal_row_update_bumps_its_revision() {
    const UPDATE: &str = "update tool_execution_record";
    const BUMP: &str = " set revision = revision + 1,";
    let mut updates = 0;
    let mut offenders = Vec::new();
    for (relative, text) in sources() {
        let code = without_tests(&text).to_ascii_lowercase();
        for (at, _) in code.match_indices(UPDATE) {
            updates += 1;
            if !code[at + UPDATE.len()..].starts_with(BUMP) {
                let line = code[..at].lines().count();
                offenders.push(format!("{relative}:{line}"));
            }
        }
    }
    // The journal's own updates (finish, recovery, jobs, approvals, runs):
    // fewer means this check no longer sees them.
    assert!(updates >= 10, "only {updates} journal row updates found");
    assert!(
        offenders.is_empty(),
        "journal row updates that leave the revision as it was: {offenders:?}"
    );
}
