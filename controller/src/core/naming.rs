//! Names and labels of sandboxes, one definition for every launcher: a
//! sandbox's name derives from its Work id and claim, so one claim can
//! create one sandbox only, and its labels say which item it serves.

use crate::core::launcher::ItemIdentity;
use mango_protocol::WorkType;
use std::collections::BTreeMap;

pub const LABEL_WORK_ID: &str = "mango.dev/work-id";
pub const LABEL_SESSION_ID: &str = "mango.dev/session-id";
pub const LABEL_ENVIRONMENT_ID: &str = "mango.dev/environment-id";
pub const LABEL_WORK_TYPE: &str = "mango.dev/work-type";
pub const LABEL_POOL: &str = "mango.dev/pool";
pub const LABEL_CLAIM: &str = "mango.dev/claim";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// On a warm sandbox: the worker id of the supervisor that made it, the
/// only one that may bind it.
pub const LABEL_WARM_OWNER: &str = "mango.dev/warm-owner";
pub const MANAGED_BY: &str = "mango-worker";

/// `mango-<work id>-<claim>`, lower case with `-` for `_`: a valid Docker
/// container name and Kubernetes Pod name (DNS-1123).
pub fn sandbox_name(work_id: &str, claim: i64) -> String {
    let id: String = work_id
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    format!("mango-{id}-{claim}")
}

/// The labels of an item's sandbox in `pool`.
pub fn labels(item: &ItemIdentity, pool: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_WORK_ID.to_string(), item.work_id.clone()),
        (
            LABEL_ENVIRONMENT_ID.to_string(),
            item.environment_id.clone(),
        ),
        (
            LABEL_WORK_TYPE.to_string(),
            item.work_type.as_str().to_string(),
        ),
        (LABEL_POOL.to_string(), pool.to_string()),
        (LABEL_CLAIM.to_string(), item.claim.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ]);
    if let Some(session) = &item.session_id {
        labels.insert(LABEL_SESSION_ID.to_string(), session.clone());
    }
    labels
}

/// The item a sandbox's labels name; `None` when they name none.
pub fn item_of(labels: &BTreeMap<String, String>) -> Option<ItemIdentity> {
    Some(ItemIdentity {
        work_id: labels.get(LABEL_WORK_ID)?.clone(),
        claim: labels.get(LABEL_CLAIM)?.parse().ok()?,
        environment_id: labels.get(LABEL_ENVIRONMENT_ID)?.clone(),
        work_type: WorkType::parse(labels.get(LABEL_WORK_TYPE)?)?,
        session_id: labels.get(LABEL_SESSION_ID).cloned(),
    })
}

/// The runner's environment (spec §7): identity only, never a credential.
pub fn runner_env(item: &ItemIdentity, base_url: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("MANGO_BASE_URL".to_string(), base_url.to_string()),
        ("MANGO_WORK_ID".to_string(), item.work_id.clone()),
        (
            "MANGO_ENVIRONMENT_ID".to_string(),
            item.environment_id.clone(),
        ),
        (
            "MANGO_WORK_TYPE".to_string(),
            item.work_type.as_str().to_string(),
        ),
    ];
    if let Some(session) = &item.session_id {
        env.push(("MANGO_SESSION_ID".to_string(), session.clone()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(session: Option<&str>) -> ItemIdentity {
        ItemIdentity {
            work_id: "work_abc123".into(),
            claim: 3,
            environment_id: "env_x".into(),
            work_type: if session.is_some() {
                WorkType::Session
            } else {
                WorkType::Healthcheck
            },
            session_id: session.map(str::to_string),
        }
    }

    #[test]
    fn names_are_per_claim_and_dns_safe() {
        assert_eq!(sandbox_name("work_abc123", 3), "mango-work-abc123-3");
        assert_ne!(sandbox_name("work_abc", 1), sandbox_name("work_abc", 2));
        let name = sandbox_name("work_ABC_1", 12);
        assert!(name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
    }

    #[test]
    fn labels_name_the_item_and_read_back() {
        for session in [None, Some("sesn_1")] {
            let item = item(session);
            let labels = labels(&item, "default");
            assert_eq!(labels[LABEL_POOL], "default");
            assert_eq!(labels.contains_key(LABEL_SESSION_ID), session.is_some());
            assert_eq!(item_of(&labels), Some(item));
        }
        assert_eq!(item_of(&BTreeMap::new()), None);
    }

    #[test]
    fn the_runner_gets_its_identity_and_no_credential() {
        let env = runner_env(&item(Some("sesn_1")), "http://api:8080");
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "MANGO_BASE_URL",
                "MANGO_WORK_ID",
                "MANGO_ENVIRONMENT_ID",
                "MANGO_WORK_TYPE",
                "MANGO_SESSION_ID"
            ]
        );
        assert!(env.iter().all(|(_, v)| !v.contains("mango_")));
    }
}
