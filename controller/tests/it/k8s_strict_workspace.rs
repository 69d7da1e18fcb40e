//! Session workspaces against the strict fake API server over HTTP: the
//! PVC admitted as a real apiserver admits it, kept across activations
//! (the second Pod's runner reads the first's files from it), and swept
//! once its Session is deleted, which the apiserver completes only when no
//! Pod uses the claim any more (the PVC-protection finalizer). Ported from
//! the lenient fake's `k8s_kubelet.rs`.

use crate::k8s_strict_launcher::cluster_with;
use crate::support::{end_activation, turn, two_bash_turns};
use mango_controller::core::supervisor::RunEnd;
use mango_testkit::apiserver::Options;
use mango_testkit::{ScriptedModel, TestApp};
use serde_json::json;
use std::time::Duration;

fn pvc_of(session: &str) -> String {
    format!("mango-session-{}", session.replace('_', "-"))
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_sessions_second_activation_reads_its_first_files_from_the_admitted_pvc(
    db: sqlx::PgPool,
) {
    let model = ScriptedModel::start(two_bash_turns(
        "echo first > kept.txt && echo WROTE",
        "cat kept.txt",
    ))
    .await;
    let api = TestApp::start_with(
        db,
        mango_api::Settings {
            model_base_url: Some(model.base.clone()),
            ..Default::default()
        },
    )
    .await;
    let cluster = cluster_with(&api, Options::default(), |_| {}).await;
    let session =
        mango_testkit::turns::session_with_tools(&api, json!([{"type": "agent_toolset_20260401"}]))
            .await;
    let pvc = pvc_of(&session);
    turn(&api, &session, "write it", "WROTE", Duration::from_secs(60)).await;
    let stored = cluster
        .fake
        .object("persistentvolumeclaims", crate::k8s_strict::NS, &pvc)
        .expect("the Session's PVC was admitted");
    assert_eq!(
        stored["metadata"]["labels"]["mango.dev/session-id"],
        session
    );
    assert_eq!(stored["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    end_activation(&api, &session).await;
    crate::support::until(
        "the first Pod removed",
        Duration::from_secs(20),
        async || cluster.fake.pods().is_empty(),
    )
    .await;
    turn(&api, &session, "read it", "first", Duration::from_secs(60)).await;
    end_activation(&api, &session).await;
    assert_eq!(api.session_work(&session).await.len(), 2, "two activations");
    assert_eq!(
        cluster.fake.pvcs(),
        vec![pvc],
        "one PVC, kept across activations"
    );
    let pvc_creates = cluster
        .fake
        .requests()
        .iter()
        .filter(|(m, u)| m == "POST" && u.contains("persistentvolumeclaims"))
        .count();
    assert_eq!(pvc_creates, 1, "the second activation found its PVC");
    let attaches = cluster.attaches.lock().unwrap().clone();
    assert_eq!(attaches.len(), 2, "one attach per activation");
    assert_ne!(attaches[0].stdin, attaches[1].stdin, "each its own secret");
    for attached in &attaches {
        let secret = String::from_utf8_lossy(&attached.stdin).trim().to_string();
        assert!(secret.len() > 20, "a secret was delivered");
        assert!(
            !attached.manifest.to_string().contains(&secret),
            "the secret never reaches the Pod object"
        );
    }
    assert_eq!(cluster.running.shutdown().await, RunEnd::Shutdown);
    cluster.kubelet.abort();
    cluster.watch.abort();
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn a_deleted_sessions_pvc_is_swept_and_a_live_ones_stays(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let cluster = cluster_with(&api, Options::default(), |config| {
        config.workspace_sweep_every = Duration::from_millis(300);
    })
    .await;
    let (kept, _) = crate::support::queued_session(&api).await;
    let (doomed, _) = crate::support::queued_session(&api).await;
    crate::support::until("both PVCs", Duration::from_secs(30), async || {
        cluster.fake.pvcs().len() == 2
    })
    .await;
    end_activation(&api, &doomed).await;
    api.delete_session(&doomed).await;
    crate::support::until(
        "the deleted Session's PVC goes",
        Duration::from_secs(30),
        async || cluster.fake.pvcs() == vec![pvc_of(&kept)],
    )
    .await;
    let deletes: Vec<String> = cluster
        .fake
        .requests()
        .into_iter()
        .filter(|(m, u)| m == "DELETE" && u.contains("persistentvolumeclaims"))
        .map(|(_, u)| u)
        .collect();
    assert!(
        !deletes.is_empty()
            && deletes
                .iter()
                .all(|u| u.contains(&format!("persistentvolumeclaims/{}", pvc_of(&doomed)))),
        "only the deleted Session's PVC: {deletes:?}"
    );
    end_activation(&api, &kept).await;
    assert_eq!(cluster.running.shutdown().await, RunEnd::Shutdown);
    cluster.kubelet.abort();
    cluster.watch.abort();
}
