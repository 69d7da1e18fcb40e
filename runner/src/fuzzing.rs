//! Entry points for the fuzz targets under `fuzz/` and their corpus replay
//! (`tests/fuzz_corpus.rs`): each feeds arbitrary bytes to a parser that
//! reads input from outside the runner, and panics only when a promise of
//! that parser is broken. Not for production callers.

use crate::skills::archive::{self, Budget};
use crate::tools::bash;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The Work secret as the runner reads it from stdin: never a panic, a
/// token only from a well-formed secret, and what `encode` (the api's
/// `ids::encode_work_secret`, a dev-dependency here) makes of a token
/// decodes to the same token.
pub fn work_secret(data: &[u8], encode: fn(&str) -> String) {
    if let Ok(line) = crate::secret::read_line(data) {
        if let Ok(token) = crate::secret::sessions_token(&line) {
            assert!(!token.is_empty(), "an empty token was accepted");
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if !text.is_empty() {
            let secret = encode(text);
            assert_eq!(
                crate::secret::sessions_token(&secret).as_deref(),
                Ok(text),
                "an encoded Work secret did not decode to its token"
            );
        }
    }
}

/// The PTY framing's marker line, fed in chunks split at every 0xff byte:
/// never a panic, and a status only for the exact marker line.
pub fn pty_marker(data: &[u8]) {
    bash::fuzz_marker_line(data);
}

static EXTRACTIONS: AtomicU64 = AtomicU64::new(0);

/// A Skill archive expanded as a Session's runner does: never a panic, and
/// whatever it writes stays under the destination, regular files and
/// directories only, within the budget. True when it expanded.
pub fn skill_archive(data: &[u8]) -> bool {
    let n = EXTRACTIONS.fetch_add(1, Ordering::Relaxed);
    let scratch =
        std::env::temp_dir().join(format!("mango-fuzz-archive-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("a scratch directory");
    let zip = scratch.join("skill.zip");
    std::fs::write(&zip, data).expect("the archive written");
    let dest = scratch.join("out");
    let before = Budget {
        expanded_bytes: 64 * 1024,
        files: 16,
    };
    let mut budget = before;
    let file = std::fs::File::open(&zip).expect("the archive opened");
    let result = archive::extract(file, &dest, &mut budget);
    let outside: Vec<_> = std::fs::read_dir(&scratch)
        .expect("the scratch directory listed")
        .map(|e| e.expect("an entry").file_name())
        .filter(|name| name != "skill.zip" && name != "out")
        .collect();
    let written = walk(&dest);
    std::fs::remove_dir_all(&scratch).expect("the scratch directory removed");
    assert!(
        outside.is_empty(),
        "extraction wrote outside its destination: {outside:?}"
    );
    let (files, bytes) = written.expect("only regular files and directories were written");
    if result.is_ok() {
        assert!(budget.files <= before.files && budget.expanded_bytes <= before.expanded_bytes);
    }
    assert!(
        files <= before.files,
        "{files} files written, budget {}",
        before.files
    );
    assert!(
        bytes <= before.expanded_bytes,
        "{bytes} bytes written, budget {}",
        before.expanded_bytes
    );
    result.is_ok()
}

/// Files and bytes under `dir`; an error for anything but a regular file or
/// a directory (a link, a device, a FIFO).
fn walk(dir: &Path) -> Result<(u64, u64), String> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok((0, 0));
    };
    if meta.is_file() {
        return Ok((1, meta.len()));
    }
    if !meta.is_dir() {
        return Err(format!("{} is {:?}", dir.display(), meta.file_type()));
    }
    let mut total = (0, 0);
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let (files, bytes) = walk(&entry.map_err(|e| e.to_string())?.path())?;
        total = (total.0 + files, total.1 + bytes);
    }
    Ok(total)
}
