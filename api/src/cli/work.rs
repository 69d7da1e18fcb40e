//! `mango work list|get|stop`.

use super::error::{Failure, OrFailure};
use super::print_json;
use super::table::{age, short, span, Table};
use clap::Subcommand;
use mango_client::Client;
use mango_protocol::time::{self, Timestamp};
use mango_protocol::{Work, WorkState};

/// Items one page of the api's Work list holds at most.
const PAGE: u32 = 100;

#[derive(Subcommand)]
pub enum Command {
    /// List Work, newest first: one Environment's, or every Environment's.
    List {
        /// Only this Environment's Work (default: every Environment).
        #[arg(long)]
        environment: Option<String>,
        /// Only Work in this state (queued, starting, active, stopping, stopped).
        #[arg(long, value_parser = parse_state)]
        state: Option<WorkState>,
        /// Items to show at most; pages are followed up to it (1..=10000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        /// Print the api's Work objects as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show one Work item.
    Get {
        id: String,
        /// Its Environment (default: found among every Environment).
        #[arg(long)]
        environment: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Stop a Work item: gracefully (its runner is asked to finish), or at
    /// once with --force.
    Stop {
        id: String,
        #[arg(long)]
        environment: Option<String>,
        /// Stop at once rather than asking the runner to finish.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
}

fn parse_state(text: &str) -> Result<WorkState, String> {
    WorkState::parse(text).ok_or_else(|| {
        let names: Vec<&str> = <WorkState as mango_protocol::WireEnum>::ALL
            .iter()
            .map(|s| s.as_str())
            .collect();
        format!("{text:?} is not a Work state (one of {})", names.join(", "))
    })
}

pub async fn run(client: &Client, command: Command) -> Result<(), Failure> {
    match command {
        Command::List {
            environment,
            state,
            limit,
            json,
        } => {
            let environments = match environment {
                Some(id) => vec![id],
                None => super::environments::ids(client).await?,
            };
            let listed = list(client, &environments, state, limit as usize).await?;
            if json {
                print_json(&listed.items)?;
            } else if listed.items.is_empty() {
                println!(
                    "No Work{}.",
                    state.map_or(String::new(), |s| format!(" in state {s}"))
                );
            } else {
                print!(
                    "{}",
                    table(&listed.items, environments.len() > 1, time::now())
                );
            }
            if listed.more {
                // On stderr, so `--json`'s stdout stays one JSON document.
                eprintln!("(more Work than --limit {limit}: raise --limit to see it)");
            }
            Ok(())
        }
        Command::Get {
            id,
            environment,
            json,
        } => {
            let work = find(client, &id, environment.as_deref()).await?;
            if json {
                return print_json(&work);
            }
            print!("{}", details(&work, time::now()));
            Ok(())
        }
        Command::Stop {
            id,
            environment,
            force,
            json,
        } => {
            let work = find(client, &id, environment.as_deref()).await?;
            let stopped_now = client
                .stop(&work.environment_id, &work.id, force)
                .await
                .or_fail(client)?;
            let after = client
                .work(&work.environment_id, &work.id)
                .await
                .or_fail(client)?;
            if json {
                return print_json(&after);
            }
            if stopped_now {
                println!("Stop requested for {}: now {}.", after.id, after.state);
            } else {
                println!("{} was already stopped.", after.id);
            }
            Ok(())
        }
    }
}

/// What a list found: up to the limit, and whether there was more.
pub struct Listed {
    pub items: Vec<Work>,
    pub more: bool,
}

/// The newest `limit` items (in `state`, if given) of the Environments,
/// following each one's pages until it has `limit` of them or none are left.
pub async fn list(
    client: &Client,
    environments: &[String],
    state: Option<WorkState>,
    limit: usize,
) -> Result<Listed, Failure> {
    let mut items = Vec::new();
    let mut more = false;
    for environment in environments {
        let mut found = 0;
        let mut cursor: Option<String> = None;
        loop {
            let page = client
                .work_page(environment, PAGE, cursor.as_deref())
                .await
                .or_fail(client)?;
            let mut data = page
                .data
                .into_iter()
                .filter(|w| state.is_none_or(|s| w.state == s));
            for work in data.by_ref() {
                if found == limit {
                    more = true;
                    break;
                }
                items.push(work);
                found += 1;
            }
            match page.next_page {
                Some(next) if found < limit => cursor = Some(next),
                // A full tally with pages left may still have more to show.
                Some(_) => {
                    more = true;
                    break;
                }
                None => break,
            }
        }
    }
    // Each Environment's newest `limit` hold the newest `limit` of all.
    items.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
    if items.len() > limit {
        items.truncate(limit);
        more = true;
    }
    Ok(Listed { items, more })
}

/// The Work item `id`, in `environment` or searched for in every Environment.
pub async fn find(client: &Client, id: &str, environment: Option<&str>) -> Result<Work, Failure> {
    if let Some(environment) = environment {
        return client.work(environment, id).await.or_fail(client);
    }
    for environment in super::environments::ids(client).await? {
        match client.work(&environment, id).await {
            Ok(work) => return Ok(work),
            Err(e) if e.status().is_some_and(|s| s.as_u16() == 404) => continue,
            Err(e) => return Err(Failure::from_client(e, client.base_url())),
        }
    }
    Err(Failure::not_found(format!(
        "no Work {id} in any Environment"
    )))
}

fn work_type(work: &Work) -> &'static str {
    work.data.work_type().as_str()
}

fn result(work: &Work) -> String {
    work.result.as_ref().map_or_else(
        || "-".to_string(),
        |r| format!("{}: {}", r.status, short(&r.message, 60)),
    )
}

/// The claim number, `-` while nobody has claimed the item.
fn claim(work: &Work) -> String {
    match &work.lease {
        Some(lease) if lease.claim > 0 => lease.claim.to_string(),
        _ => "-".to_string(),
    }
}

/// The worker id the claim's poller sent, `-` when there is none.
fn worker(work: &Work) -> String {
    work.lease
        .as_ref()
        .and_then(|l| l.worker_id.as_deref())
        .map_or_else(|| "-".to_string(), |w| short(w, 40))
}

/// The lease's time left as the api counted it (not this machine's clock):
/// rounded up, so `0s` never shows a lease that still runs; `expired` once
/// it ran out, `-` with no lease running.
fn lease_left(work: &Work) -> String {
    match work.lease.as_ref().and_then(|l| l.remaining_ms) {
        None => "-".to_string(),
        Some(0) => "expired".to_string(),
        Some(ms) => span((ms + 999) / 1000),
    }
}

fn lease_expires(work: &Work) -> String {
    work.lease
        .as_ref()
        .and_then(|l| l.expires_at)
        .map_or_else(|| "-".to_string(), |t| time::format(&t))
}

fn table(items: &[Work], with_environment: bool, now: Timestamp) -> String {
    let mut header = vec![
        "ID",
        "TYPE",
        "SESSION",
        "STATE",
        "AGE",
        "CLAIM",
        "WORKER",
        "LEASE LEFT",
        "RESULT",
    ];
    if with_environment {
        header.insert(1, "ENVIRONMENT");
    }
    let mut t = Table::new(&header);
    for w in items {
        let mut row = vec![
            w.id.clone(),
            work_type(w).to_string(),
            w.data.session_id().unwrap_or("-").to_string(),
            w.state.to_string(),
            age(w.created_at, now),
            claim(w),
            worker(w),
            lease_left(w),
            result(w),
        ];
        if with_environment {
            row.insert(1, w.environment_id.clone());
        }
        t.row(row);
    }
    t.render()
}

fn details(w: &Work, now: Timestamp) -> String {
    let at = |t: Option<Timestamp>| {
        t.map_or_else(
            || "-".to_string(),
            |t| format!("{} ({} ago)", time::format(&t), age(t, now)),
        )
    };
    let mut t = Table::new(&["FIELD", "VALUE"]);
    for (field, value) in [
        ("id", w.id.clone()),
        ("environment", w.environment_id.clone()),
        ("type", work_type(w).to_string()),
        ("session", w.data.session_id().unwrap_or("-").to_string()),
        ("state", w.state.to_string()),
        ("created", at(Some(w.created_at))),
        ("acknowledged", at(w.acknowledged_at)),
        ("started", at(w.started_at)),
        ("last heartbeat", at(w.latest_heartbeat_at)),
        ("claim", claim(w)),
        ("worker", worker(w)),
        ("lease expires", lease_expires(w)),
        ("lease left", lease_left(w)),
        ("stop requested", at(w.stop_requested_at)),
        ("stopped", at(w.stopped_at)),
        ("result", result(w)),
    ] {
        t.row(vec![field.to_string(), value]);
    }
    t.render()
}
