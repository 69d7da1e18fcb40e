//! Whether a sandbox image's runner can be kept (spec §7.1): a runner
//! built before kept sandboxes refuses `--keep-idle-seconds`, so a
//! container told to keep would never start. An image says its runner
//! takes the flag with a label, written by `scripts/sandbox-image.sh` (after
//! asking the runner's `--help`) and by `deployments/docker/Dockerfile`;
//! an image without it gets the containers of before, removed after each
//! activation, and one warning.

use std::collections::HashMap;
use std::sync::Mutex;

/// The image label that says its runner takes `--keep-idle-seconds`.
pub const LABEL_RUNNER_KEEPS: &str = "org.mango.sandbox.runner-keep-idle";

/// The one value of [`LABEL_RUNNER_KEEPS`] that says so.
pub const RUNNER_KEEPS: &str = "1";

/// Whether an image with `labels` has a runner that can be kept.
pub fn keeps_by_labels(labels: Option<&HashMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(LABEL_RUNNER_KEEPS))
        .is_some_and(|v| v == RUNNER_KEEPS)
}

/// What each image (by id: a rebuilt tag is another image) was found to
/// support; an image's labels never change, so each is read once.
#[derive(Default)]
pub struct RunnerImages {
    keeps: Mutex<HashMap<String, bool>>,
}

impl RunnerImages {
    /// The answer for image `id` if it was read before.
    pub fn known(&self, id: &str) -> Option<bool> {
        self.keeps.lock().expect("images lock").get(id).copied()
    }

    /// Records what image `id` (tagged `tag`) with `labels` supports, and
    /// says it once for an image whose runner cannot be kept.
    pub fn learn(&self, tag: &str, id: &str, labels: Option<&HashMap<String, String>>) -> bool {
        let keeps = keeps_by_labels(labels);
        let first = self
            .keeps
            .lock()
            .expect("images lock")
            .insert(id.to_string(), keeps)
            .is_none();
        if first && !keeps {
            tracing::warn!(image = %tag, image_id = %id, label = LABEL_RUNNER_KEEPS,
                "the sandbox image's runner predates kept sandboxes (no {LABEL_RUNNER_KEEPS}={RUNNER_KEEPS} label): \
                 its Session containers are removed after each activation; rebuild it with scripts/sandbox-image.sh \
                 (or deployments/docker/Dockerfile) to keep them");
        }
        keeps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_the_label_with_its_value_says_the_runner_keeps() {
        assert!(keeps_by_labels(Some(&labels(&[(LABEL_RUNNER_KEEPS, "1")]))));
        assert!(!keeps_by_labels(None), "no labels at all");
        assert!(!keeps_by_labels(Some(&labels(&[]))));
        assert!(!keeps_by_labels(Some(&labels(&[(LABEL_RUNNER_KEEPS, "")]))));
        assert!(!keeps_by_labels(Some(&labels(&[(
            LABEL_RUNNER_KEEPS,
            "0"
        )]))));
        assert!(!keeps_by_labels(Some(&labels(&[(
            "org.mango.sandbox.runner-sha256",
            "1"
        )]))));
    }

    #[test]
    fn each_image_is_read_once_by_its_id() {
        let images = RunnerImages::default();
        assert_eq!(images.known("sha256:a"), None);
        assert!(!images.learn("mango-sandbox:dev", "sha256:a", None));
        assert_eq!(images.known("sha256:a"), Some(false));
        let rebuilt = labels(&[(LABEL_RUNNER_KEEPS, "1")]);
        assert!(images.learn("mango-sandbox:dev", "sha256:b", Some(&rebuilt)));
        assert_eq!(images.known("sha256:b"), Some(true));
        assert_eq!(
            images.known("sha256:a"),
            Some(false),
            "the tag's older image keeps its answer"
        );
    }
}

#[cfg(test)]
mod keep_flag {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        docker: crate::docker::DockerArgs,
    }

    fn keep_of(args: &[&str]) -> Result<u64, clap::Error> {
        let argv = ["mango-worker", "--sandbox-base-url", "http://api:8080"];
        Cli::try_parse_from(argv.iter().chain(args)).map(|cli| cli.docker.keep_idle_seconds)
    }

    #[test]
    fn keeping_is_on_by_default_and_bounded_at_half_an_hour() {
        assert_eq!(
            keep_of(&[]).unwrap(),
            crate::core::config::KEEP_IDLE.as_secs()
        );
        assert_eq!(keep_of(&[]).unwrap(), 600);
        assert_eq!(keep_of(&["--keep-idle", "0"]).unwrap(), 0);
        assert_eq!(keep_of(&["--keep-idle", "1800"]).unwrap(), 1800);
        let refused = keep_of(&["--keep-idle", "1801"]).unwrap_err();
        assert!(refused.to_string().contains("1801"), "{refused}");
    }
}
