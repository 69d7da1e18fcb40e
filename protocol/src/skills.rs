//! Custom Skills (the SDK's `BetaSkill`, `BetaSkillVersion` and their
//! deletion answers) and the limits every upload and every Session's
//! materialized Skills are held to.

use crate::time::{serde_ts, Timestamp};
use serde::{Deserialize, Serialize};

/// A Skill: a named, versioned bundle of files with a `SKILL.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Skill {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: SkillObject,
    /// Human-readable, single-line label (≤ 255 characters); the `SKILL.md`
    /// frontmatter `name` unless given at creation.
    pub display_name: String,
    /// What `latest` resolves to: the newest version.
    pub latest_version_id: String,
    /// Always `custom`: Mango stores only the workspace's own Skills.
    pub source: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub updated_at: Timestamp,
}

/// The literal `"skill"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum SkillObject {
    #[default]
    #[serde(rename = "skill")]
    Skill,
}

/// One immutable version of a Skill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkillVersion {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: SkillVersionObject,
    pub skill_id: String,
    /// The Skill's immutable kebab-case slug: the top-level directory of
    /// its files and the base name of its archive.
    pub name: String,
    /// From the `SKILL.md` frontmatter.
    pub description: String,
    /// Length in bytes of the archive `…/content` serves (Mango's extension).
    pub content_size_bytes: i64,
    /// Lowercase hex SHA-256 of that archive (Mango's extension).
    pub content_sha256: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    #[serde(with = "serde_ts")]
    pub created_at: Timestamp,
}

/// The literal `"skill_version"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum SkillVersionObject {
    #[default]
    #[serde(rename = "skill_version")]
    SkillVersion,
}

/// `DELETE /v1/skills/{id}`: `{id, type: "skill_deleted"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkillDeleted {
    pub id: String,
    /// `skill_deleted`
    #[serde(rename = "type")]
    pub kind: String,
}

/// `DELETE /v1/skills/{id}/versions/{version}`: `{id, type: "skill_version_deleted"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkillVersionDeleted {
    pub id: String,
    /// `skill_version_deleted`
    #[serde(rename = "type")]
    pub kind: String,
}

/// `POST /v1/skills` and `POST /v1/skills/{id}/versions`: a
/// `multipart/form-data` body. Described for the OpenAPI document; the api
/// reads the parts itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkillUpload {
    /// The Skill's files (parts named `files[]` or `files`), each part's
    /// filename its path (`my-skill/SKILL.md`, `my-skill/scripts/run.sh`), all
    /// under one top-level directory holding `SKILL.md`; or one zip archive
    /// of such a directory.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>, format = Binary))]
    #[serde(rename = "files[]")]
    pub files: Vec<String>,
    /// `POST /v1/skills` only: the Skill's label (≤ 255 characters, one line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
}

/// The rules an upload is held to (the api refuses anything past them with
/// 400 or 413, naming the rule).
pub mod upload_limits {
    /// The request body, and the archive Mango stores for a version.
    pub const MAX_ARCHIVE_BYTES: u64 = 8 * 1024 * 1024;
    /// The files of one version, expanded.
    pub const MAX_EXPANDED_BYTES: u64 = 64 * 1024 * 1024;
    /// Files (not counting directories) in one version.
    pub const MAX_FILES: usize = 1000;
    /// A file's path inside the Skill, in bytes, the top-level directory included.
    pub const MAX_PATH_BYTES: usize = 1024;
    /// One component of a path, in bytes.
    pub const MAX_COMPONENT_BYTES: usize = 255;
    /// `SKILL.md` itself.
    pub const MAX_SKILL_MD_BYTES: u64 = 1024 * 1024;
    /// The frontmatter `name` (a kebab-case slug).
    pub const MAX_NAME_CHARS: usize = 64;
    /// The frontmatter `description`.
    pub const MAX_DESCRIPTION_CHARS: usize = 1024;
    /// `display_name`.
    pub const MAX_DISPLAY_NAME_CHARS: usize = 255;
}

/// What the item runner materializes for one Session at most (spec §9).
pub mod session_limits {
    /// Distinct (scope, Skill, version) pins, the primary Agent's and its roster's.
    pub const MAX_SCOPE_PINS: usize = 500;
    /// Archive bytes downloaded.
    pub const MAX_COMPRESSED_BYTES: u64 = 500 * 1024 * 1024;
    /// File bytes written.
    pub const MAX_EXPANDED_BYTES: u64 = 500 * 1024 * 1024;
    /// Files written.
    pub const MAX_FILES: u64 = 10_000;
}

/// The path of a member of a Skill (an uploaded file or an archive entry),
/// as its components: relative, `/`-separated, UTF-8 without control
/// characters or backslashes, no empty or `..` component (`.` components
/// are dropped), within [`upload_limits::MAX_PATH_BYTES`] and
/// [`upload_limits::MAX_COMPONENT_BYTES`]. A trailing `/` (a directory
/// entry) is allowed and ignored. The error says which rule `raw` breaks.
pub fn member_path(raw: &str) -> Result<Vec<&str>, String> {
    use upload_limits::{MAX_COMPONENT_BYTES, MAX_PATH_BYTES};
    let shown = || format!("{:?}", raw.chars().take(120).collect::<String>());
    if raw.is_empty() {
        return Err("a member has an empty path".into());
    }
    if raw.chars().any(|c| c.is_control()) {
        return Err(format!("{} contains a control character", shown()));
    }
    if raw.contains('\\') {
        return Err(format!(
            "{} contains a backslash; separate directories with /",
            shown()
        ));
    }
    let drive = raw.as_bytes().get(1) == Some(&b':') && raw.as_bytes()[0].is_ascii_alphabetic();
    if raw.starts_with('/') || drive {
        return Err(format!(
            "{} is an absolute path; paths are relative to the Skill",
            shown()
        ));
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(format!(
            "{} is {} bytes long; at most {MAX_PATH_BYTES} are allowed",
            shown(),
            raw.len()
        ));
    }
    let trimmed = raw.strip_suffix('/').unwrap_or(raw);
    let mut parts = Vec::new();
    for part in trimmed.split('/') {
        match part {
            "" => return Err(format!("{} has an empty path component (//)", shown())),
            "." => continue,
            ".." => {
                return Err(format!(
                    "{} has a .. component; a member cannot leave the Skill's directory",
                    shown()
                ))
            }
            p if p.len() > MAX_COMPONENT_BYTES => {
                return Err(format!(
                    "{} has a component of {} bytes; at most {MAX_COMPONENT_BYTES} are allowed",
                    shown(),
                    p.len()
                ))
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(format!("{} names no file", shown()));
    }
    Ok(parts)
}

/// What a Unix mode's file type makes an archive member that is neither a
/// regular file nor a directory: `Some("a symbolic link")`, `Some("a device")` …
pub fn special_file_kind(mode: u32) -> Option<&'static str> {
    match mode & 0o170000 {
        0o120000 => Some("a symbolic link"),
        0o020000 => Some("a character device"),
        0o060000 => Some("a block device"),
        0o010000 => Some("a FIFO"),
        0o140000 => Some("a socket"),
        _ => None,
    }
}

/// Whether a Unix mode's file type is a directory.
pub fn is_directory_mode(mode: u32) -> bool {
    mode & 0o170000 == 0o040000
}

/// The PKWARE Unix extra field (0x000d): past its 12 fixed bytes it holds
/// the target of a hard or symbolic link, so a member carrying one is a link.
pub const PKWARE_UNIX_EXTRA_FIELD: u16 = 0x000d;

/// Whether `name` is a Skill's slug: lowercase letters, digits and single
/// hyphens between them, at most [`upload_limits::MAX_NAME_CHARS`].
pub fn is_slug(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= upload_limits::MAX_NAME_CHARS
        && name.split('-').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_paths_are_relative_clean_and_bounded() {
        assert_eq!(member_path("a/b/c.md").unwrap(), ["a", "b", "c.md"]);
        assert_eq!(member_path("./a/./b/").unwrap(), ["a", "b"]);
        for (bad, says) in [
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("C:/x", "absolute"),
            ("a/../../x", ".."),
            ("..", ".."),
            ("a//b", "empty path component"),
            ("a\\b", "backslash"),
            ("a/\u{7}", "control"),
            (".", "names no file"),
        ] {
            let err = member_path(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        let component = "x".repeat(upload_limits::MAX_COMPONENT_BYTES);
        assert!(member_path(&format!("a/{component}")).is_ok());
        assert!(member_path(&format!("a/{component}y")).is_err());
        let long = format!("a/{}", "b/".repeat(511));
        assert_eq!(long.len(), 1024);
        assert!(member_path(&long).is_ok());
        assert!(member_path(&format!("{long}c")).is_err());
    }

    #[test]
    fn special_files_and_slugs() {
        assert_eq!(special_file_kind(0o120777), Some("a symbolic link"));
        assert_eq!(special_file_kind(0o020644), Some("a character device"));
        assert_eq!(special_file_kind(0o060644), Some("a block device"));
        assert_eq!(special_file_kind(0o010644), Some("a FIFO"));
        assert_eq!(special_file_kind(0o140644), Some("a socket"));
        assert_eq!(special_file_kind(0o100755), None);
        assert!(is_directory_mode(0o040755));
        for good in ["pdf", "my-skill-2", &"a".repeat(64)] {
            assert!(is_slug(good), "{good}");
        }
        for bad in [
            "",
            "My-Skill",
            "a--b",
            "-a",
            "a-",
            "a_b",
            "a b",
            &"a".repeat(65),
        ] {
            assert!(!is_slug(bad), "{bad}");
        }
    }
}
