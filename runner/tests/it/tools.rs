//! Tests for the six workspace tools.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mango_runner::tools::{ToolContext, ToolOutput, Toolset};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

fn ctx(dir: &Path) -> ToolContext {
    ToolContext::new(dir)
}

fn setup() -> (tempfile::TempDir, PathBuf, Toolset) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let ts = Toolset::new(ctx(&root));
    (dir, root, ts)
}

async fn call(ts: &mut Toolset, name: &str, input: Value) -> ToolOutput {
    ts.run(name, &input, CancellationToken::new()).await
}

fn text(o: &ToolOutput) -> String {
    o.text_content()
}

/// The pid of the session's shell (starting it if there is none), as the
/// last line of a call's output.
async fn shell_pid(ts: &mut Toolset) -> String {
    let o = call(ts, "bash", json!({"command": "echo $$"})).await;
    text(&o).lines().last().unwrap_or_default().to_string()
}

// ---------------------------------------------------------------- general

#[tokio::test]
async fn owns_the_six_names() {
    for n in ["bash", "read", "write", "edit", "glob", "grep"] {
        assert!(Toolset::owns(n));
    }
    assert!(!Toolset::owns("web_fetch"));
}

#[tokio::test]
async fn unknown_fields_and_wrong_types_are_errors() {
    let (_d, _root, mut ts) = setup();
    let o = call(&mut ts, "bash", json!({"command": "true", "x": 1})).await;
    assert!(o.is_error);
    assert_eq!(text(&o), "bash: unknown field \"x\"");
    let o = call(&mut ts, "read", json!({"file_path": 5})).await;
    assert!(o.is_error);
    assert!(text(&o).contains("file_path"), "{}", text(&o));
    let o = call(&mut ts, "write", json!({"file_path": "a"})).await;
    assert!(o.is_error);
    assert_eq!(text(&o), "write: content is required");
    let o = call(&mut ts, "grep", json!("nope")).await;
    assert!(o.is_error);
    let o = call(
        &mut ts,
        "bash",
        json!({"timeout_ms": "fast", "command": "true"}),
    )
    .await;
    assert!(o.is_error);
    let o = call(&mut ts, "bash", json!({})).await;
    assert!(o.is_error);
    assert_eq!(text(&o), "bash: command is required");
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "a", "view_range": [1]}),
    )
    .await;
    assert!(o.is_error);
}

// ---------------------------------------------------------------- read

#[tokio::test]
async fn read_limits() {
    let (_d, root, mut ts) = setup();
    std::fs::write(root.join("ok.txt"), "a".repeat(262_144)).unwrap();
    std::fs::write(root.join("big.txt"), "a".repeat(262_145)).unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "ok.txt"})).await;
    assert!(!o.is_error);
    assert_eq!(text(&o).len(), 262_144);
    let o = call(&mut ts, "read", json!({"file_path": "big.txt"})).await;
    assert!(o.is_error);
    assert!(
        text(&o).contains("is 262145 bytes, exceeds 262144-byte limit"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("view_range"));
}

#[tokio::test]
async fn read_view_range_and_errors() {
    let (_d, root, mut ts) = setup();
    std::fs::write(root.join("f.txt"), "one\ntwo\nthree\nfour\n").unwrap();
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "f.txt", "view_range": [2, 3]}),
    )
    .await;
    assert_eq!(text(&o), "two\nthree\n");
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "f.txt", "view_range": [3, 0]}),
    )
    .await;
    assert_eq!(text(&o), "three\nfour\n");
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "f.txt", "view_range": [3, -1]}),
    )
    .await;
    assert_eq!(text(&o), "three\nfour\n");
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "f.txt", "view_range": [9, 10]}),
    )
    .await;
    assert!(o.is_error);
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "f.txt", "view_range": [0, 1]}),
    )
    .await;
    assert!(o.is_error);
    let o = call(&mut ts, "read", json!({"file_path": "f.txt"})).await;
    assert_eq!(text(&o), "one\ntwo\nthree\nfour\n");

    // View range on a file over the whole-file cap works; a too-large range does not.
    let mut big = String::new();
    for i in 0..40_000 {
        big.push_str(&format!("line {i}\n"));
    }
    std::fs::write(root.join("big.txt"), &big).unwrap();
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "big.txt", "view_range": [39_999, 0]}),
    )
    .await;
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(text(&o), "line 39998\nline 39999\n");
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "big.txt", "view_range": [1, 0]}),
    )
    .await;
    assert!(o.is_error);

    let o = call(&mut ts, "read", json!({"file_path": "missing.txt"})).await;
    assert!(o.is_error);
    assert_eq!(text(&o), "read: missing.txt: no such file or directory");
    std::fs::create_dir(root.join("sub")).unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "sub"})).await;
    assert!(o.is_error);
    assert!(text(&o).contains("not a regular file"));
    std::fs::write(root.join("empty.txt"), "").unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "empty.txt"})).await;
    assert!(!o.is_error);
    assert_eq!(text(&o), "(no output)");
}

#[tokio::test]
async fn read_binary_non_utf8_and_images() {
    let (_d, root, mut ts) = setup();
    std::fs::write(root.join("bin.dat"), b"abc\0def").unwrap();
    std::fs::write(root.join("latin1.txt"), b"caf\xe9\n").unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "bin.dat"})).await;
    assert!(o.is_error);
    assert!(text(&o).contains("binary"), "{}", text(&o));
    let o = call(&mut ts, "read", json!({"file_path": "latin1.txt"})).await;
    assert!(o.is_error);
    assert!(text(&o).contains("not valid UTF-8"), "{}", text(&o));

    let png = b"\x89PNG\r\n\x1a\n0000";
    std::fs::write(root.join("pic.png"), png).unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "pic.png"})).await;
    assert!(!o.is_error);
    let block = serde_json::to_value(&o.content[0]).unwrap();
    assert_eq!(block["type"], "image");
    assert_eq!(block["source"]["type"], "base64");
    assert_eq!(block["source"]["media_type"], "image/png");
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD
        .decode(block["source"]["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(data, png);
    let o = call(
        &mut ts,
        "read",
        json!({"file_path": "pic.png", "view_range": [1, 2]}),
    )
    .await;
    assert!(o.is_error);
    assert_eq!(
        text(&o),
        "read: view_range is not supported for image/PDF files"
    );
    std::fs::write(root.join("doc.pdf"), b"%PDF-1.4").unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "doc.pdf"})).await;
    let block = serde_json::to_value(&o.content[0]).unwrap();
    assert_eq!(block["type"], "document");
    assert_eq!(block["source"]["media_type"], "application/pdf");
}

// ---------------------------------------------------------------- write / edit

#[tokio::test]
async fn write_creates_parents_and_counts_characters() {
    let (_d, root, mut ts) = setup();
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": "a/b/c.txt", "content": "héllo"}),
    )
    .await;
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(text(&o), "wrote 5 bytes to a/b/c.txt");
    assert_eq!(
        std::fs::read_to_string(root.join("a/b/c.txt")).unwrap(),
        "héllo"
    );
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": "a/b/c.txt", "content": "x"}),
    )
    .await;
    assert!(!o.is_error);
    assert_eq!(
        std::fs::read_to_string(root.join("a/b/c.txt")).unwrap(),
        "x"
    );
    let o = call(&mut ts, "write", json!({"file_path": "a", "content": "x"})).await;
    assert!(o.is_error);
}

#[tokio::test]
async fn edit_cases() {
    let (_d, root, mut ts) = setup();
    let f = root.join("e.txt");
    std::fs::write(&f, "foo bar foo baz").unwrap();
    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": "e.txt", "old_string": "bar", "new_string": "BAR"}),
    )
    .await;
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(text(&o), "edited e.txt (1 replacement)");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "foo BAR foo baz");

    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": "e.txt", "old_string": "nope", "new_string": "x"}),
    )
    .await;
    assert!(o.is_error);
    assert_eq!(text(&o), "edit: old_string not found in e.txt");

    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": "e.txt", "old_string": "foo", "new_string": "x"}),
    )
    .await;
    assert!(o.is_error);
    assert_eq!(
        text(&o),
        "edit: old_string appears 2 times in e.txt (must be unique)"
    );
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "foo BAR foo baz");

    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": "e.txt", "old_string": "foo", "new_string": "q", "replace_all": true}),
    )
    .await;
    assert!(!o.is_error);
    assert_eq!(text(&o), "edited e.txt (2 replacements)");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "q BAR q baz");

    std::fs::write(root.join("big.txt"), "a".repeat(262_145)).unwrap();
    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": "big.txt", "old_string": "a", "new_string": "b"}),
    )
    .await;
    assert!(o.is_error);
    assert!(text(&o).contains("exceeds 262144-byte limit"));
    std::fs::write(root.join("bin"), b"a\0b").unwrap();
    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": "bin", "old_string": "a", "new_string": "b"}),
    )
    .await;
    assert!(o.is_error);
    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": "missing", "old_string": "a", "new_string": "b"}),
    )
    .await;
    assert!(o.is_error);
}

// ---------------------------------------------------------------- glob / grep

#[tokio::test]
async fn glob_newest_first_cap_and_refusals() {
    let (_d, root, mut ts) = setup();
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::write(root.join("src/old.rs"), "").unwrap();
    std::fs::write(root.join("src/deep/new.rs"), "").unwrap();
    std::fs::write(root.join("top.rs"), "").unwrap();
    let old = std::fs::File::options()
        .write(true)
        .open(root.join("src/old.rs"))
        .unwrap();
    old.set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    let newf = std::fs::File::options()
        .write(true)
        .open(root.join("src/deep/new.rs"))
        .unwrap();
    newf.set_modified(std::time::SystemTime::now() + Duration::from_secs(60))
        .unwrap();

    let o = call(&mut ts, "glob", json!({"pattern": "**/*.rs"})).await;
    assert!(!o.is_error, "{}", text(&o));
    let lines: Vec<String> = text(&o).lines().map(String::from).collect();
    assert_eq!(
        lines,
        vec![
            root.join("src/deep/new.rs").display().to_string(),
            root.join("top.rs").display().to_string(),
            root.join("src/old.rs").display().to_string(),
        ]
    );
    let o = call(&mut ts, "glob", json!({"pattern": "*.rs"})).await;
    assert_eq!(text(&o), root.join("top.rs").display().to_string());
    let o = call(&mut ts, "glob", json!({"pattern": "*.rs", "path": "src"})).await;
    assert_eq!(text(&o), root.join("src/old.rs").display().to_string());
    let o = call(&mut ts, "glob", json!({"pattern": "*.zzz"})).await;
    assert!(!o.is_error);
    assert_eq!(text(&o), "no matches");

    let o = call(&mut ts, "glob", json!({"pattern": "/etc/*"})).await;
    assert!(o.is_error);
    let o = call(&mut ts, "glob", json!({"pattern": "../*"})).await;
    assert!(o.is_error);
    let o = call(&mut ts, "glob", json!({"pattern": "src/../../*"})).await;
    assert!(o.is_error);
    let o = call(&mut ts, "glob", json!({"pattern": "*", "path": "/etc"})).await;
    assert!(o.is_error);
    assert!(text(&o).contains("outside the session's working directory"));

    std::fs::create_dir(root.join("many")).unwrap();
    for i in 0..250 {
        std::fs::write(root.join(format!("many/f{i}.txt")), "").unwrap();
    }
    let o = call(&mut ts, "glob", json!({"pattern": "many/*.txt"})).await;
    let t = text(&o);
    let paths: Vec<&str> = t.lines().filter(|l| l.starts_with('/')).collect();
    assert_eq!(paths.len(), 200);
}

#[tokio::test]
async fn grep_cases() {
    let (_d, root, mut ts) = setup();
    std::fs::write(root.join("a.txt"), "hello world\nbye\nhello again\n").unwrap();
    std::fs::create_dir_all(root.join(".git")).unwrap();
    std::fs::write(root.join(".git/x"), "hello git\n").unwrap();
    std::fs::create_dir_all(root.join("node_modules")).unwrap();
    std::fs::write(root.join("node_modules/x"), "hello nm\n").unwrap();
    std::fs::write(root.join("bin.dat"), b"hello\0binary\n").unwrap();
    std::fs::write(
        root.join("long.txt"),
        format!("hello {}\n", "x".repeat(3000)),
    )
    .unwrap();

    let o = call(&mut ts, "grep", json!({"pattern": "hel+o"})).await;
    assert!(!o.is_error, "{}", text(&o));
    let a = root.join("a.txt").display().to_string();
    assert_eq!(text(&o), format!("{a}:1:hello world\n{a}:3:hello again"));
    let o = call(&mut ts, "grep", json!({"pattern": "bye", "path": "a.txt"})).await;
    assert_eq!(text(&o), format!("{a}:2:bye"));
    let o = call(&mut ts, "grep", json!({"pattern": "zzz"})).await;
    assert!(!o.is_error);
    assert_eq!(text(&o), "no matches");
    let o = call(&mut ts, "grep", json!({"pattern": "(unclosed"})).await;
    assert!(o.is_error);
    assert!(text(&o).starts_with("grep: invalid regex"), "{}", text(&o));
    let o = call(&mut ts, "grep", json!({"pattern": "x", "path": "/etc"})).await;
    assert!(o.is_error);

    let mut big = String::new();
    for i in 0..5000 {
        big.push_str(&format!("match line number {i} with some padding text\n"));
    }
    std::fs::write(root.join("big.txt"), big).unwrap();
    let o = call(
        &mut ts,
        "grep",
        json!({"pattern": "match", "path": "big.txt"}),
    )
    .await;
    let t = text(&o);
    assert!(
        t.ends_with("[output truncated at 102400 bytes]"),
        "{}",
        &t[t.len() - 100..]
    );
    assert!(t.len() <= 102_400 + 40);
    assert!(t.starts_with(&format!(
        "{}:1:match line number 0",
        root.join("big.txt").display()
    )));
}

// ---------------------------------------------------------------- confinement

#[tokio::test]
async fn path_confinement() {
    let (_d, root, mut ts) = setup();
    let outside = "is outside the session's working directory";
    for p in ["../x", "a/../../x", "/etc/hostname"] {
        let o = call(&mut ts, "read", json!({"file_path": p})).await;
        assert!(o.is_error);
        assert!(text(&o).contains(outside), "{p}: {}", text(&o));
        let o = call(&mut ts, "write", json!({"file_path": p, "content": "x"})).await;
        assert!(o.is_error);
        assert!(text(&o).contains(outside), "{p}: {}", text(&o));
    }
    // `..` that stays inside is fine.
    std::fs::write(root.join("in.txt"), "in").unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "sub/../in.txt"})).await;
    assert_eq!(text(&o), "in");
    // Absolute inside is fine.
    let o = call(&mut ts, "read", json!({"file_path": root.join("in.txt")})).await;
    assert_eq!(text(&o), "in");

    std::os::unix::fs::symlink("/etc/hostname", root.join("host")).unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "host"})).await;
    assert!(o.is_error);
    assert!(text(&o).contains(outside), "{}", text(&o));
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": "host", "content": "x"}),
    )
    .await;
    assert!(o.is_error);
    // Dangling symlink escaping the roots is refused (final component resolved).
    std::os::unix::fs::symlink("/nonexistent-mango-dir/new.txt", root.join("dangle")).unwrap();
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": "dangle", "content": "x"}),
    )
    .await;
    assert!(o.is_error);
    assert!(text(&o).contains(outside), "{}", text(&o));
    // Dangling symlink inside resolves to its target.
    std::os::unix::fs::symlink("target.txt", root.join("inlink")).unwrap();
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": "inlink", "content": "hi"}),
    )
    .await;
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(root.join("target.txt")).unwrap(),
        "hi"
    );
    // Directory symlink escape.
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "etc/hostname"})).await;
    assert!(o.is_error);
    let o = call(&mut ts, "grep", json!({"pattern": "x", "path": "etc"})).await;
    assert!(o.is_error);
    // Symlink loop.
    std::os::unix::fs::symlink("loop2", root.join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", root.join("loop2")).unwrap();
    let o = call(&mut ts, "read", json!({"file_path": "loop1"})).await;
    assert!(o.is_error);
    assert!(text(&o).contains("could not be resolved"), "{}", text(&o));
}

#[tokio::test]
async fn allowed_and_read_only_roots() {
    let ws = tempfile::tempdir().unwrap();
    let mem = tempfile::tempdir().unwrap();
    let ro = std::fs::canonicalize(mem.path()).unwrap().join("shared");
    let rw = std::fs::canonicalize(mem.path()).unwrap().join("mine");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::create_dir_all(&rw).unwrap();
    std::fs::write(ro.join("rules.md"), "rule one").unwrap();
    let mut c = ctx(ws.path());
    c.allowed_roots = vec![mem.path().to_path_buf()];
    c.read_only_roots = vec![ro.clone()];
    let mut ts = Toolset::new(c);

    let rules = ro.join("rules.md").display().to_string();
    let o = call(&mut ts, "read", json!({"file_path": rules})).await;
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(text(&o), "rule one");
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": rules, "content": "x"}),
    )
    .await;
    assert!(o.is_error);
    assert_eq!(
        text(&o),
        format!(
            "write: {rules} is inside read-only directory {}",
            ro.display()
        )
    );
    let o = call(
        &mut ts,
        "edit",
        json!({"file_path": rules, "old_string": "one", "new_string": "two"}),
    )
    .await;
    assert!(o.is_error);
    assert!(text(&o).contains("read-only directory"));
    assert_eq!(
        std::fs::read_to_string(ro.join("rules.md")).unwrap(),
        "rule one"
    );
    // A workspace symlink into the read-only root is refused for writes too.
    std::os::unix::fs::symlink(&ro, ws.path().join("ro")).unwrap();
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": "ro/new.md", "content": "x"}),
    )
    .await;
    assert!(o.is_error);
    assert!(text(&o).contains("read-only directory"), "{}", text(&o));
    let o = call(
        &mut ts,
        "write",
        json!({"file_path": rw.join("n.md").display().to_string(), "content": "x"}),
    )
    .await;
    assert!(!o.is_error, "{}", text(&o));
}

// ---------------------------------------------------------------- bash

#[tokio::test]
async fn bash_state_persists() {
    let (_d, root, mut ts) = setup();
    std::fs::create_dir(root.join("sub")).unwrap();
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "cd sub && export FOO=bar"}),
    )
    .await;
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(text(&o), "(no output)");
    let o = call(&mut ts, "bash", json!({"command": "pwd; echo $FOO"})).await;
    assert_eq!(text(&o), format!("{}\nbar", root.join("sub").display()));
    // Programs see a terminal; stderr is merged; stdin is /dev/null.
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "[ -t 1 ] && echo tty; echo err >&2; cat"}),
    )
    .await;
    assert_eq!(text(&o), "tty\nerr");
    // Quotes and syntax errors stay inside the call.
    let o = call(&mut ts, "bash", json!({"command": "echo 'it'\"'\"'s'"})).await;
    assert_eq!(text(&o), "it's");
    let o = call(&mut ts, "bash", json!({"command": "echo \"unterminated"})).await;
    assert!(o.is_error);
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "if true; then echo $FOO; fi"}),
    )
    .await;
    assert_eq!(text(&o), "bar");
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "cat <<'EOF'\nline $HOME\nEOF"}),
    )
    .await;
    assert_eq!(text(&o), "line $HOME");
    // The shell killed by a signal is reported and replaced.
    let o = call(&mut ts, "bash", json!({"command": "kill -9 $$"})).await;
    assert!(o.is_error);
    assert!(text(&o).ends_with("[exit code: 137]"), "{}", text(&o));
    let o = call(&mut ts, "bash", json!({"command": "echo \"[$FOO]\""})).await;
    assert!(
        text(&o).ends_with("started a fresh shell]\n[]"),
        "{}",
        text(&o)
    );
    // ANSI escapes are stripped.
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "printf '\\033[31mred\\033[0m\\n'"}),
    )
    .await;
    assert_eq!(text(&o), "red");
    ts.shutdown().await;
}

/// Long commands (a heredoc writing a file) arrive whole and cost no more than
/// their size: the shell reads them from a file, not a byte per `read`.
#[tokio::test]
async fn bash_long_commands_arrive_whole() {
    let (_d, root, mut ts) = setup();
    let body: String = (0..4000)
        .map(|i| format!("line {i} 'quoted' \"double\" $HOME\n"))
        .collect();
    let command = format!("cat > big.txt <<'EOF'\n{body}EOF\nwc -l < big.txt; echo $?");
    assert!(command.len() > 100_000);
    let o = call(&mut ts, "bash", json!({"command": command})).await;
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(text(&o), "4000\n0");
    assert_eq!(std::fs::read_to_string(root.join("big.txt")).unwrap(), body);
    // Commands leave no file behind, in the workspace or anywhere else.
    let entries: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("big.txt")]);
    // The shell's input keeps what it has not read yet, not the whole
    // history: after ~1 MB of commands it holds far less in memory.
    for _ in 0..9 {
        let o = call(&mut ts, "bash", json!({"command": command})).await;
        assert_eq!(text(&o), "4000\n0");
    }
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "for f in /proc/$$/fd/*; do case $(readlink $f) in *mango-bash-input*) stat -L -c '%s %b %B' $f;; esac; done"}),
    )
    .await;
    let fields: Vec<u64> = text(&o)
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    let (size, held) = (fields[0], fields[1] * fields[2]);
    assert!(size > 1_000_000, "{fields:?}");
    assert!(held < 400_000, "{fields:?}");
}

#[tokio::test]
async fn bash_nonzero_exit_and_exit_builtin() {
    let (_d, _root, mut ts) = setup();
    let o = call(&mut ts, "bash", json!({"command": "echo out; false"})).await;
    assert!(o.is_error);
    assert_eq!(text(&o), "out\n[exit code: 1]");
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "export KEEP=1; echo bye; exit 3"}),
    )
    .await;
    assert!(o.is_error);
    let t = text(&o);
    assert!(t.starts_with("bye\n"), "{t}");
    assert!(t.ends_with("[exit code: 3]"), "{t}");
    let o = call(&mut ts, "bash", json!({"command": "echo \"k=$KEEP\""})).await;
    assert!(!o.is_error, "{}", text(&o));
    let t = text(&o);
    assert!(t.starts_with("[previous shell was closed ("), "{t}");
    assert!(t.contains("started a fresh shell]\n"), "{t}");
    assert!(t.ends_with("k="), "{t}");
    let o = call(&mut ts, "bash", json!({"command": "echo again"})).await;
    assert_eq!(text(&o), "again");
    ts.shutdown().await;
}

/// A command that moves the shell's own output (`exec >log 2>&1`) ends at
/// once, and the same shell carries on with the redirection in place.
#[tokio::test]
async fn bash_exec_redirection_neither_hangs_nor_kills_the_shell() {
    let (_d, root, mut ts) = setup();
    let pid = shell_pid(&mut ts).await;
    let start = Instant::now();
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "exec >out.log 2>&1; echo hidden; echo oops >&2", "timeout_ms": 20000}),
    )
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(!o.is_error, "{}", text(&o));
    assert_eq!(text(&o), "(no output)");
    let log = std::fs::read_to_string(root.join("out.log")).unwrap();
    assert_eq!(log, "hidden\noops\n");
    // Still the same shell; its output still goes where it was sent.
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "echo later; echo $$ >/dev/tty"}),
    )
    .await;
    assert_eq!(text(&o), pid);
    let log = std::fs::read_to_string(root.join("out.log")).unwrap();
    assert_eq!(log, "hidden\noops\nlater\n");
    // The marker's descriptor is the shell's own: commands neither inherit
    // it nor can take it over.
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "exec >/dev/tty 2>&1; [ -e /proc/self/fd/99 ] && echo inherited; exec 99>taken.txt; echo back"}),
    )
    .await;
    assert_eq!(text(&o), "back");
    assert_eq!(shell_pid(&mut ts).await, pid, "still the same shell");
    ts.shutdown().await;
}

/// The function that writes each call's completion marker belongs to the
/// runner: a command can neither replace nor remove it, and the shell state a
/// command may leave behind (IFS, `set -u`, an `echo`, `printf` or `read` of
/// its own) does not change how the next call ends.
#[tokio::test]
async fn bash_commands_cannot_take_over_the_completion_marker() {
    let (_d, _root, mut ts) = setup();
    let pid = shell_pid(&mut ts).await;
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "__mango_done() { echo hijacked; }; unset -f __mango_done; echo after", "timeout_ms": 20000}),
    )
    .await;
    let out = text(&o);
    assert!(out.contains("readonly function"), "{out}");
    assert!(out.contains("after"), "{out}");
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "IFS=0123456789abcdef; set -u; echo() { builtin printf 'fake\\n'; }; printf() { builtin echo fake; }; read() { builtin echo fake; }; false", "timeout_ms": 20000}),
    )
    .await;
    assert!(o.is_error);
    assert_eq!(text(&o), "[exit code: 1]");
    let o = call(&mut ts, "bash", json!({"command": "(exit 10)"})).await;
    assert_eq!(
        text(&o),
        "[exit code: 10]",
        "the status survives a hostile IFS"
    );
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "unset -f echo printf read; IFS=' '; echo $$"}),
    )
    .await;
    assert_eq!(text(&o), pid, "still the same shell");
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_timeout_closes_shell() {
    let (_d, _root, mut ts) = setup();
    call(&mut ts, "bash", json!({"command": "export A=1"})).await;
    let start = Instant::now();
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "sleep 5", "timeout_ms": 200}),
    )
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(o.is_error);
    assert_eq!(text(&o), "bash: bash command timed out after 0.2s");
    let o = call(&mut ts, "bash", json!({"command": "echo \"a=$A\""})).await;
    assert_eq!(
        text(&o),
        "[previous shell was closed (timed out); started a fresh shell]\na="
    );
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_tool_deadline_caps_timeout_ms() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = ctx(dir.path());
    c.tool_deadline = Duration::from_millis(300);
    let mut ts = Toolset::new(c);
    let start = Instant::now();
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "sleep 5", "timeout_ms": 60000}),
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(o.is_error);
    assert_eq!(text(&o), "tool 'bash' timed out");
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_cancellation_closes_shell() {
    let (_d, _root, mut ts) = setup();
    let token = CancellationToken::new();
    let t2 = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        t2.cancel();
    });
    let start = Instant::now();
    let o = ts
        .run("bash", &json!({"command": "echo started; sleep 5"}), token)
        .await;
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(o.is_error);
    assert!(
        text(&o).starts_with("bash: command cancelled"),
        "{}",
        text(&o)
    );
    let o = call(&mut ts, "bash", json!({"command": "echo ok"})).await;
    assert_eq!(
        text(&o),
        "[previous shell was closed (cancelled); started a fresh shell]\nok"
    );
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_restart() {
    let (_d, _root, mut ts) = setup();
    call(&mut ts, "bash", json!({"command": "export R=1; cd /"})).await;
    let o = call(&mut ts, "bash", json!({"restart": true})).await;
    assert!(!o.is_error);
    assert_eq!(text(&o), "bash session restarted");
    let o = call(&mut ts, "bash", json!({"command": "echo \"r=$R\""})).await;
    assert_eq!(text(&o), "r=");
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_output_truncated_to_tail() {
    let (_d, _root, mut ts) = setup();
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "head -c 150000 /dev/zero | tr '\\0' 'a'; echo; echo LAST"}),
    )
    .await;
    assert!(!o.is_error);
    let t = text(&o);
    assert!(t.starts_with("[output truncated]\n"));
    assert!(t.ends_with("\nLAST"));
    assert!(t.len() <= 102_400 + "[output truncated]\n".len());
    assert!(t.len() > 100_000);
    ts.shutdown().await;
}

/// Output is read after the marker for quick commands and streamed for
/// slow or large ones: either way every byte the command printed arrives,
/// in order, and nothing of the next call's.
#[tokio::test]
async fn bash_output_arrives_whole_whether_read_at_the_end_or_streamed() {
    let (_d, _root, mut ts) = setup();
    for lines in [1usize, 7, 300, 900, 2_000, 5_000, 12_000, 1, 3] {
        for round in 0..20 {
            let command = if round % 2 == 0 {
                format!("seq 1 {lines}")
            } else {
                format!("for i in $(seq 1 {lines}); do echo $i; done")
            };
            let o = call(&mut ts, "bash", json!({ "command": command })).await;
            assert!(!o.is_error, "{}", text(&o));
            let got = text(&o);
            let got: Vec<&str> = got.lines().collect();
            let expected: Vec<String> = (1..=lines).map(|i| i.to_string()).collect();
            let first_difference = got.iter().zip(&expected).position(|(g, e)| g != e);
            assert!(
                got.len() == lines && first_difference.is_none(),
                "{lines} lines, round {round}: got {} lines, first difference at {first_difference:?}",
                got.len()
            );
        }
    }
    ts.shutdown().await;
}

/// A command that garbles the shell's framing socket (reaching the shell's
/// own saved copy of it by number, the one way left: commands do not inherit
/// it, and a socket cannot be opened through /proc) ends its own call as
/// broken framing: the shell is closed, and the next call gets a fresh one
/// and says so.
/// The shell sleeps once per call, waiting for its next line. Reading its
/// completion marker must not wake it a second time: on a stream socket the
/// kernel woke every task blocked reading the shell's end whenever the
/// runner made room on it, which cost a context switch per call.
#[tokio::test]
async fn bash_sleeps_once_per_call() {
    let (_d, _root, mut ts) = setup();
    let pid = shell_pid(&mut ts).await;
    let voluntary_switches = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("voluntary_ctxt_switches in /proc/<pid>/status")
    };
    const CALLS: u64 = 80;
    let before = voluntary_switches();
    for i in 0..CALLS {
        let o = call(&mut ts, "bash", json!({"command": format!("echo {i}")})).await;
        assert_eq!(text(&o), i.to_string());
    }
    let slept = voluntary_switches() - before;
    assert!(
        slept <= CALLS + CALLS / 4,
        "the shell slept {slept} times over {CALLS} calls"
    );
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_garbage_on_the_framing_socket_closes_the_shell() {
    let (_d, _root, mut ts) = setup();
    let pid = shell_pid(&mut ts).await;
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "echo before; for f in /proc/$$/fd/*; do case $(readlink $f) in socket:*) echo junk >&${f##*/};; esac; done; sleep 0.05", "timeout_ms": 20000}),
    )
    .await;
    assert!(o.is_error);
    let t = text(&o);
    assert!(
        t.starts_with("bash: corrupt output framing; the shell was closed"),
        "{t}"
    );
    assert!(t.contains("before"), "{t}");
    let o = call(&mut ts, "bash", json!({"command": "echo $$"})).await;
    let t = text(&o);
    assert!(t.contains("started a fresh shell]"), "{t}");
    assert_ne!(t.lines().last().unwrap(), pid, "a new shell");
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_fake_sentinel_does_not_end_call() {
    let (_d, _root, mut ts) = setup();
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "echo __MANGO_CMD_00000000000000000000000000000000_DONE__0; printf '%s%s\\n' __MANGO_CMD_ _DONE__7; sleep 0.2; echo real-end"}),
    )
    .await;
    assert!(!o.is_error, "{}", text(&o));
    let t = text(&o);
    assert!(t.ends_with("real-end"), "{t}");
    assert!(t.contains("_DONE__7"));
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_environment_is_allow_listed() {
    std::env::set_var("MANGO_TEST_SECRET", "s3cret");
    std::env::set_var("ANTHROPIC_API_KEY", "k");
    let (_d, _root, mut ts) = setup();
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "env | grep -E '^(MANGO_|ANTHROPIC_)' || echo clean; echo \"term=$TERM ps1=[$PS1]\""}),
    )
    .await;
    assert_eq!(text(&o), "clean\nterm=dumb ps1=[]");
    let o = call(
        &mut ts,
        "bash",
        json!({"command": "env | cut -d= -f1 | sort | tr '\\n' ' '"}),
    )
    .await;
    for name in text(&o).split_whitespace() {
        assert!(
            ["PATH", "HOME", "LANG", "TERM", "PS1", "PS2", "PWD", "SHLVL", "_", "OLDPWD"]
                .contains(&name),
            "unexpected variable {name}"
        );
    }
    ts.shutdown().await;
}

#[tokio::test]
async fn bash_background_output_and_shutdown() {
    let (_d, _root, mut ts) = setup();
    let o = call(&mut ts, "bash", json!({"command": "sleep 30 & echo $!"})).await;
    let pid: i32 = text(&o).trim().parse().unwrap();
    ts.shutdown().await;
    // The background job is in the shell's process group, so it is gone.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false);
    assert!(!alive, "background job survived shutdown");
}
