//! Input: the shell's script is an in-memory file the runner appends to, so
//! bash reads it in blocks (bash reads a pipe one byte per `read`, so as not
//! to take input meant for its children: a call's line cost as many reads
//! as it had bytes, and long commands needed a file of their own). The shell
//! opens it as `/proc/self/fd/98` and reads it on a close-on-exec descriptor
//! of its own, closing the one it inherited, so commands neither see it nor
//! need their stdin moved off it: redirecting the descriptor bash reads
//! from makes it save and re-sync its input around every call, a third of
//! its work per call. (bash then names the script in its own error
//! messages: `/proc/self/fd/98: line 7: nope: command not found`; `$0` is
//! still the shell's path.) Where /proc is not mounted the file is the
//! shell's stdin and each call redirects stdin from /dev/null instead
//! ([`ScriptInput`]). A file read to its end would end the shell, so the
//! shell waits after each call for one byte on its framing socket (fd 99):
//! the runner appends the next line, then sends the byte. What the shell has
//! read is handed back to the kernel as it goes (the file's offsets stay,
//! its memory does not).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use rustix::fs::{FallocateFlags, MemfdFlags, Mode, OFlags};
use rustix::io::Errno;

use super::framing::{marker_function, single_quoted, WAIT_FOR_NEXT};

/// Where the shell finds its script when it starts (see [`ScriptInput`]).
pub(super) const SCRIPT_FD: RawFd = 98;
/// bash reads a seekable input in blocks of at most this many bytes, and
/// sizes its buffer from the input's size when it starts.
const SCRIPT_BUFFER: usize = 8192;
/// How much read script is left in memory before it is handed back.
const SCRIPT_FREE_EVERY: u64 = 64 * 1024;

/// How the shell reads its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ScriptInput {
    /// As its script, opened through /proc on a close-on-exec descriptor of
    /// its own, with /dev/null as stdin for good.
    Path,
    /// As its stdin, where /proc is not mounted: each call moves the
    /// command's stdin to /dev/null.
    Stdin,
}

impl ScriptInput {
    /// [`ScriptInput::Path`] when this process can open `script` again
    /// through /proc/self/fd (the shell, in the same mount namespace and
    /// with the same credentials, then can too).
    fn for_script(script: &OwnedFd) -> ScriptInput {
        let path = format!("/proc/self/fd/{}", script.as_raw_fd());
        match std::fs::File::open(path) {
            Ok(_) => ScriptInput::Path,
            Err(_) => ScriptInput::Stdin,
        }
    }

    /// What each call's command is run with besides hiding fd 99.
    pub(super) fn call_redirection(self) -> &'static str {
        match self {
            ScriptInput::Path => "",
            ScriptInput::Stdin => " </dev/null",
        }
    }
}

/// The shell's input: a file with no name the runner appends each call's
/// line to.
pub(super) struct Script {
    file: OwnedFd,
    input: ScriptInput,
    /// Where the next line goes.
    end: u64,
    /// Up to where the script has been handed back to the kernel.
    freed: u64,
}

impl Script {
    /// A fresh input, read by path where /proc allows it.
    pub(super) fn new() -> io::Result<Script> {
        let file = script_file()?;
        let input = ScriptInput::for_script(&file);
        Ok(Script::reading(file, input))
    }

    /// `file` (empty) as the input, read the given way.
    pub(super) fn reading(file: OwnedFd, input: ScriptInput) -> Script {
        Script {
            file,
            input,
            end: 0,
            freed: 0,
        }
    }

    pub(super) fn input(&self) -> ScriptInput {
        self.input
    }

    /// The file itself, for the shell to inherit.
    pub(super) fn file(&self) -> &OwnedFd {
        &self.file
    }

    /// Writes what the shell reads first, for a shell started as `program`.
    pub(super) fn start(&mut self, program: &str) -> io::Result<()> {
        self.end = write_at(&self.file, 0, prologue(self.input, program).as_bytes())?;
        Ok(())
    }

    /// Appends one call's line (the shell reads it once released).
    pub(super) fn append(&mut self, line: &str) -> io::Result<()> {
        if self.end - self.freed >= SCRIPT_FREE_EVERY {
            // Everything before the end has been read: the shell waits at
            // the end of the previous line. Offsets stay; memory goes.
            let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            if rustix::fs::fallocate(&self.file, punch, 0, self.end).is_ok() {
                self.freed = self.end;
            }
        }
        self.end = write_at(&self.file, self.end, line.as_bytes())?;
        Ok(())
    }
}

/// An anonymous in-memory file, or where that is not allowed an unnamed file
/// in the temporary directory (close-on-exec; the shell gets its own copy).
/// Nothing of it is ever on a path.
pub(super) fn script_file() -> io::Result<OwnedFd> {
    match rustix::fs::memfd_create(c"mango-bash-input", MemfdFlags::CLOEXEC) {
        Ok(memfd) => Ok(memfd),
        Err(_) => unnamed_temp_file(&std::env::temp_dir()),
    }
}

/// A file in `dir` that has no name (`O_TMPFILE`), close-on-exec.
fn unnamed_temp_file(dir: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        dir,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?)
}

/// Writes all of `data` at `offset`; returns the offset after it.
fn write_at(fd: &OwnedFd, mut offset: u64, mut data: &[u8]) -> io::Result<u64> {
    while !data.is_empty() {
        match rustix::io::pwrite(fd, data, offset) {
            Ok(n) => {
                data = &data[n..];
                offset += n as u64;
            }
            Err(Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(offset)
}

/// What the shell reads first: when it reads a script by path, the closing
/// of the descriptor it found it on and `$0` as if it read stdin; the
/// read-only framing function; padding that makes bash size its input
/// buffer to the maximum (it sizes it from the file's size when it starts);
/// and the first wait for a call.
fn prologue(input: ScriptInput, program: &str) -> String {
    let mut head = match input {
        ScriptInput::Path => format!(
            "exec {SCRIPT_FD}<&-; BASH_ARGV0={}\n",
            single_quoted(program)
        ),
        ScriptInput::Stdin => String::new(),
    };
    head.push_str(&marker_function());
    let padding = "#".repeat(SCRIPT_BUFFER.saturating_sub(head.len()));
    format!("{head}{padding}\n{WAIT_FOR_NEXT}\n")
}

#[cfg(test)]
mod tests {
    use super::{script_file, unnamed_temp_file, write_at, Script, ScriptInput};

    /// Once 64 KiB of script have been read, the next call's line hands them
    /// back to the kernel: offsets stay, memory goes.
    #[test]
    fn read_script_is_handed_back_as_lines_are_appended() {
        let mut script = Script::reading(script_file().unwrap(), ScriptInput::Path);
        script.start("/bin/bash").unwrap();
        let long = format!("{}\n", "x".repeat(70 * 1024));
        script.append(&long).unwrap();
        let read_up_to = script.end;
        assert_eq!(script.freed, 0);
        script.append("true\n").unwrap();
        assert_eq!(script.freed, read_up_to);
        assert_eq!(script.end, read_up_to + 5);
        let stat = rustix::fs::fstat(script.file()).unwrap();
        assert_eq!(stat.st_size as u64, script.end);
        assert!(
            stat.st_blocks * 512 < 16 * 1024,
            "{} blocks",
            stat.st_blocks
        );
    }

    /// The fallback input, where memfd_create is not allowed: a file with no
    /// name that takes appends at any offset and can be read back.
    #[test]
    fn the_fallback_input_file_has_no_name_and_takes_appends() {
        let dir = tempfile::tempdir().unwrap();
        let fd = unnamed_temp_file(dir.path()).unwrap();
        let end = write_at(&fd, 0, b"first\n").unwrap();
        let end = write_at(&fd, end, b"second\n").unwrap();
        assert_eq!(end, 13);
        let mut buf = [0u8; 32];
        let n = rustix::io::pread(&fd, &mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"first\nsecond\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
