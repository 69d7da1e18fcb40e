//! The host programs the supervisor runs for bounded workspaces and the
//! host fence (`iptables`, `mkfs.ext4`, `mount`, `umount`): found on `PATH`
//! or in the system directories, which a service's or a test's `PATH`
//! often leaves out.

use std::path::PathBuf;

const SYSTEM_DIRS: [&str; 5] = ["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The program `name`, as a command to run (the bare name when none is
/// found, so the error names it).
pub fn command(name: &str) -> tokio::process::Command {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    let mut command = tokio::process::Command::new(found.unwrap_or_else(|| name.into()));
    command.stdin(std::process::Stdio::null());
    command
}
