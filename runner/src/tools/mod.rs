//! The six workspace tools of the item runner: `bash`, `read`, `write`,
//! `edit`, `glob` and `grep` (spec §8; SDK behaviour reference §4, with the
//! Mango differences: persistent PTY bash that restarts itself after a
//! closed shell, exit codes in results, symlink-aware confinement).

pub mod bash;
pub mod files;
pub mod paths;
pub mod search;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mango_protocol::content::ContentBlock;
use mango_protocol::tools::{ToolInput, ToolName};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Default whole-file cap for `read` / `edit`.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 262_144;
/// Runner-wide per-call deadline.
pub const DEFAULT_TOOL_DEADLINE: Duration = Duration::from_secs(150);

/// Where the tools run and what they may touch.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session's working directory (`/workspace`).
    pub workspace: PathBuf,
    /// Extra roots the file tools may use (attached Memory Store roots).
    pub allowed_roots: Vec<PathBuf>,
    /// Roots `write` / `edit` refuse (read-only Memory Stores).
    pub read_only_roots: Vec<PathBuf>,
    /// Runner-wide deadline for any one call (150 s).
    pub tool_deadline: Duration,
    /// Whole-file cap for `read` / `edit` (262144).
    pub max_file_bytes: u64,
}

impl ToolContext {
    /// A context with the default limits and no extra roots.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        Self {
            workspace: workspace.into(),
            allowed_roots: Vec::new(),
            read_only_roots: Vec::new(),
            tool_deadline: DEFAULT_TOOL_DEADLINE,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }
}

/// The result of one tool call, already in the Sessions content-block shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// Text, image or document blocks.
    pub content: Vec<ContentBlock>,
    pub is_error: bool,
}

impl ToolOutput {
    /// One text block; empty text becomes `(no output)`, and NUL (U+0000)
    /// becomes U+FFFD: the Sessions API refuses NUL in strings, so a result
    /// carrying one (`printf 'a\0b'`, a file with a NUL past the binary
    /// check) could never be delivered and would jam the session.
    pub fn text(text: impl Into<String>, is_error: bool) -> Self {
        let mut text: String = text.into();
        if text.is_empty() {
            text = "(no output)".to_string();
        } else if text.contains('\0') {
            text = text.replace('\0', "\u{FFFD}");
        }
        Self {
            content: vec![ContentBlock::text(text)],
            is_error,
        }
    }

    pub fn ok(text: impl Into<String>) -> Self {
        Self::text(text, false)
    }

    pub fn error(text: impl Into<String>) -> Self {
        Self::text(text, true)
    }

    /// Concatenated text of all text blocks (handy for logs and tests).
    pub fn text_content(&self) -> String {
        self.content
            .iter()
            .filter_map(ContentBlock::as_text)
            .collect::<Vec<_>>()
            .join("")
    }
}

/// Passed to tools as the sandbox has them.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The environment every tool subprocess gets: an allow-list, never any
/// `MANGO_*` / `ANTHROPIC_*` variable.
pub fn tool_env(workspace: &std::path::Path) -> Vec<(String, String)> {
    fn pass(name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
    let mut env = vec![
        (
            "PATH".to_string(),
            pass("PATH").unwrap_or_else(|| {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
            }),
        ),
        (
            "HOME".to_string(),
            pass("HOME").unwrap_or_else(|| workspace.display().to_string()),
        ),
        (
            "LANG".to_string(),
            pass("LANG").unwrap_or_else(|| "C.UTF-8".to_string()),
        ),
        ("TERM".to_string(), "dumb".to_string()),
        ("PS1".to_string(), String::new()),
        ("PS2".to_string(), String::new()),
    ];
    // The pool's egress proxy, when it has one: how tools reach allowed
    // names (the supervisor sets these; they hold no credential).
    env.extend(
        PROXY_VARIABLES
            .iter()
            .filter_map(|name| Some((name.to_string(), pass(name)?))),
    );
    env.retain(|(k, _)| !is_secret_name(k));
    env
}

fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("MANGO_") || upper.starts_with("ANTHROPIC_")
}

/// Owns the persistent bash session and dispatches the six tools.
pub struct Toolset {
    ctx: Arc<ToolContext>,
    bash: bash::BashSession,
}

impl Toolset {
    pub fn new(ctx: ToolContext) -> Self {
        let ctx = Arc::new(ctx);
        Self {
            bash: bash::BashSession::new(ctx.clone()),
            ctx,
        }
    }

    /// Whether `name` is one of the six workspace tools.
    pub fn owns(name: &str) -> bool {
        ToolName::parse(name).is_some()
    }

    pub fn context(&self) -> &ToolContext {
        &self.ctx
    }

    /// Runs one call. Never panics on bad input; every failure is an
    /// `is_error` output. Bounded by `tool_deadline` and `cancel`.
    pub async fn run(
        &mut self,
        name: &str,
        input: &Value,
        cancel: CancellationToken,
    ) -> ToolOutput {
        let deadline = Instant::now() + self.ctx.tool_deadline;
        let Some(tool) = ToolName::parse(name) else {
            return ToolOutput::error(format!("unknown tool '{name}'"));
        };
        let job = match ToolInput::parse(tool, input) {
            Ok(ToolInput::Bash(args)) => return self.bash.run(args, deadline, cancel).await,
            Ok(file_or_search) => file_or_search,
            Err(msg) => return ToolOutput::error(msg),
        };
        run_blocking(tool, job, self.ctx.clone(), deadline, cancel).await
    }

    /// Kills the shell (if any).
    pub async fn shutdown(&mut self) {
        self.bash.shutdown().await;
    }
}

/// Cooperative stop signal for blocking walks: set on timeout/cancel.
#[derive(Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A file or search call, on a blocking thread.
async fn run_blocking(
    tool: ToolName,
    job: ToolInput,
    ctx: Arc<ToolContext>,
    deadline: Instant,
    cancel: CancellationToken,
) -> ToolOutput {
    let stop = StopFlag::default();
    let stop2 = stop.clone();
    let name = tool.as_str();
    let handle = tokio::task::spawn_blocking(move || match job {
        ToolInput::Read(a) => files::read(&ctx, a),
        ToolInput::Write(a) => files::write(&ctx, a),
        ToolInput::Edit(a) => files::edit(&ctx, a),
        ToolInput::Glob(a) => search::glob(&ctx, a, &stop2),
        ToolInput::Grep(a) => search::grep(&ctx, a, &stop2),
        ToolInput::Bash(_) => ToolOutput::error("bash runs in its shell, not here"),
    });
    tokio::select! {
        res = handle => match res {
            Ok(out) => out,
            Err(e) => ToolOutput::error(format!("{name}: internal error: {e}")),
        },
        _ = tokio::time::sleep_until(deadline.into()) => {
            stop.stop();
            ToolOutput::error(format!("tool '{name}' timed out"))
        }
        _ = cancel.cancelled() => {
            stop.stop();
            ToolOutput::error(format!("{name}: cancelled"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ToolContext, ToolOutput, Toolset};
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    #[test]
    fn nul_in_text_becomes_the_replacement_character() {
        let out = ToolOutput::ok("a\0b\0");
        assert_eq!(out.text_content(), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(
            serde_json::to_value(&out.content).unwrap(),
            json!([{"type": "text", "text": "a\u{FFFD}b\u{FFFD}"}])
        );
        assert_eq!(ToolOutput::error("\0").text_content(), "\u{FFFD}");
        assert_eq!(ToolOutput::ok("plain").text_content(), "plain");
    }

    #[tokio::test]
    async fn no_tool_output_carries_a_nul() {
        let dir = tempfile::tempdir().unwrap();
        let mut tools = Toolset::new(ToolContext::new(dir.path()));
        let bash = tools
            .run(
                "bash",
                &json!({"command": "printf 'a\\0b'"}),
                CancellationToken::new(),
            )
            .await;
        assert!(!bash.is_error, "{bash:?}");
        assert_eq!(bash.text_content(), "a\u{FFFD}b");

        // A NUL past the first 8 KiB is not taken for a binary file.
        let mut content = "x".repeat(9000).into_bytes();
        content.extend_from_slice(b"a\0b\n");
        std::fs::write(dir.path().join("late-nul.txt"), &content).unwrap();
        let path = dir.path().join("late-nul.txt");
        let read = tools
            .run(
                "read",
                &json!({"file_path": path}),
                CancellationToken::new(),
            )
            .await;
        assert!(!read.is_error, "{read:?}");
        let text = read.text_content();
        assert!(!text.contains('\0'));
        assert!(text.contains("a\u{FFFD}b"), "{}", &text[text.len() - 20..]);
        tools.shutdown().await;
    }
}
