//! The agent loop (spec §6): for each Session with a pending outbox row,
//! decide the next step from its events ([`turn::next`]), call the model
//! endpoint, and commit the reply's events. Durable by construction:
//! * one step per Session at a time across replicas (advisory lock);
//! * `span.model_request_start` is appended before the call and the reply's
//!   events plus `span.model_request_end` commit together, so after a restart
//!   an open request is resumed and a stored reply is never requested again.

use crate::admission::emit;
use crate::context::ApiContext;
use crate::error::ApiError;
use crate::ids;
use crate::lease::{Kind, Lease};
use crate::store::sessions::{self, EventFilter};
use crate::store::work::{self, NewWork};
use crate::turn::{self, AgentTools, Next};
use mango_protocol::time;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Retries of an overloaded or rate-limited model call before giving up.
const MODEL_RETRIES: u32 = 3;

/// A Messages-API-compatible endpoint. The key is a secret: it is sent as
/// `x-api-key` and appears nowhere else (not in events, logs or Debug).
pub struct ModelEndpoint {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
    pub max_tokens: u32,
    pub backoff: Duration,
}

impl std::fmt::Debug for ModelEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEndpoint")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelFailure {
    /// `session.error` type: model_overloaded_error, model_rate_limited_error, model_request_failed_error.
    pub kind: &'static str,
    pub message: String,
    pub retryable: bool,
}

impl ModelEndpoint {
    pub fn new(base: &str, key: Option<String>) -> ModelEndpoint {
        ModelEndpoint {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(600))
                // The key travels in x-api-key, which a redirect would carry to another host.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("a plain HTTP client builds"),
            base: base.trim_end_matches('/').to_string(),
            key,
            max_tokens: 4096,
            backoff: Duration::from_secs(1),
        }
    }

    pub async fn messages(&self, body: &Value) -> Result<Value, ModelFailure> {
        let mut req = self
            .http
            .post(format!("{}/v1/messages", self.base))
            .header("anthropic-version", "2023-06-01")
            .json(body);
        if let Some(key) = &self.key {
            req = req.header("x-api-key", key);
        }
        let resp = req.send().await.map_err(|e| ModelFailure {
            kind: "model_request_failed_error",
            message: format!(
                "the model endpoint is unreachable ({})",
                if e.is_timeout() {
                    "timed out"
                } else {
                    "connection failed"
                }
            ),
            retryable: true,
        })?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if status.is_success() {
            return serde_json::from_str(&text).map_err(|_| ModelFailure {
                kind: "model_request_failed_error",
                message: "the model endpoint answered with something that is not JSON".into(),
                retryable: false,
            });
        }
        let detail: String = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        let (kind, retryable) = match status.as_u16() {
            429 => ("model_rate_limited_error", true),
            529 | 503 => ("model_overloaded_error", true),
            500..=599 => ("model_request_failed_error", true),
            _ => ("model_request_failed_error", false),
        };
        Err(ModelFailure {
            kind,
            message: format!("the model endpoint answered {status}: {detail}"),
            retryable,
        })
    }
}

/// Runs the loop until the process exits.
pub async fn run(ctx: ApiContext, model: Arc<ModelEndpoint>) {
    // Sessions advance side by side: one slow model call must not hold up the
    // others. The advisory lock keeps each Session to one step at a time
    // across replicas; `driving` avoids re-spawning one already in hand here.
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_SESSIONS));
    let driving: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
    loop {
        let notified = ctx.agent_wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match sqlx::query_as::<_, (String,)>("SELECT DISTINCT session_id FROM outbox LIMIT 100")
            .fetch_all(&ctx.db)
            .await
        {
            Ok(sessions) => {
                for (session_id,) in sessions {
                    if !driving
                        .lock()
                        .expect("driving lock")
                        .insert(session_id.clone())
                    {
                        continue;
                    }
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (ctx, model, driving) = (ctx.clone(), model.clone(), driving.clone());
                    tokio::spawn(async move {
                        let stepped = match drive(&ctx, &model, &session_id).await {
                            Ok(stepped) => stepped,
                            Err(err) => {
                                tracing::warn!(session_id, error = %err.message, "agent loop step failed");
                                true
                            }
                        };
                        driving.lock().expect("driving lock").remove(&session_id);
                        drop(slot);
                        // A step may have left more to do (new input arrived
                        // meanwhile). A Session another process is stepping is
                        // looked at again on the next round, not at once.
                        if stepped {
                            ctx.agent_wake.notify_waiters();
                        }
                    });
                }
            }
            Err(err) => tracing::warn!(error = %err, "agent loop could not read the outbox"),
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
    }
}

/// Sessions one api process advances at once.
const CONCURRENT_SESSIONS: usize = 32;

/// Advances one Session as far as it can go without new input. `false`: another
/// process is stepping it.
pub async fn drive(
    ctx: &ApiContext,
    model: &ModelEndpoint,
    session_id: &str,
) -> Result<bool, ApiError> {
    // Held on this connection for the whole step; released on return or when
    // the connection dies with the process.
    let mut lock = ctx.db.acquire().await?;
    let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock(hashtextextended($1, 77))")
        .bind(session_id)
        .fetch_one(&mut *lock)
        .await?;
    if !got {
        return Ok(false);
    }
    let outcome = step_until_waiting(ctx, model, session_id).await;
    let _ = sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 77))")
        .bind(session_id)
        .execute(&mut *lock)
        .await;
    outcome.map(|()| true)
}

async fn step_until_waiting(
    ctx: &ApiContext,
    model: &ModelEndpoint,
    session_id: &str,
) -> Result<(), ApiError> {
    let mut failures = 0;
    loop {
        let Some(session) = sessions::find(&ctx.db, None, session_id).await? else {
            // Deleted: its rows went with it, unless one slipped in meanwhile.
            forget_wakeups(&ctx.db, session_id).await?;
            return Ok(());
        };
        let events = all_events(ctx, session_id).await?;
        match turn::next(&events) {
            Next::Wait => {
                // One transaction, in the order a Session's deletion takes the
                // same rows (the Session, then its wake-ups), so the two cannot
                // deadlock. Wake-ups are deleted up to the log head read above
                // (later input keeps its row) before the activation check: a
                // Work that stops meanwhile is either seen stopped by the
                // check, or its wake-up row commits after the delete and
                // brings the loop back.
                let mut tx = ctx.db.begin().await?;
                let exists: Option<(i32,)> =
                    sqlx::query_as("SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE")
                        .bind(session_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                if exists.is_none() {
                    drop(tx);
                    forget_wakeups(&ctx.db, session_id).await?;
                    return Ok(());
                }
                sqlx::query("DELETE FROM outbox WHERE session_id = $1 AND last_seq <= $2")
                    .bind(session_id)
                    .bind(session.last_seq)
                    .execute(&mut *tx)
                    .await?;
                // Calls a worker could run, but no Work to run them (it stopped
                // meanwhile): start a new activation.
                if !turn::runnable_worker_calls(&events).is_empty() {
                    let ttl = ctx.settings.default_ttl_seconds;
                    ensure_activation(&mut tx, ttl, &session.environment_id, session_id).await?;
                }
                tx.commit().await?;
                return Ok(());
            }
            Next::EndTurn => {
                emit(
                    ctx,
                    session_id,
                    vec![
                        json!({"type": "session.status_idle", "stop_reason": {"type": "end_turn"}}),
                    ],
                )
                .await?;
            }
            Next::CallModel { open_request } => {
                let start_id = match open_request {
                    Some(id) => id,
                    None => {
                        let mut opening = Vec::new();
                        if session.status != "running" {
                            opening.push(json!({"type": "session.status_running"}));
                        }
                        opening.push(json!({"type": "span.model_request_start"}));
                        let stored = emit(ctx, session_id, opening).await?;
                        stored
                            .last()
                            .and_then(|e| e["id"].as_str())
                            .unwrap_or_default()
                            .to_string()
                    }
                };
                let body = turn::request(&session.agent, &events, model.max_tokens);
                match model.messages(&body).await {
                    Ok(reply) => {
                        commit_reply(ctx, session_id, &start_id, &session.agent, &reply).await?;
                        failures = 0;
                    }
                    Err(failure) if failure.retryable && failures < MODEL_RETRIES => {
                        failures += 1;
                        emit(ctx, session_id, vec![session_error(&failure, "retrying")]).await?;
                        tokio::time::sleep(model.backoff * 2u32.pow(failures - 1)).await;
                    }
                    Err(failure) => {
                        let retry = if failure.retryable {
                            "exhausted"
                        } else {
                            "terminal"
                        };
                        emit(ctx,
                            session_id,
                            vec![
                                json!({"type": "span.model_request_end", "model_request_start_id": start_id, "is_error": true,
                                       "model_usage": turn::model_usage(&Value::Null)}),
                                session_error(&failure, retry),
                                json!({"type": "session.status_idle", "stop_reason": {"type": "retries_exhausted"}}),
                            ],
                        )
                        .await?;
                        failures = 0;
                    }
                }
            }
        }
    }
}

/// Drops the wake-ups of a Session that no longer exists.
async fn forget_wakeups(db: &sqlx::PgPool, session_id: &str) -> Result<(), ApiError> {
    sqlx::query("DELETE FROM outbox WHERE session_id = $1")
        .bind(session_id)
        .execute(db)
        .await?;
    Ok(())
}

async fn ensure_activation(
    db: &mut sqlx::PgConnection,
    ttl_seconds: i64,
    environment_id: &str,
    session_id: &str,
) -> Result<(), ApiError> {
    let now = time::now();
    let lease = Lease::new(Kind::Session, now, ttl_seconds);
    work::insert_activation(
        db,
        NewWork {
            id: &ids::new_id("work"),
            environment_id,
            session_id: Some(session_id),
            metadata: &BTreeMap::new(),
            lease: &lease,
            created_at: now,
        },
    )
    .await?;
    Ok(())
}

fn session_error(failure: &ModelFailure, retry: &str) -> Value {
    json!({"type": "session.error", "error": {"type": failure.kind, "message": failure.message, "retry_status": {"type": retry}}})
}

async fn all_events(ctx: &ApiContext, session_id: &str) -> Result<Vec<Value>, ApiError> {
    let filter = EventFilter {
        types: Vec::new(),
        gt: None,
        gte: None,
        lt: None,
        lte: None,
        ascending: true,
    };
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = sessions::list_events(&ctx.db, session_id, &filter, after, 1000).await?;
        let full = page.len() == 1000;
        after = page.last().map(|r| r.seq);
        out.extend(page.into_iter().map(|r| r.body));
        if !full {
            return Ok(out);
        }
    }
}

/// The reply's events, its `span.model_request_end` and the idle status commit
/// together; tool calls for the worker also make sure the Session has live Work.
async fn commit_reply(
    ctx: &ApiContext,
    session_id: &str,
    start_id: &str,
    agent: &Value,
    reply: &Value,
) -> Result<(), ApiError> {
    let tools = AgentTools::from_snapshot(agent);
    let mut events = turn::reply_events(reply, &tools);
    events.push(json!({"type": "span.model_request_end", "model_request_start_id": start_id, "is_error": false,
                       "model_usage": turn::model_usage(reply)}));
    let maps = events
        .into_iter()
        .filter_map(|e| e.as_object().cloned())
        .collect();
    let mut tx = ctx.db.begin().await?;
    let mut session = sessions::lock(&mut tx, session_id)
        .await?
        .ok_or_else(|| ApiError::not_found("session vanished"))?;
    // Terminated meanwhile (Fail) closes the log; and a reply already stored for
    // this request (another step got there after a lost lock) is stored once only.
    let already: Option<(i32,)> = sqlx::query_as(
        "SELECT 1 FROM session_events WHERE session_id = $1 AND type = 'span.model_request_end'
           AND body->>'model_request_start_id' = $2 LIMIT 1",
    )
    .bind(session_id)
    .bind(start_id)
    .fetch_optional(&mut *tx)
    .await?;
    if session.status() == crate::session_rules::Status::Terminated || already.is_some() {
        return Ok(());
    }
    let now = time::now();
    let mut stored = sessions::append(&mut tx, &mut session, maps, false, now).await?;
    let needs_action: Vec<String> = stored
        .iter()
        .map(|e| &e.body)
        .filter(|e| {
            (e["type"] == "agent.tool_use" && e["evaluated_permission"] != "deny")
                || e["type"] == "agent.custom_tool_use"
        })
        .filter_map(|e| e["id"].as_str().map(str::to_string))
        .collect();
    let worker_calls = stored
        .iter()
        .any(|e| e.body["type"] == "agent.tool_use" && e.body["evaluated_permission"] != "deny");
    if worker_calls {
        let lease = Lease::new(Kind::Session, now, ctx.settings.default_ttl_seconds);
        work::insert_activation(
            &mut *tx,
            NewWork {
                id: &ids::new_id("work"),
                environment_id: &session.environment_id,
                session_id: Some(session_id),
                metadata: &BTreeMap::new(),
                lease: &lease,
                created_at: now,
            },
        )
        .await?;
    }
    let denied_only =
        needs_action.is_empty() && stored.iter().any(|e| e.body["type"] == "agent.tool_use");
    if !denied_only {
        let stop = if needs_action.is_empty() {
            json!({"type": "end_turn"})
        } else {
            json!({"type": "requires_action", "event_ids": needs_action})
        };
        let idle = json!({"type": "session.status_idle", "stop_reason": stop});
        let idle = sessions::append(
            &mut tx,
            &mut session,
            vec![idle.as_object().cloned().unwrap_or_default()],
            false,
            now,
        )
        .await?;
        stored.extend(idle);
    }
    tx.commit().await?;
    ctx.committed(session_id, &stored, false);
    Ok(())
}
