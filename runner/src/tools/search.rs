//! `glob` and `grep` (blocking; called on a blocking thread).

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::GlobBuilder;
use regex::bytes::RegexBuilder;
use walkdir::WalkDir;

use super::paths::{self, Access};
use super::{StopFlag, ToolContext, ToolOutput};
use mango_protocol::tools::{GlobInput, GrepInput};

/// At most this many glob results are returned.
pub const GLOB_RESULT_LIMIT: usize = 200;
/// Walk cap: glob matches collected / grep files searched.
pub const WALK_MAX_ENTRIES: usize = 50_000;
/// grep output cap (head kept).
pub const GREP_OUTPUT_LIMIT: usize = 102_400;
/// grep skips lines longer than this (ReDoS guard).
pub const GREP_MAX_LINE_LENGTH: usize = 2000;

fn search_root(ctx: &ToolContext, tool: &str, path: Option<&str>) -> Result<PathBuf, String> {
    match path {
        None => Ok(paths::resolve(ctx, tool, ".", Access::Read)?),
        Some(p) => paths::resolve(ctx, tool, p, Access::Read),
    }
}

pub fn glob(ctx: &ToolContext, a: GlobInput, stop: &StopFlag) -> ToolOutput {
    match glob_inner(ctx, &a, stop) {
        Ok(out) => out,
        Err(msg) => ToolOutput::error(msg),
    }
}

fn glob_inner(ctx: &ToolContext, a: &GlobInput, stop: &StopFlag) -> Result<ToolOutput, String> {
    if a.pattern.is_empty() {
        return Err("glob: pattern is required".into());
    }
    if a.pattern.starts_with('/') || Path::new(&a.pattern).is_absolute() {
        return Err("glob: absolute patterns are not allowed; use the path parameter".into());
    }
    if a.pattern.split('/').any(|seg| seg == "..") {
        return Err("glob: pattern must not contain '..' segments".into());
    }
    let root = search_root(ctx, "glob", a.path.as_deref())?;
    if !root.is_dir() {
        return Err(format!(
            "glob: {}: not a directory",
            a.path.as_deref().unwrap_or(".")
        ));
    }
    let matcher = GlobBuilder::new(&a.pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| format!("glob: invalid pattern: {}", e.kind()))?
        .compile_matcher();

    let mut matches: Vec<(SystemTime, PathBuf)> = Vec::new();
    for entry in WalkDir::new(&root).min_depth(1).follow_links(false) {
        if stop.is_stopped() {
            return Err("glob: stopped".into());
        }
        let Ok(entry) = entry else { continue };
        let Ok(rel) = entry.path().strip_prefix(&root) else {
            continue;
        };
        if !matcher.is_match(rel) {
            continue;
        }
        let path = entry.path().to_path_buf();
        let mtime = if entry.path_is_symlink() {
            // Keep symlinked matches only if they resolve inside the search root.
            match fs::canonicalize(&path) {
                Ok(target) if target.starts_with(&root) && paths::is_confined(ctx, &target) => {
                    fs::metadata(&target).and_then(|m| m.modified()).ok()
                }
                _ => continue,
            }
        } else {
            entry.metadata().ok().and_then(|m| m.modified().ok())
        };
        matches.push((mtime.unwrap_or(SystemTime::UNIX_EPOCH), path));
        if matches.len() >= WALK_MAX_ENTRIES {
            break;
        }
    }
    if matches.is_empty() {
        return Ok(ToolOutput::ok("no matches"));
    }
    matches.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let total = matches.len();
    let mut lines: Vec<String> = matches
        .into_iter()
        .take(GLOB_RESULT_LIMIT)
        .map(|(_, p)| p.display().to_string())
        .collect();
    if total > GLOB_RESULT_LIMIT {
        lines.push(format!(
            "[showing the {GLOB_RESULT_LIMIT} most recently modified of {total} matches]"
        ));
    }
    Ok(ToolOutput::ok(lines.join("\n")))
}

pub fn grep(ctx: &ToolContext, a: GrepInput, stop: &StopFlag) -> ToolOutput {
    match grep_inner(ctx, &a, stop) {
        Ok(out) => out,
        Err(msg) => ToolOutput::error(msg),
    }
}

fn is_skipped_dir(name: &std::ffi::OsStr) -> bool {
    name == ".git" || name == "node_modules"
}

fn grep_inner(ctx: &ToolContext, a: &GrepInput, stop: &StopFlag) -> Result<ToolOutput, String> {
    if a.pattern.is_empty() {
        return Err("grep: pattern is required".into());
    }
    let re = RegexBuilder::new(&a.pattern)
        .size_limit(10 * 1024 * 1024)
        .build()
        .map_err(|e| format!("grep: invalid regex: {e}"))?;
    let root = search_root(ctx, "grep", a.path.as_deref())?;
    fs::metadata(&root).map_err(|_| {
        format!(
            "grep: {}: no such file or directory",
            a.path.as_deref().unwrap_or(".")
        )
    })?;

    let mut out = String::new();
    let mut truncated = false;
    let mut files = 0usize;
    let walker = WalkDir::new(&root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            e.depth() == 0 || !(e.file_type().is_dir() && is_skipped_dir(e.file_name()))
        });
    for entry in walker {
        if stop.is_stopped() {
            return Err("grep: stopped".into());
        }
        let Ok(entry) = entry else { continue };
        // Symlinked files and directories are skipped (the root itself was
        // already resolved and confined).
        if !entry.file_type().is_file() {
            continue;
        }
        files += 1;
        if files > WALK_MAX_ENTRIES {
            break;
        }
        if grep_file(entry.path(), &re, &mut out, stop) {
            truncated = true;
            break;
        }
    }
    if out.is_empty() {
        return Ok(ToolOutput::ok("no matches"));
    }
    if truncated {
        out.push_str(&format!("[output truncated at {GREP_OUTPUT_LIMIT} bytes]"));
    } else if out.ends_with('\n') {
        out.pop();
    }
    Ok(ToolOutput::ok(out))
}

/// Appends `path:line:text` lines for matches; returns true once the output
/// cap is reached.
fn grep_file(path: &Path, re: &regex::bytes::Regex, out: &mut String, stop: &StopFlag) -> bool {
    let Ok(mut file) = fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 512];
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(_) => return false,
        }
    }
    if head[..filled].contains(&0) {
        return false;
    }
    let reader = BufReader::new((&head[..filled]).chain(file));
    let display = path.display().to_string();
    let mut lineno = 0usize;
    let mut reader = reader;
    let mut line = Vec::new();
    loop {
        line.clear();
        // Read at most a little over the line limit, then skip the rest.
        let n = match (&mut reader)
            .take(GREP_MAX_LINE_LENGTH as u64 + 2)
            .read_until(b'\n', &mut line)
        {
            Ok(n) => n,
            Err(_) => return false,
        };
        if n == 0 {
            return false;
        }
        lineno += 1;
        if lineno.is_multiple_of(4096) && stop.is_stopped() {
            return false;
        }
        let complete = line.last() == Some(&b'\n');
        if !complete && line.len() > GREP_MAX_LINE_LENGTH {
            let mut sink = Vec::new();
            if reader.read_until(b'\n', &mut sink).is_err() {
                return false;
            }
            continue;
        }
        let mut content: &[u8] = &line;
        if let Some(stripped) = content.strip_suffix(b"\n") {
            content = stripped;
        }
        if let Some(stripped) = content.strip_suffix(b"\r") {
            content = stripped;
        }
        if content.len() > GREP_MAX_LINE_LENGTH || !re.is_match(content) {
            continue;
        }
        let entry = format!("{display}:{lineno}:{}\n", String::from_utf8_lossy(content));
        if out.len() + entry.len() > GREP_OUTPUT_LIMIT {
            let room = GREP_OUTPUT_LIMIT - out.len();
            let mut cut = room;
            while cut > 0 && !entry.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push_str(&entry[..cut]);
            if !out.ends_with('\n') {
                out.push('\n');
            }
            return true;
        }
        out.push_str(&entry);
    }
}
