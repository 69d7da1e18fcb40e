//! Leader election with two candidates against the strict fake API
//! server over HTTP: the Lease taken by server-side apply (a second
//! manager's apply of another holder conflicts there, as on a cluster),
//! renewed and released by strategic merge patches; one operator at a
//! time, and the standby takes over when the leader goes.

use crate::k8s_strict::{self, NS};
use crate::k8s_strict_operator::settings;
use mango_controller::kubernetes::leader::{self, Leadership};
use mango_controller::kubernetes::operator::Context;
use mango_testkit::apiserver::{ApiServer, Options};
use mango_testkit::TestApp;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "mango-controller";

fn holder(fake: &ApiServer) -> Option<String> {
    fake.object("leases", NS, LEASE)?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_string)
}

fn supervises(ctx: &Context) -> bool {
    ctx.render_metrics().contains("pool=\"builders\"")
}

#[sqlx::test(migrator = "mango_api::MIGRATOR")]
async fn one_of_two_candidates_leads_and_the_other_takes_over_when_it_goes(db: sqlx::PgPool) {
    let api = TestApp::start(db).await;
    let fake = k8s_strict::fake_with(Options::default()).await;
    k8s_strict::make_pool(&fake, &api, "builders", &api.env_key);
    let mut candidates = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let ctx: Arc<Context> =
            Context::new(k8s_strict::client(&fake).await, settings(&api, identity));
        let stop = CancellationToken::new();
        let task = tokio::spawn(leader::run(
            ctx.clone(),
            Leadership::Lease {
                name: LEASE.into(),
                identity: identity.into(),
            },
            stop.clone(),
        ));
        candidates.push((identity, ctx, stop, task));
    }
    crate::support::until("a leader", Duration::from_secs(30), async || {
        holder(&fake).is_some()
    })
    .await;
    let leader = holder(&fake).unwrap();
    let (lead, standby): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|c| c.0 == leader);
    let (lead, standby) = (
        lead.into_iter().next().unwrap(),
        standby.into_iter().next().unwrap(),
    );
    crate::support::until(
        "the leader's operator runs the pool",
        Duration::from_secs(30),
        async || supervises(&lead.1),
    )
    .await;
    // A while later: still one leader, and only its operator runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(holder(&fake).as_deref(), Some(lead.0));
    assert!(!supervises(&standby.1), "the standby runs no supervisor");

    lead.2.cancel();
    tokio::time::timeout(Duration::from_secs(30), lead.3)
        .await
        .unwrap()
        .unwrap();
    crate::support::until("the standby leads", Duration::from_secs(40), async || {
        holder(&fake).as_deref() == Some(standby.0)
    })
    .await;
    crate::support::until(
        "the standby's operator runs the pool",
        Duration::from_secs(30),
        async || supervises(&standby.1),
    )
    .await;
    assert!(!supervises(&lead.1), "the old leader detached");
    standby.2.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), standby.3).await;
}
