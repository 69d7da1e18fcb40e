//! The healthcheck probe (spec §4): a fixed Bash process writes a small file in
//! the (ephemeral) workspace and verifies its contents, within 10 s. No input
//! from the caller reaches it.

use rand::Rng;
use std::path::Path;
use std::time::Duration;

pub const PROBE_DEADLINE: Duration = Duration::from_secs(10);
pub const PASSED: &str = "Sandbox process and workspace check passed";
/// Result messages are at most this long (spec §4).
pub const MAX_MESSAGE_CHARS: usize = 1024;

const SCRIPT: &str = r#"set -eu
printf '%s' "$1" > "$2"
test "$(cat "$2")" = "$1"
rm -f "$2""#;

/// Runs the probe in `workspace`; `Err` carries the reason, ready to report.
pub async fn probe(workspace: &Path) -> Result<(), String> {
    let nonce: String = rand::thread_rng()
        .sample_iter(rand::distributions::Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    let file = workspace.join(format!(".mango-healthcheck-{nonce}"));
    let mut command = tokio::process::Command::new("/bin/bash");
    command
        .args(["--noprofile", "--norc", "-c", SCRIPT, "mango-healthcheck"])
        .arg(&nonce)
        .arg(&file)
        .current_dir(workspace)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let outcome = tokio::time::timeout(PROBE_DEADLINE, command.output()).await;
    let _ = std::fs::remove_file(&file);
    let reason = match outcome {
        Err(_) => format!("probe did not finish within {} s", PROBE_DEADLINE.as_secs()),
        Ok(Err(err)) => format!(
            "could not start /bin/bash in {}: {err}",
            workspace.display()
        ),
        Ok(Ok(out)) if out.status.success() => return Ok(()),
        Ok(Ok(out)) => format!(
            "probe failed ({}) in {}: {}",
            out.status,
            workspace.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    };
    Err(reason.chars().take(MAX_MESSAGE_CHARS).collect())
}
