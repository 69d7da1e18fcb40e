//! The Docker kept case's image: the bench's sandbox image with one more
//! setting, `MANGO_IDLE_AFTER_END_TURN_SECONDS`, the runner's hidden knob
//! for how long it stays after an end-of-turn idle (60 s by default, spec
//! §8). A follow-up turn can only find its Session's sandbox kept after the
//! last activation's idle end, so with the default every kept sample would
//! wait a minute. The wait is between turns, before the follow-up is sent,
//! never inside a sample: the setting changes how soon the next sample can
//! start, not what it measures. Same layers, same runner, same command: a
//! commit that changes the image's environment only.

use bollard::models::{ContainerConfig, ContainerCreateBody};
use bollard::query_parameters::{
    CommitContainerOptions, CreateContainerOptions, RemoveContainerOptions, RemoveImageOptions,
};
use bollard::Docker;

/// How long the kept case's runners stay after an end-of-turn idle.
pub const IDLE_AFTER_END_TURN_SECONDS: u64 = 2;

/// The repository of the derived image; its tag is the bench's pid, so a
/// run never removes another's.
const REPO: &str = "mango-sandbox-bench-kept";

/// The runner's setting, as an image's environment entry.
fn idle_setting() -> String {
    format!("MANGO_IDLE_AFTER_END_TURN_SECONDS={IDLE_AFTER_END_TURN_SECONDS}")
}

/// `image` with the shortened idle end, committed as a new tag.
pub async fn derive(docker: &Docker, image: &str) -> anyhow::Result<String> {
    let tag = format!("idle{IDLE_AFTER_END_TURN_SECONDS}-{}", std::process::id());
    let holder = format!("mango-bench-kept-image-{}", std::process::id());
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(holder),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(image.to_string()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("a container of {image} to commit: {e}"))?;
    // The engine merges this into the container's config: the image's
    // other variables, its user, command and labels are kept.
    let committed = docker
        .commit_container(
            CommitContainerOptions {
                container: Some(created.id.clone()),
                repo: Some(REPO.into()),
                tag: Some(tag.clone()),
                pause: false,
                ..Default::default()
            },
            ContainerConfig {
                env: Some(vec![idle_setting()]),
                ..Default::default()
            },
        )
        .await;
    let removed = docker
        .remove_container(&created.id, None::<RemoveContainerOptions>)
        .await;
    committed.map_err(|e| anyhow::anyhow!("committing {REPO}:{tag}: {e}"))?;
    removed.map_err(|e| anyhow::anyhow!("removing the commit's container: {e}"))?;
    let derived = format!("{REPO}:{tag}");
    check(docker, &derived).await?;
    Ok(derived)
}

/// The derived image has the setting, and the base's command still.
async fn check(docker: &Docker, derived: &str) -> anyhow::Result<()> {
    let inspected = docker
        .inspect_image(derived)
        .await
        .map_err(|e| anyhow::anyhow!("inspecting {derived}: {e}"))?;
    let config = inspected.config.unwrap_or_default();
    let env = config.env.unwrap_or_default();
    anyhow::ensure!(
        env.contains(&idle_setting()),
        "{derived} lacks {}: {env:?}",
        idle_setting()
    );
    anyhow::ensure!(
        env.iter().any(|e| e.starts_with("PATH=")),
        "{derived} lost its base's environment: {env:?}"
    );
    Ok(())
}

/// Removes the derived image (its layers are the base's).
pub async fn remove(docker: &Docker, derived: &str) {
    if let Err(err) = docker
        .remove_image(derived, None::<RemoveImageOptions>, None)
        .await
    {
        println!("ttfi: could not remove {derived}: {err}");
    }
}
