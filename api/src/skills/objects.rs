//! Where Skill archives live: an `object_store` store, a local folder by
//! default and S3-compatible by configuration (`MANGO_OBJECT_STORE`). The
//! database is the source of truth; an archive is written before its row
//! commits and deleted after its row is gone, so a reader never finds a row
//! without its archive (a crash between the two steps can only leave an
//! unreferenced archive behind).

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, PutPayload};
use std::sync::Arc;

/// The archive store of one api process (cheap to clone).
#[derive(Clone)]
pub struct Archives {
    store: Arc<dyn ObjectStore>,
    /// Said in logs and errors: the URL without any credential.
    location: String,
}

impl std::fmt::Debug for Archives {
    // The store's own Debug may show credentials (an S3 secret key).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archives")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// A store that could not be set up, with the reason (never a credential).
#[derive(Debug, thiserror::Error)]
#[error("object store {location}: {reason}")]
pub struct ConfigError {
    pub location: String,
    pub reason: String,
}

impl Archives {
    /// `spec`: `s3://bucket[/prefix]` (credentials, region and an
    /// S3-compatible endpoint from the usual `AWS_*` variables:
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`), or a local folder (a path or a
    /// `file://` URL), created if missing.
    pub fn open(spec: &str) -> Result<Archives, ConfigError> {
        let spec = spec.trim();
        if let Some(rest) = spec.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let location = format!("s3://{bucket}/{prefix}");
            let fail = |reason: String| ConfigError {
                location: location.clone(),
                reason,
            };
            if bucket.is_empty() {
                return Err(fail("the URL names no bucket (s3://bucket/prefix)".into()));
            }
            let s3 = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| fail(e.to_string()))?;
            let store: Arc<dyn ObjectStore> = match prefix.trim_matches('/') {
                "" => Arc::new(s3),
                p => Arc::new(PrefixStore::new(s3, p)),
            };
            return Ok(Archives { store, location });
        }
        let path = spec.strip_prefix("file://").unwrap_or(spec);
        Self::local(std::path::Path::new(path))
    }

    /// A local folder, created if missing.
    pub fn local(dir: &std::path::Path) -> Result<Archives, ConfigError> {
        let location = dir.display().to_string();
        let fail = |reason: String| ConfigError {
            location: location.clone(),
            reason,
        };
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create it: {e}")))?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| fail(e.to_string()))?
            .with_automatic_cleanup(true);
        Ok(Archives {
            store: Arc::new(fs),
            location,
        })
    }

    pub fn location(&self) -> &str {
        &self.location
    }

    /// The object key of a version's archive.
    pub fn key(workspace_id: &str, skill_id: &str, version_id: &str) -> String {
        format!("skills/{workspace_id}/{skill_id}/{version_id}.zip")
    }

    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> object_store::Result<()> {
        self.store
            .put(&ObjectPath::from(key), PutPayload::from(bytes))
            .await
            .map(|_| ())
    }

    pub async fn get(&self, key: &str) -> object_store::Result<Bytes> {
        self.store.get(&ObjectPath::from(key)).await?.bytes().await
    }

    /// Removes an archive; one already gone is not an error.
    pub async fn delete(&self, key: &str) -> object_store::Result<()> {
        match self.store.delete(&ObjectPath::from(key)).await {
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            other => other,
        }
    }

    /// Best-effort removals after the rows that named them are gone.
    pub async fn delete_all(&self, keys: &[String]) {
        for key in keys {
            if let Err(err) = self.delete(key).await {
                tracing::warn!(store = %self.location, %key, error = %err, "could not delete a Skill archive; it is no longer referenced");
            }
        }
    }
}

impl Default for Archives {
    /// A folder of this process under the system's temporary directory:
    /// for tests and embedding (`mango serve` always names its store).
    fn default() -> Archives {
        let dir = std::env::temp_dir().join(format!("mango-skill-archives-{}", std::process::id()));
        // Made on the first write, not here: a default that is replaced
        // (as `mango serve` replaces it) leaves no folder behind.
        let store = PrefixStore::new(
            object_store::local::LocalFileSystem::new(),
            dir.to_string_lossy().trim_start_matches('/'),
        );
        Archives {
            store: Arc::new(store),
            location: dir.display().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_folder_is_made_and_holds_archives() {
        let dir = std::env::temp_dir().join(format!("mango-objects-test-{}", std::process::id()));
        let nested = dir.join("a/b");
        let archives = Archives::open(&format!("file://{}", nested.display())).unwrap();
        assert!(nested.is_dir());
        let key = Archives::key("w", "s", "v");
        archives.put(&key, b"zip".to_vec()).await.unwrap();
        assert_eq!(&archives.get(&key).await.unwrap()[..], b"zip");
        archives.delete(&key).await.unwrap();
        archives.delete(&key).await.unwrap(); // already gone: fine
        assert!(archives.get(&key).await.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn s3_is_configured_from_the_url_and_aws_variables_and_never_shows_a_secret() {
        // No other test of this binary reads AWS_* variables.
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "very-secret-key-value");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ENDPOINT", "http://127.0.0.1:9");
        std::env::set_var("AWS_ALLOW_HTTP", "true");
        let archives = Archives::open("s3://mango-skills/prod/archives").unwrap();
        assert_eq!(archives.location(), "s3://mango-skills/prod/archives");
        let shown = format!("{archives:?}");
        assert!(!shown.contains("very-secret-key-value"), "{shown}");
        let err = Archives::open("s3://").unwrap_err();
        assert!(err.to_string().contains("names no bucket"), "{err}");
        assert!(!err.to_string().contains("very-secret"));
    }
}
