//! `read`, `write` and `edit` (blocking; called on a blocking thread).

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use base64::Engine;
use mango_protocol::content::{ContentBlock, DocumentSource, ImageSource};

use super::paths::{self, Access};
use super::{ToolContext, ToolOutput};
use mango_protocol::tools::{EditInput, ReadInput, WriteInput};

/// Image `read` cap: 5 MiB of base64, i.e. 3 932 160 raw bytes.
pub const MAX_IMAGE_BYTES: u64 = 3_932_160;
/// PDF `read` cap: 20 MiB raw.
pub const MAX_PDF_BYTES: u64 = 20 * 1024 * 1024;

/// Which block a file the model should see (not read as text) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MediaKind {
    Image,
    Document,
}

fn media_type(path: &Path) -> Option<(MediaKind, &'static str)> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => (MediaKind::Image, "image/png"),
        "jpg" | "jpeg" => (MediaKind::Image, "image/jpeg"),
        "gif" => (MediaKind::Image, "image/gif"),
        "webp" => (MediaKind::Image, "image/webp"),
        "pdf" => (MediaKind::Document, "application/pdf"),
        _ => return None,
    })
}

/// Fixed phrases for OS errors (no host-specific strings).
fn fs_reason(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind::*;
    match e.kind() {
        NotFound => "no such file or directory",
        PermissionDenied => "permission denied",
        AlreadyExists => "already exists",
        _ => match e.raw_os_error() {
            Some(libc::EISDIR) => "is a directory",
            Some(libc::ENOTDIR) => "not a directory",
            Some(libc::ENOSPC) => "no space left on device",
            Some(libc::EROFS) => "read-only file system",
            Some(libc::ELOOP) => "too many levels of symbolic links",
            _ => "I/O error",
        },
    }
}

/// Metadata of an existing regular file, or the tool's error text.
fn regular_file(tool: &str, raw: &str, path: &Path) -> Result<fs::Metadata, String> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(m),
        Ok(_) => Err(format!("{tool}: {raw}: not a regular file")),
        Err(e) => Err(format!("{tool}: {raw}: {}", fs_reason(&e))),
    }
}

fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(8192)].contains(&0)
}

pub fn read(ctx: &ToolContext, a: ReadInput) -> ToolOutput {
    match read_inner(ctx, &a) {
        Ok(out) => out,
        Err(msg) => ToolOutput::error(msg),
    }
}

fn read_inner(ctx: &ToolContext, a: &ReadInput) -> Result<ToolOutput, String> {
    let raw = a.file_path.as_str();
    let path = paths::resolve(ctx, "read", raw, Access::Read)?;
    let meta = regular_file("read", raw, &path)?;
    let size = meta.len();

    if let Some((kind, mime)) = media_type(&path) {
        if a.view_range.is_some() {
            return Err("read: view_range is not supported for image/PDF files".into());
        }
        let cap = if kind == MediaKind::Image {
            MAX_IMAGE_BYTES
        } else {
            MAX_PDF_BYTES
        };
        if size > cap {
            return Err(format!(
                "read: {raw} is {size} bytes, exceeds {cap}-byte limit"
            ));
        }
        let bytes = fs::read(&path).map_err(|e| format!("read: {raw}: {}", fs_reason(&e)))?;
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        let media_type = mime.to_string();
        let block = match kind {
            MediaKind::Image => ContentBlock::Image {
                source: ImageSource::Base64 { data, media_type },
            },
            MediaKind::Document => ContentBlock::Document {
                source: DocumentSource::Base64 { data, media_type },
                title: None,
                context: None,
            },
        };
        return Ok(ToolOutput {
            content: vec![block],
            is_error: false,
        });
    }

    let max = ctx.max_file_bytes;
    let bytes = match a.view_range {
        None => {
            if size > max {
                return Err(format!(
                    "read: {raw} is {size} bytes, exceeds {max}-byte limit. Use the view_range parameter to read part of the file."
                ));
            }
            let mut buf = Vec::with_capacity(size as usize);
            fs::File::open(&path)
                .and_then(|f| f.take(max + 1).read_to_end(&mut buf))
                .map_err(|e| format!("read: {raw}: {}", fs_reason(&e)))?;
            if buf.len() as u64 > max {
                return Err(format!(
                    "read: {raw} exceeds {max}-byte limit. Use the view_range parameter to read part of the file."
                ));
            }
            buf
        }
        Some((start, end)) => read_range(raw, &path, start, end, max)?,
    };
    if looks_binary(&bytes) {
        return Err(format!("read: {raw} appears to be a binary file"));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("read: {raw} is not valid UTF-8"))?;
    Ok(ToolOutput::ok(text))
}

/// Streams lines `start..=end` (1-based; `end <= 0` means end of file),
/// capping the selected bytes at `max`.
fn read_range(raw: &str, path: &Path, start: i64, end: i64, max: u64) -> Result<Vec<u8>, String> {
    if start < 1 {
        return Err("read: view_range start must be >= 1".into());
    }
    if end > 0 && end < start {
        return Err(format!(
            "read: invalid view_range [{start}, {end}]: end must be >= start (or <= 0 for end of file)"
        ));
    }
    let file = fs::File::open(path).map_err(|e| format!("read: {raw}: {}", fs_reason(&e)))?;
    let mut reader = BufReader::new(file);
    let mut out = Vec::new();
    let mut line = Vec::new();
    let mut lineno: i64 = 0;
    loop {
        line.clear();
        // Bound a single line so a huge one-line file cannot exhaust memory.
        let n = (&mut reader)
            .take(max + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("read: {raw}: {}", fs_reason(&e)))?;
        if n == 0 {
            break;
        }
        let complete = line.last() == Some(&b'\n');
        if !complete && line.len() as u64 > max {
            if lineno + 1 >= start {
                return Err(format!(
                    "read: line {} of {raw} alone exceeds the {max}-byte limit",
                    lineno + 1
                ));
            }
            // Skip the rest of the over-long line before the range.
            let mut sink = Vec::new();
            reader
                .read_until(b'\n', &mut sink)
                .map_err(|e| format!("read: {raw}: {}", fs_reason(&e)))?;
        }
        lineno += 1;
        if lineno < start {
            continue;
        }
        if end > 0 && lineno > end {
            break;
        }
        out.extend_from_slice(&line);
        if out.len() as u64 > max {
            return Err(format!(
                "read: view_range [{start}, {end}] of {raw} exceeds {max}-byte limit; request fewer lines"
            ));
        }
    }
    if lineno < start {
        return Err(format!(
            "read: view_range start {start} is beyond the end of {raw} ({lineno} lines)"
        ));
    }
    Ok(out)
}

pub fn write(ctx: &ToolContext, a: WriteInput) -> ToolOutput {
    let raw = a.file_path.as_str();
    let path = match paths::resolve(ctx, "write", raw, Access::Write) {
        Ok(p) => p,
        Err(msg) => return ToolOutput::error(msg),
    };
    if path.is_dir() {
        return ToolOutput::error(format!("write: {raw}: is a directory"));
    }
    if let Some(parent) = path.parent() {
        if let Err(e) = fs::create_dir_all(parent) {
            return ToolOutput::error(format!("write: {raw}: {}", fs_reason(&e)));
        }
    }
    if let Err(e) = fs::write(&path, a.content.as_bytes()) {
        return ToolOutput::error(format!("write: {raw}: {}", fs_reason(&e)));
    }
    ToolOutput::ok(format!(
        "wrote {} bytes to {raw}",
        a.content.chars().count()
    ))
}

pub fn edit(ctx: &ToolContext, a: EditInput) -> ToolOutput {
    match edit_inner(ctx, &a) {
        Ok(out) => out,
        Err(msg) => ToolOutput::error(msg),
    }
}

fn edit_inner(ctx: &ToolContext, a: &EditInput) -> Result<ToolOutput, String> {
    let raw = a.file_path.as_str();
    let path = paths::resolve(ctx, "edit", raw, Access::Write)?;
    let meta = regular_file("edit", raw, &path)?;
    let max = ctx.max_file_bytes;
    if meta.len() > max {
        return Err(format!(
            "edit: {raw} is {} bytes, exceeds {max}-byte limit",
            meta.len()
        ));
    }
    if a.old_string.is_empty() {
        return Err("edit: old_string must not be empty".into());
    }
    let bytes = fs::read(&path).map_err(|e| format!("edit: {raw}: {}", fs_reason(&e)))?;
    if looks_binary(&bytes) {
        return Err(format!("edit: {raw} appears to be a binary file"));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("edit: {raw} is not valid UTF-8"))?;
    let count = text.matches(a.old_string.as_str()).count();
    if count == 0 {
        return Err(format!("edit: old_string not found in {raw}"));
    }
    if count > 1 && !a.replace_all {
        return Err(format!(
            "edit: old_string appears {count} times in {raw} (must be unique)"
        ));
    }
    let new_text = if a.replace_all {
        text.replace(a.old_string.as_str(), &a.new_string)
    } else {
        text.replacen(a.old_string.as_str(), &a.new_string, 1)
    };
    fs::write(&path, new_text.as_bytes()).map_err(|e| format!("edit: {raw}: {}", fs_reason(&e)))?;
    Ok(ToolOutput::ok(format!(
        "edited {raw} ({count} replacement{})",
        if count == 1 { "" } else { "s" }
    )))
}
