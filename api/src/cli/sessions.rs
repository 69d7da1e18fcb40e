//! `mango sessions list|get|events`.

use super::error::{Failure, OrFailure};
use super::events;
use super::print_json;
use super::table::{age, short, Table};
use clap::Subcommand;
use mango_client::Client;
use mango_protocol::events::{types, EventBody};
use mango_protocol::sessions::Session;
use mango_protocol::time::{self, Timestamp};
use mango_protocol::{Work, WorkState};
use std::collections::HashMap;

/// Sessions one page of the api's list holds at most.
const PAGE: u32 = 100;

#[derive(Subcommand)]
pub enum Command {
    /// List Sessions, newest first, with their live Work and last error.
    List {
        /// Sessions to show at most; pages are followed up to it (1..=10000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        /// Print the api's Session objects as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show one Session.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Print a Session's events, one line each; with --follow, keep
    /// printing new ones until the Session is idle (or Ctrl-C).
    Events {
        id: String,
        /// Follow the event stream until the Session goes idle or terminates.
        #[arg(long)]
        follow: bool,
        /// Print the api's event objects: a JSON array, or with --follow
        /// one JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(client: &Client, command: Command) -> Result<(), Failure> {
    match command {
        Command::List { limit, json } => {
            let (sessions, more) = list(client, limit as usize).await?;
            if json {
                print_json(&sessions)?;
            } else if sessions.is_empty() {
                println!("No Sessions.");
            } else {
                let live = live_work(client, &sessions).await?;
                let now = time::now();
                let mut t = Table::new(&[
                    "ID",
                    "STATUS",
                    "ENVIRONMENT",
                    "LIVE WORK",
                    "AGE",
                    "LAST ERROR",
                ]);
                for s in &sessions {
                    let error = last_error(client, &s.id).await?;
                    t.row(vec![
                        s.id.clone(),
                        s.status.to_string(),
                        s.environment_id.clone(),
                        live_cell(live.get(&s.id)),
                        age(s.created_at, now),
                        error.map_or("-".to_string(), |(_, e)| short(&e, 80)),
                    ]);
                }
                print!("{}", t.render());
            }
            if more {
                eprintln!("(more Sessions than --limit {limit}: raise --limit to see them)");
            }
            Ok(())
        }
        Command::Get { id, json } => {
            let session = client.session(&id).await.or_fail(client)?;
            if json {
                return print_json(&session);
            }
            let live = live_work(client, std::slice::from_ref(&session)).await?;
            let error = last_error(client, &session.id).await?;
            let now = time::now();
            let at = |t: Timestamp| format!("{} ({} ago)", time::format(&t), age(t, now));
            let mut t = Table::new(&["FIELD", "VALUE"]);
            for (field, value) in [
                ("id", session.id.clone()),
                ("status", session.status.to_string()),
                ("environment", session.environment_id.clone()),
                (
                    "agent",
                    format!("{} v{}", session.agent.id, session.agent.version),
                ),
                ("title", session.title.clone().unwrap_or_else(|| "-".into())),
                ("live work", live_cell(live.get(&session.id))),
                ("created", at(session.created_at)),
                ("updated", at(session.updated_at)),
                (
                    "last error",
                    error.map_or("-".to_string(), |(when, e)| {
                        format!(
                            "{} ({})",
                            short(&e, 200),
                            when.map_or("-".into(), |w| age(w, now) + " ago")
                        )
                    }),
                ),
            ] {
                t.row(vec![field.to_string(), value]);
            }
            print!("{}", t.render());
            Ok(())
        }
        Command::Events { id, follow, json } => events::tail(client, &id, follow, json).await,
    }
}

/// The newest `limit` Sessions, and whether there are more.
async fn list(client: &Client, limit: usize) -> Result<(Vec<Session>, bool), Failure> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let want = (limit - out.len()).min(PAGE as usize) as u32;
        let page = client
            .sessions_page(want, cursor.as_deref())
            .await
            .or_fail(client)?;
        out.extend(page.data);
        match page.next_page {
            Some(next) if out.len() < limit => cursor = Some(next),
            Some(_) => return Ok((out, true)),
            None => return Ok((out, false)),
        }
    }
}

/// Each Session's Work that has not stopped, read from its Environments'
/// Work lists.
async fn live_work(
    client: &Client,
    sessions: &[Session],
) -> Result<HashMap<String, Work>, Failure> {
    let mut environments: Vec<&str> = sessions.iter().map(|s| s.environment_id.as_str()).collect();
    environments.sort();
    environments.dedup();
    let mut live = HashMap::new();
    for environment in environments {
        for work in client.list_work(environment).await.or_fail(client)? {
            if work.state == WorkState::Stopped {
                continue;
            }
            if let Some(session) = work.data.session_id() {
                live.insert(session.to_string(), work);
            }
        }
    }
    Ok(live)
}

fn live_cell(work: Option<&Work>) -> String {
    work.map_or("-".to_string(), |w| format!("{} ({})", w.id, w.state))
}

/// The Session's newest `session.error`: when, and what it said.
async fn last_error(
    client: &Client,
    session_id: &str,
) -> Result<Option<(Option<Timestamp>, String)>, Failure> {
    let event = client
        .latest_event(session_id, types::SESSION_ERROR)
        .await
        .or_fail(client)?;
    Ok(event.and_then(|e| match &e.body {
        EventBody::SessionError(_) => Some((e.processed_at, events::summary(&e.body))),
        _ => None,
    }))
}
