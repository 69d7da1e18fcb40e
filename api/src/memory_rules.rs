//! What Memory Stores and memories may contain, pure (no I/O): memory path
//! and prefix rules, the content limit, `content_sha256` preconditions,
//! store names, and the mount path a Session derives from a store's name.

use crate::error::{ApiError, ApiResult};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use mango_protocol::memory::{is_content_sha256, MAX_CONTENT_BYTES};
use mango_protocol::ErrorCode;
use sha2::{Digest, Sha256};
use unicode_normalization::is_nfc;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// A path's most bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// A path's most segments.
pub const MAX_SEGMENTS: usize = 20;
/// A store name's most characters.
pub const MAX_NAME_CHARS: usize = 255;
/// A store description's most characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// An attachment's `instructions`, most characters.
pub const MAX_INSTRUCTIONS_CHARS: usize = 4096;
/// A slug's most bytes: a directory name, with room for a `-N` suffix.
pub const MAX_SLUG_BYTES: usize = 200;
/// Where a Session mounts its stores unless the operator says otherwise.
pub use mango_protocol::memory::DEFAULT_MOUNT_ROOT;

fn bad_path(message: String) -> ApiError {
    ApiError::invalid_parameter(message).code(ErrorCode::InvalidMemoryPath)
}

/// Whether `c` may appear in a path: no control or format characters, no
/// line or paragraph separator.
fn allowed_char(c: char) -> bool {
    !matches!(
        c.general_category(),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

/// `c` as the message shows it: `U+000A`.
fn code_point(c: char) -> String {
    format!("U+{:04X}", c as u32)
}

/// The segments of a path or prefix body, each checked.
fn check_segments(field: &str, value: &str, body: &str) -> ApiResult<usize> {
    let mut count = 0;
    for segment in body.split('/') {
        count += 1;
        match segment {
            "" => {
                return Err(bad_path(format!(
                    "{field} {value:?} has an empty segment (\"//\", or a trailing \"/\"); segments are separated by one \"/\""
                )))
            }
            "." | ".." => {
                return Err(bad_path(format!(
                    "{field} {value:?} has a {segment:?} segment; paths name memories directly, without \".\" or \"..\""
                )))
            }
            _ => {}
        }
    }
    Ok(count)
}

fn check_text(field: &str, value: &str) -> ApiResult<()> {
    if value.len() > MAX_PATH_BYTES {
        return Err(bad_path(format!(
            "{field} is {} bytes long; at most {MAX_PATH_BYTES} are allowed",
            value.len()
        )));
    }
    if let Some(c) = value.chars().find(|c| !allowed_char(*c)) {
        return Err(bad_path(format!(
            "{field} {value:?} contains {}, a control, format or separator character",
            code_point(c)
        )));
    }
    if !is_nfc(value) {
        return Err(bad_path(format!(
            "{field} {value:?} is not in Unicode Normalization Form C (NFC)"
        )));
    }
    Ok(())
}

/// A memory's path: starts with `/`, 1 to 20 segments, none empty, `.` or
/// `..`; no control, format or separator characters; NFC; at most 1,024 bytes.
pub fn check_path(field: &str, path: &str) -> ApiResult<()> {
    check_text(field, path)?;
    let Some(body) = path.strip_prefix('/') else {
        return Err(bad_path(format!("{field} {path:?} must start with \"/\"")));
    };
    let segments = check_segments(field, path, body)?;
    if segments > MAX_SEGMENTS {
        return Err(bad_path(format!(
            "{field} {path:?} has {segments} segments; at most {MAX_SEGMENTS} are allowed"
        )));
    }
    Ok(())
}

/// A list's `path_prefix`: `/`, or a path of whole segments ending in `/`.
pub fn check_prefix(prefix: &str) -> ApiResult<()> {
    check_text("path_prefix", prefix)?;
    if !prefix.starts_with('/') || !prefix.ends_with('/') {
        return Err(bad_path(format!(
            "path_prefix {prefix:?} must start and end with \"/\" (it matches whole segments, e.g. \"/notes/\")"
        )));
    }
    if prefix == "/" {
        return Ok(());
    }
    let segments = check_segments("path_prefix", prefix, &prefix[1..prefix.len() - 1])?;
    if segments >= MAX_SEGMENTS {
        return Err(bad_path(format!(
            "path_prefix {prefix:?} has {segments} segments; no memory lies below {} of them",
            MAX_SEGMENTS - 1
        )));
    }
    Ok(())
}

/// A memory's content: at most 102,400 UTF-8 bytes.
pub fn check_content(content: &str) -> ApiResult<()> {
    if content.len() > MAX_CONTENT_BYTES {
        return Err(ApiError::invalid_parameter(format!(
            "content is {} bytes of UTF-8; a memory holds at most {MAX_CONTENT_BYTES}",
            content.len()
        ))
        .code(ErrorCode::MemoryContentTooLarge));
    }
    Ok(())
}

/// A precondition's digest: 64 lowercase hexadecimal characters.
pub fn check_sha256(field: &str, value: &str) -> ApiResult<()> {
    if !is_content_sha256(value) {
        let shown: String = value.chars().take(80).collect();
        return Err(ApiError::invalid_parameter(format!(
            "{field} must be a SHA-256 digest in 64 lowercase hexadecimal characters, got {shown:?}"
        )));
    }
    Ok(())
}

/// Lowercase hex SHA-256 of the UTF-8 bytes, as `content_sha256` is.
pub fn content_sha256(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

/// A store's name: 1 to 255 characters, no control characters.
pub fn check_name(name: &str) -> ApiResult<()> {
    let n = name.chars().count();
    if n == 0 || n > MAX_NAME_CHARS {
        return Err(ApiError::invalid_parameter(format!(
            "name is {n} characters long; a memory store's name has 1 to {MAX_NAME_CHARS}"
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(ApiError::invalid_parameter(format!(
            "name contains {}, a control character",
            code_point(c)
        )));
    }
    Ok(())
}

pub fn check_description(description: &str) -> ApiResult<()> {
    crate::extract::check_len("description", description, MAX_DESCRIPTION_CHARS)
}

/// The directory name a store gets in a Session: its name lowercased, every
/// run of characters other than ASCII letters and digits one hyphen, with
/// no hyphen at either end, at most 200 bytes; a name with no ASCII letter
/// or digit uses the store's id the same way.
pub fn slug(name: &str, id: &str) -> String {
    fn of(s: &str) -> String {
        let mut out = String::new();
        let mut gap = false;
        for c in s.to_lowercase().chars() {
            if c.is_ascii_alphanumeric() {
                if gap && !out.is_empty() {
                    out.push('-');
                }
                gap = false;
                out.push(c);
            } else {
                gap = true;
            }
        }
        out.truncate(MAX_SLUG_BYTES);
        out.truncate(out.trim_end_matches('-').len());
        out
    }
    match of(name) {
        s if s.is_empty() => of(id),
        s => s,
    }
}

/// `<root>/<slug>`, with `-2`, `-3` … after a slug an earlier store of the
/// same Session already took.
pub fn mount_path(root: &str, slug: &str, taken: &[String]) -> String {
    let root = root.trim_end_matches('/');
    let base = format!("{root}/{slug}");
    if !taken.contains(&base) {
        return base;
    }
    (2..)
        .map(|n| format!("{base}-{n}"))
        .find(|p| !taken.contains(p))
        .expect("an unused suffix")
}

/// A memory list's page cursor: the last key (a path or prefix) of a page.
pub fn encode_cursor(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("m1:{key}"))
}

pub fn decode_cursor(page: &str) -> ApiResult<String> {
    let bad = || {
        ApiError::invalid_parameter(format!("page {page:?} is not a cursor this API issued"))
            .code(ErrorCode::InvalidCursor)
    };
    let raw = URL_SAFE_NO_PAD.decode(page).map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    match text.strip_prefix("m1:") {
        Some(key) if key.starts_with('/') && !key.contains('\0') => Ok(key.to_string()),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path_err(p: &str) -> String {
        let err = check_path("path", p).unwrap_err();
        assert_eq!(
            err.details["error_code"], "invalid_memory_path",
            "{}",
            err.message
        );
        err.message
    }

    #[test]
    fn paths_follow_the_sdk_rules_at_their_edges() {
        for ok in ["/a", "/notes/todo.md", "/É", "/a b/c", "/.hidden", "/a..b"] {
            check_path("path", ok).unwrap_or_else(|e| panic!("{ok}: {}", e.message));
        }
        assert!(path_err("a").contains("start with"));
        assert!(path_err("/").contains("empty segment"));
        assert!(path_err("/a//b").contains("empty segment"));
        assert!(path_err("/a/").contains("empty segment"));
        assert!(path_err("/a/../b").contains("\"..\""));
        assert!(path_err("/./b").contains("\".\""));
        assert!(path_err("/a\nb").contains("U+000A"));
        assert!(path_err("/a\u{200b}b").contains("U+200B"));
        assert!(path_err("/a\u{2028}").contains("U+2028"));
        assert!(path_err("/a\u{2029}").contains("U+2029"));
        // "e" + combining acute is NFD; the composed "é" is NFC.
        assert!(path_err("/e\u{301}").contains("NFC"));

        // 20 segments pass, 21 do not.
        let twenty = "/a".repeat(20);
        check_path("path", &twenty).unwrap();
        assert!(path_err(&"/a".repeat(21)).contains("21 segments"));
        // 1,024 bytes pass, 1,025 do not (multi-byte characters count as bytes).
        let exact = format!("/{}", "a".repeat(1023));
        check_path("path", &exact).unwrap();
        assert!(path_err(&format!("/{}", "a".repeat(1024))).contains("1025 bytes"));
        let wide = format!("/{}", "é".repeat(512));
        assert_eq!(wide.len(), 1025);
        assert!(path_err(&wide).contains("1025 bytes"));
    }

    #[test]
    fn prefixes_are_whole_segments() {
        for ok in ["/", "/notes/", "/a/b/"] {
            check_prefix(ok).unwrap();
        }
        for bad in ["", "notes/", "/notes", "//", "/a//", "/../", "/a\u{7f}/"] {
            let err = check_prefix(bad).unwrap_err();
            assert_eq!(err.details["error_code"], "invalid_memory_path", "{bad}");
        }
        check_prefix(&format!("{}/", "/a".repeat(19))).unwrap();
        assert!(check_prefix(&format!("{}/", "/a".repeat(20))).is_err());
    }

    #[test]
    fn content_and_digests() {
        check_content(&"a".repeat(MAX_CONTENT_BYTES)).unwrap();
        let err = check_content(&"a".repeat(MAX_CONTENT_BYTES + 1)).unwrap_err();
        assert_eq!(err.details["error_code"], "memory_content_too_large");
        assert!(err.message.contains("102401"), "{}", err.message);
        // Bytes, not characters.
        assert!(check_content(&"é".repeat(MAX_CONTENT_BYTES / 2 + 1)).is_err());
        assert_eq!(
            content_sha256(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        check_sha256("x", &content_sha256("a")).unwrap();
        assert!(check_sha256("x", &content_sha256("a").to_uppercase()).is_err());
        assert!(check_sha256("x", "abc").is_err());
    }

    #[test]
    fn names_and_slugs() {
        check_name("a").unwrap();
        check_name(&"é".repeat(255)).unwrap();
        assert!(check_name("").is_err());
        assert!(check_name(&"a".repeat(256)).is_err());
        assert!(check_name("a\tb").is_err());
        assert_eq!(slug("User Preferences", "memstore_x"), "user-preferences");
        assert_eq!(slug("  Project: Mango!! v2 ", "x"), "project-mango-v2");
        assert_eq!(slug("ÉTÉ notes", "x"), "t-notes");
        assert_eq!(slug("日本語", "memstore_Ab1"), "memstore-ab1");
        assert_eq!(slug(&"ab".repeat(120), "x").len(), MAX_SLUG_BYTES);
        assert_eq!(
            slug(&format!("{}-b", "a".repeat(199)), "x"),
            "a".repeat(199)
        );
        let taken = vec!["/mnt/memory/a".to_string(), "/mnt/memory/a-2".to_string()];
        assert_eq!(mount_path("/mnt/memory/", "b", &taken), "/mnt/memory/b");
        assert_eq!(mount_path("/mnt/memory", "a", &taken), "/mnt/memory/a-3");
    }

    #[test]
    fn cursors_round_trip_and_refuse_garbage() {
        assert_eq!(decode_cursor(&encode_cursor("/a/b")).unwrap(), "/a/b");
        assert!(decode_cursor("nope").is_err());
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode("m2:/a")).is_err());
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode("m1:a")).is_err());
    }
}
