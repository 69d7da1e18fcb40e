//! An upload becomes a Skill version's archive. The upload is the Skill's
//! files (each multipart part's filename its path) or one zip archive of
//! them; either way every member is checked (the path rules of
//! `mango_protocol::skills::member_path`, regular files only, no duplicate,
//! the limits of `upload_limits`), one top-level directory must hold a
//! `SKILL.md` whose frontmatter gives the Skill's `name` (or the directory
//! does) and `description`, and Mango writes the archive it stores itself:
//! a zip of regular files under `<name>/`, deflated, with fixed timestamps
//! and modes 0644 or 0755, so the same files always make the same bytes.
//!
//! Nothing here trusts an archive's declared sizes: a member is read at
//! most one byte past what is left of the expanded limit.

use super::frontmatter;
use mango_protocol::skills::{
    is_directory_mode, is_slug, member_path, special_file_kind, upload_limits as limits,
    PKWARE_UNIX_EXTRA_FIELD,
};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Cursor, Read, Write};

/// One multipart part: its filename and bytes.
pub struct UploadedFile {
    pub filename: String,
    pub bytes: bytes::Bytes,
}

/// Why an upload was refused; the message names the member and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadError {
    /// 400 `invalid_request_error`.
    Invalid(String),
    /// 413 `request_too_large`: past a size limit.
    TooLarge(String),
}

fn invalid<T>(message: impl Into<String>) -> Result<T, UploadError> {
    Err(UploadError::Invalid(message.into()))
}

/// A checked upload, and the archive Mango stores for it.
#[derive(Debug)]
pub struct BuiltVersion {
    /// The Skill's slug (frontmatter `name`, else the directory's name).
    pub name: String,
    pub description: String,
    /// The frontmatter `name` as written (the default `display_name`).
    pub title: String,
    pub archive: Vec<u8>,
    /// Lowercase hex SHA-256 of `archive`.
    pub sha256: String,
    pub file_count: usize,
    pub expanded_bytes: u64,
}

struct Member {
    /// Below the top-level directory.
    rest: Vec<String>,
    data: Vec<u8>,
    executable: bool,
}

/// Checks `files` and builds the version's archive.
pub fn build(files: Vec<UploadedFile>) -> Result<BuiltVersion, UploadError> {
    if files.is_empty() {
        return invalid(
            "files is required: upload the Skill's files (parts named files[], each filename its path, e.g. my-skill/SKILL.md) or one zip archive of its directory",
        );
    }
    let total: u64 = files.iter().map(|f| f.bytes.len() as u64).sum();
    if total > limits::MAX_ARCHIVE_BYTES {
        return Err(UploadError::TooLarge(format!(
            "the upload is {total} bytes; at most {} are allowed",
            limits::MAX_ARCHIVE_BYTES
        )));
    }
    let single_zip = files.len() == 1
        && (files[0].bytes.starts_with(b"PK\x03\x04")
            || files[0].bytes.starts_with(b"PK\x05\x06")
            || files[0].filename.to_ascii_lowercase().ends_with(".zip"));
    let (top, members) = if single_zip {
        from_zip(&files[0])?
    } else {
        from_files(files)?
    };
    finish(top, members)
}

/// Adds one member to `tree` (top-level directory → members), refusing
/// duplicates and a path that is both a file and a directory.
struct Tree {
    top: Option<String>,
    files: BTreeMap<Vec<String>, Member>,
    dirs: BTreeSet<Vec<String>>,
    expanded: u64,
}

impl Tree {
    fn new() -> Tree {
        Tree {
            top: None,
            files: BTreeMap::new(),
            dirs: BTreeSet::new(),
            expanded: 0,
        }
    }

    /// The member's path below the one top-level directory.
    fn place(&mut self, raw: &str, is_dir: bool) -> Result<Vec<String>, UploadError> {
        let parts = member_path(raw).map_err(UploadError::Invalid)?;
        let top = parts[0].to_string();
        match &self.top {
            None => self.top = Some(top.clone()),
            Some(t) if *t != top => {
                return invalid(format!(
                    "every file must be in one top-level directory; found {t:?} and {top:?}"
                ))
            }
            Some(_) => {}
        }
        let rest: Vec<String> = parts[1..].iter().map(|s| s.to_string()).collect();
        if rest.is_empty() {
            if is_dir {
                return Ok(rest);
            }
            return invalid(format!(
                "{raw:?} is not inside a directory: put the Skill's files in one top-level directory (e.g. {top}/SKILL.md → my-skill/{top})"
            ));
        }
        let shown = format!("{top}/{}", rest.join("/"));
        if is_dir {
            if self.files.contains_key(&rest) {
                return invalid(format!("{shown:?} is both a file and a directory"));
            }
            self.dirs.insert(rest.clone());
        } else {
            if self.files.contains_key(&rest) {
                return invalid(format!(
                    "{shown:?} appears more than once (a duplicate member)"
                ));
            }
            if self.dirs.contains(&rest) {
                return invalid(format!("{shown:?} is both a file and a directory"));
            }
            if self.files.len() >= limits::MAX_FILES {
                return Err(UploadError::TooLarge(format!(
                    "the Skill has more than {} files",
                    limits::MAX_FILES
                )));
            }
        }
        // A parent of this member must not be a file.
        for n in 1..rest.len() {
            if self.files.contains_key(&rest[..n]) {
                return invalid(format!(
                    "{:?} is both a file and a directory",
                    format!("{top}/{}", rest[..n].join("/"))
                ));
            }
            self.dirs.insert(rest[..n].to_vec());
        }
        Ok(rest)
    }

    fn add_file(&mut self, rest: Vec<String>, data: Vec<u8>, executable: bool) {
        self.files.insert(
            rest.clone(),
            Member {
                rest,
                data,
                executable,
            },
        );
    }

    /// Room left under the expanded limit, or the refusal.
    fn room(&self, adding: u64, name: &str) -> Result<u64, UploadError> {
        let left = limits::MAX_EXPANDED_BYTES - self.expanded;
        if adding > left {
            return Err(UploadError::TooLarge(format!(
                "the Skill's files expand to more than {} bytes (at {name:?})",
                limits::MAX_EXPANDED_BYTES
            )));
        }
        Ok(left)
    }
}

fn from_files(files: Vec<UploadedFile>) -> Result<(String, Vec<Member>), UploadError> {
    let mut tree = Tree::new();
    for file in files {
        if file.filename.is_empty() {
            return invalid(
                "a part of files[] has no filename: each file's filename is its path in the Skill",
            );
        }
        if file.filename.ends_with('/') {
            return invalid(format!(
                "{:?} names a directory; upload files only",
                file.filename
            ));
        }
        let rest = tree.place(&file.filename, false)?;
        tree.room(file.bytes.len() as u64, &file.filename)?;
        tree.expanded += file.bytes.len() as u64;
        tree.add_file(rest, file.bytes.to_vec(), false);
    }
    let top = tree.top.clone().unwrap_or_default();
    Ok((top, tree.files.into_values().collect()))
}

fn from_zip(file: &UploadedFile) -> Result<(String, Vec<Member>), UploadError> {
    let not_zip = |e: &dyn std::fmt::Display| {
        UploadError::Invalid(format!(
            "{:?} is not a readable zip archive ({e}); upload a zip of the Skill's directory, or its files one by one",
            file.filename
        ))
    };
    let mut zip = zip::ZipArchive::new(Cursor::new(&file.bytes[..])).map_err(|e| not_zip(&e))?;
    if zip.has_duplicate_names() {
        return invalid("the archive lists a member more than once (a duplicate member)");
    }
    if zip.has_overlapping_files().map_err(|e| not_zip(&e))? {
        return invalid(
            "members of the archive share their data (a hard link or an overlapping-entry zip bomb)",
        );
    }
    let mut tree = Tree::new();
    // Declared sizes first, so a zip bomb is refused before anything expands.
    let mut declared: u64 = 0;
    for i in 0..zip.len() {
        let entry = zip.by_index_raw(i).map_err(|e| not_zip(&e))?;
        declared = declared.saturating_add(entry.size());
    }
    if declared > limits::MAX_EXPANDED_BYTES {
        return Err(UploadError::TooLarge(format!(
            "the archive's members expand to {declared} bytes; at most {} are allowed",
            limits::MAX_EXPANDED_BYTES
        )));
    }
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| match e {
            zip::result::ZipError::UnsupportedArchive(what) => UploadError::Invalid(format!(
                "member {i} of the archive cannot be read: {what} (use stored or deflate compression, without encryption)"
            )),
            other => not_zip(&other),
        })?;
        let name = match std::str::from_utf8(entry.name_raw()) {
            Ok(n) => n.to_string(),
            Err(_) => {
                return invalid(format!(
                    "member {i} of the archive has a name that is not UTF-8"
                ))
            }
        };
        if entry.encrypted() {
            return invalid(format!("{name:?} is encrypted"));
        }
        let mode = entry.unix_mode();
        if let Some(kind) = mode.and_then(special_file_kind) {
            return invalid(format!(
                "{name:?} is {kind}; a Skill holds regular files and directories only"
            ));
        }
        if entry.is_symlink() {
            return invalid(format!(
                "{name:?} is a symbolic link; a Skill holds regular files and directories only"
            ));
        }
        let is_link = entry.extra_data_fields().any(|f| {
            matches!(f, zip::extra_fields::ExtraField::Custom(c)
                if c.header_id == PKWARE_UNIX_EXTRA_FIELD && c.data.len() > 12)
        });
        if is_link {
            return invalid(format!(
                "{name:?} is a hard or symbolic link (PKWARE Unix extra field); a Skill holds regular files and directories only"
            ));
        }
        let is_dir = entry.is_dir() || mode.is_some_and(is_directory_mode);
        let rest = tree.place(&name, is_dir)?;
        if is_dir {
            continue;
        }
        let left = tree.room(entry.size(), &name)?;
        let mut data = Vec::with_capacity(entry.size().min(left) as usize);
        (&mut entry)
            .take(left + 1)
            .read_to_end(&mut data)
            .map_err(|e| UploadError::Invalid(format!("{name:?} cannot be expanded: {e}")))?;
        if data.len() as u64 > left {
            return Err(UploadError::TooLarge(format!(
                "the archive's members expand to more than {} bytes (at {name:?})",
                limits::MAX_EXPANDED_BYTES
            )));
        }
        if data.len() as u64 != entry.size() {
            return invalid(format!(
                "{name:?} expands to {} bytes, not the {} its header declares",
                data.len(),
                entry.size()
            ));
        }
        tree.expanded += data.len() as u64;
        let executable = mode.is_some_and(|m| m & 0o111 != 0);
        tree.add_file(rest, data, executable);
    }
    let top = tree.top.clone().unwrap_or_default();
    if tree.files.is_empty() {
        return invalid("the archive holds no files");
    }
    Ok((top, tree.files.into_values().collect()))
}

fn finish(top: String, members: Vec<Member>) -> Result<BuiltVersion, UploadError> {
    let skill_md = members
        .iter()
        .find(|m| m.rest.len() == 1 && m.rest[0] == "SKILL.md")
        .ok_or_else(|| {
            UploadError::Invalid(format!(
                "no SKILL.md at the root of {top:?}: a Skill's top-level directory must hold a SKILL.md"
            ))
        })?;
    if skill_md.data.len() as u64 > limits::MAX_SKILL_MD_BYTES {
        return Err(UploadError::TooLarge(format!(
            "SKILL.md is {} bytes; at most {} are allowed",
            skill_md.data.len(),
            limits::MAX_SKILL_MD_BYTES
        )));
    }
    let text = std::str::from_utf8(&skill_md.data)
        .map_err(|_| UploadError::Invalid("SKILL.md is not UTF-8 text".into()))?;
    let fields = frontmatter::parse(text).map_err(UploadError::Invalid)?;
    let (name, title) = match fields.get("name").map(|n| n.trim()) {
        Some(n) if !n.is_empty() => {
            if !is_slug(n) {
                return invalid(format!(
                    "SKILL.md's name {n:?} is not a kebab-case slug (lowercase letters, digits and single hyphens, at most {} characters)",
                    limits::MAX_NAME_CHARS
                ));
            }
            (n.to_string(), n.to_string())
        }
        _ => {
            if !is_slug(&top) {
                return invalid(format!(
                    "SKILL.md gives no name, and the directory name {top:?} is not a kebab-case slug (lowercase letters, digits and single hyphens, at most {} characters): add `name:` to its frontmatter",
                    limits::MAX_NAME_CHARS
                ));
            }
            (top.clone(), top.clone())
        }
    };
    let description = fields
        .get("description")
        .map(|d| d.trim().to_string())
        .unwrap_or_default();
    if description.is_empty() {
        return invalid("SKILL.md's frontmatter must give a non-empty description: it tells the model when to use the Skill");
    }
    let chars = description.chars().count();
    if chars > limits::MAX_DESCRIPTION_CHARS {
        return invalid(format!(
            "SKILL.md's description is {chars} characters long; at most {} are allowed",
            limits::MAX_DESCRIPTION_CHARS
        ));
    }
    let file_count = members.len();
    let expanded_bytes = members.iter().map(|m| m.data.len() as u64).sum();
    let archive = write_archive(&name, &members)
        .map_err(|e| UploadError::Invalid(format!("could not write the archive: {e}")))?;
    if archive.len() as u64 > limits::MAX_ARCHIVE_BYTES {
        return Err(UploadError::TooLarge(format!(
            "the Skill's archive would be {} bytes; at most {} are allowed",
            archive.len(),
            limits::MAX_ARCHIVE_BYTES
        )));
    }
    let sha256 = hex::encode(Sha256::digest(&archive));
    Ok(BuiltVersion {
        name,
        description,
        title,
        archive,
        sha256,
        file_count,
        expanded_bytes,
    })
}

/// The archive Mango serves: members sorted by path under `<name>/`.
fn write_archive(name: &str, members: &[Member]) -> zip::result::ZipResult<Vec<u8>> {
    let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for member in members {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .last_modified_time(zip::DateTime::default())
            .unix_permissions(if member.executable { 0o755 } else { 0o644 });
        out.start_file(format!("{name}/{}", member.rest.join("/")), options)?;
        out.write_all(&member.data)?;
    }
    Ok(out.finish()?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, body: &str) -> UploadedFile {
        UploadedFile {
            filename: name.into(),
            bytes: bytes::Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    const SKILL: &str = "---\nname: pdf-tools\ndescription: Fill PDF forms.\n---\n# PDF\n";

    #[test]
    fn files_become_a_canonical_archive_under_the_name() {
        let built = build(vec![
            file("upload-dir/SKILL.md", SKILL),
            file("upload-dir/scripts/run.sh", "echo hi\n"),
        ])
        .unwrap();
        assert_eq!(built.name, "pdf-tools");
        assert_eq!(built.description, "Fill PDF forms.");
        assert_eq!(
            (built.file_count, built.expanded_bytes),
            (2, (SKILL.len() + 8) as u64)
        );
        let again = build(vec![
            file("upload-dir/scripts/run.sh", "echo hi\n"),
            file("upload-dir/SKILL.md", SKILL),
        ])
        .unwrap();
        assert_eq!(
            built.sha256, again.sha256,
            "the same files make the same bytes"
        );
        let mut zip = zip::ZipArchive::new(Cursor::new(built.archive)).unwrap();
        let names: Vec<String> = zip.file_names().map(|n| n.unwrap().to_string()).collect();
        assert_eq!(names, ["pdf-tools/SKILL.md", "pdf-tools/scripts/run.sh"]);
        assert_eq!(zip.by_index(1).unwrap().unix_mode().unwrap() & 0o777, 0o644);
    }

    #[test]
    fn the_directory_names_a_skill_without_a_frontmatter_name() {
        let built = build(vec![file(
            "my-skill/SKILL.md",
            "---\ndescription: d\n---\n",
        )])
        .unwrap();
        assert_eq!(built.name, "my-skill");
        let err = build(vec![file(
            "My Skill/SKILL.md",
            "---\ndescription: d\n---\n",
        )])
        .unwrap_err();
        assert!(matches!(err, UploadError::Invalid(m) if m.contains("not a kebab-case slug")));
    }

    #[test]
    fn uploads_that_break_a_rule_say_which() {
        for (files, says) in [
            (vec![], "files is required"),
            (vec![file("SKILL.md", SKILL)], "not inside a directory"),
            (vec![file("a/README.md", "x")], "no SKILL.md"),
            (
                vec![file("a/SKILL.md", SKILL), file("b/x", "x")],
                "one top-level directory",
            ),
            (vec![file("a/SKILL.md", SKILL), file("a/../x", "x")], ".."),
            (
                vec![file("a/SKILL.md", SKILL), file("/a/x", "x")],
                "absolute",
            ),
            (
                vec![
                    file("a/SKILL.md", SKILL),
                    file("a/x", "1"),
                    file("a/./x", "2"),
                ],
                "duplicate",
            ),
            (
                vec![
                    file("a/SKILL.md", SKILL),
                    file("a/x", "1"),
                    file("a/x/y", "2"),
                ],
                "both a file and a directory",
            ),
            (
                vec![file("a/SKILL.md", "no frontmatter")],
                "must start with YAML frontmatter",
            ),
            (
                vec![file("a/SKILL.md", "---\nname: a\n---\n")],
                "non-empty description",
            ),
            (
                vec![file("a/SKILL.md", "---\nname: A_B\ndescription: d\n---\n")],
                "not a kebab-case slug",
            ),
            (
                vec![file("a.zip", "not a zip")],
                "not a readable zip archive",
            ),
        ] {
            match build(files) {
                Err(UploadError::Invalid(m)) => assert!(m.contains(says), "{says}: {m}"),
                other => panic!("{says}: {other:?}"),
            }
        }
    }

    #[test]
    fn description_length_is_held_at_its_edge() {
        let at = |n: usize| {
            build(vec![file(
                "a/SKILL.md",
                &format!("---\ndescription: {}\n---\n", "d".repeat(n)),
            )])
        };
        assert!(at(limits::MAX_DESCRIPTION_CHARS).is_ok());
        assert!(
            matches!(at(limits::MAX_DESCRIPTION_CHARS + 1), Err(UploadError::Invalid(m)) if m.contains("at most 1024"))
        );
    }
}
