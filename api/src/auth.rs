//! Who is calling. Every credential arrives as `Authorization: Bearer …`
//! (Workspace keys also as `x-api-key`); its prefix says which table to ask.
//! Invalid or revoked credentials are 401; valid ones outside their scope 403.

use crate::context::ApiContext;
use crate::error::{ApiError, ApiResult};
use crate::ids;
use crate::lease::TokenUse;
use crate::store::keys::{self, KeyRow};
use crate::store::sessions::{self, SessionRow};
use crate::store::work::{self, WorkRow};
use axum::http::HeaderMap;
use mango_protocol::{time, ErrorCode};
use sqlx::PgConnection;

pub enum Principal {
    Workspace(KeyRow),
    Environment(KeyRow),
    /// A Work item's sessions token; the row is its current claim.
    Token(Box<WorkRow>),
}

fn presented(headers: &HeaderMap) -> ApiResult<String> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| ApiError::unauthenticated("Authorization header is not valid text"))?;
        let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(ApiError::unauthenticated(
                "Authorization must be \"Bearer <credential>\"",
            ));
        }
        return Ok(token.trim().to_string());
    }
    if let Some(value) = headers.get("x-api-key") {
        let key = value
            .to_str()
            .map_err(|_| ApiError::unauthenticated("x-api-key is not valid text"))?
            .trim();
        if !key.starts_with(ids::WORKSPACE_KEY_PREFIX) {
            return Err(ApiError::unauthenticated(
                "x-api-key carries Workspace keys only; send other credentials as Authorization: Bearer",
            ));
        }
        return Ok(key.to_string());
    }
    Err(ApiError::unauthenticated(
        "missing credential: send Authorization: Bearer <key>",
    ))
}

pub async fn authenticate(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    headers: &HeaderMap,
) -> ApiResult<Principal> {
    let secret = presented(headers)?;
    let digest = ids::sha256(&secret);
    if secret.starts_with(ids::SESSIONS_TOKEN_PREFIX) {
        return match work::find_by_token(&mut *conn, &digest).await? {
            Some(row) => Ok(Principal::Token(Box::new(row))),
            None => Err(ApiError::unauthenticated(
                "invalid sessions token: it was never issued, or a newer claim replaced it",
            )),
        };
    }
    if !(secret.starts_with(ids::WORKSPACE_KEY_PREFIX)
        || secret.starts_with(ids::ENVIRONMENT_KEY_PREFIX))
    {
        return Err(ApiError::unauthenticated("invalid credential"));
    }
    let key = match keys::find_by_secret(&mut *conn, &digest).await? {
        Some(key) if key.revoked_at.is_none() => key,
        _ => return Err(ApiError::unauthenticated("invalid or revoked API key")),
    };
    if let Some(ws) = headers
        .get("anthropic-workspace-id")
        .and_then(|v| v.to_str().ok())
    {
        if ws != key.workspace_id {
            return Err(ApiError::forbidden(format!(
                "this key does not belong to workspace {ws}"
            )));
        }
    }
    let now = time::now();
    if key
        .last_used_at
        .is_none_or(|t| t < now - chrono::Duration::seconds(60))
    {
        let db = ctx.db.clone();
        let id = key.id.clone();
        tokio::spawn(async move {
            if let Err(err) = keys::touch(&db, &id, now).await {
                tracing::debug!(error = %err, "could not record key use");
            }
        });
    }
    Ok(if key.kind == "environment" {
        Principal::Environment(key)
    } else {
        Principal::Workspace(key)
    })
}

/// The usual start of an operator endpoint: one pooled connection for the
/// request, and the caller's Workspace key (anything else is refused).
pub async fn operator(
    ctx: &ApiContext,
    headers: &HeaderMap,
    what: &str,
) -> ApiResult<(sqlx::pool::PoolConnection<sqlx::Postgres>, KeyRow)> {
    let mut conn = ctx.db.acquire().await?;
    let key = authenticate(ctx, &mut conn, headers)
        .await?
        .workspace_key(what)?;
    Ok((conn, key))
}

/// The refusal for a credential used outside its scope: 403 when it is live,
/// 401 when a sessions token is no longer valid at all.
fn out_of_scope(principal: &Principal, what: &str) -> ApiError {
    if let Principal::Token(row) = principal {
        let now = time::now();
        if let Err(rejection) = row
            .lease()
            .reconcile(now)
            .admits_token(TokenUse::Session, now)
        {
            return ApiError::unauthenticated(rejection.message());
        }
    }
    let who = match principal {
        Principal::Workspace(_) => "a Workspace key",
        Principal::Environment(_) => "an Environment key",
        Principal::Token(_) => "a sessions token",
    };
    ApiError::forbidden(format!("{what} is not permitted with {who}"))
}

impl Principal {
    pub fn workspace_key(self, what: &str) -> ApiResult<KeyRow> {
        match self {
            Principal::Workspace(key) => Ok(key),
            other => Err(out_of_scope(&other, what)),
        }
    }

    /// An Environment key bound to `environment_id`.
    pub fn environment_key(self, environment_id: &str, what: &str) -> ApiResult<KeyRow> {
        match self {
            Principal::Environment(key)
                if key.environment_id.as_deref() == Some(environment_id) =>
            {
                Ok(key)
            }
            Principal::Environment(_) => Err(ApiError::forbidden(format!(
                "{what}: this Environment key is bound to another Environment"
            ))),
            other => Err(out_of_scope(&other, what)),
        }
    }

    /// The sessions token of exactly this Work item.
    pub fn token_for(self, environment_id: &str, work_id: &str, what: &str) -> ApiResult<WorkRow> {
        match self {
            Principal::Token(row) if row.id == work_id && row.environment_id == environment_id => {
                Ok(*row)
            }
            Principal::Token(row) => {
                let p = Principal::Token(row);
                match out_of_scope(&p, what) {
                    e if e.status == axum::http::StatusCode::UNAUTHORIZED => Err(e),
                    _ => Err(ApiError::forbidden(format!(
                        "{what}: this sessions token belongs to another Work item"
                    ))),
                }
            }
            other => Err(out_of_scope(&other, what)),
        }
    }

    pub fn describe(&self) -> &'static str {
        match self {
            Principal::Workspace(_) => "workspace_key",
            Principal::Environment(_) => "environment_key",
            Principal::Token(_) => "sessions_token",
        }
    }
}

/// How long Poll and Ack may reuse an Environment key lookup.
const KEY_LOOKUP_REUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// Poll and Ack's authentication: an Environment key bound to `environment_id`.
///
/// The lookup is reused for a moment because it only *identifies* the key:
/// whether it may still claim or acknowledge is decided inside the claim and
/// Ack statements themselves, which share-lock the key row and find nothing
/// once it is revoked (the handler then answers 401). Other endpoints always
/// look keys up afresh.
pub async fn environment_key_for_lease(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    headers: &HeaderMap,
    environment_id: &str,
    what: &str,
) -> ApiResult<KeyRow> {
    let secret = presented(headers)?;
    if secret.starts_with(ids::ENVIRONMENT_KEY_PREFIX)
        && headers.get("anthropic-workspace-id").is_none()
    {
        let digest = ids::sha256(&secret);
        if let Some(key) = ctx.recent_key(&digest, KEY_LOOKUP_REUSE) {
            return Principal::Environment(key).environment_key(environment_id, what);
        }
        let principal = authenticate(ctx, conn, headers).await?;
        if let Principal::Environment(key) = &principal {
            ctx.remember_key(digest, key.clone());
        }
        return principal.environment_key(environment_id, what);
    }
    authenticate(ctx, conn, headers)
        .await?
        .environment_key(environment_id, what)
}

/// How long a worker's tool result may reuse a sessions token lookup.
const CLAIM_LOOKUP_REUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// The claim behind the request's sessions token as this process saw it less
/// than two seconds ago, for the fenced result path only
/// (`admission::admit_worker_result`): its write goes through only if the
/// Work row still has the version seen here, so a claim that changed since
/// (stopped, reclaimed, even heartbeated) writes nothing, and the request
/// takes the full path, which authenticates afresh.
pub fn recent_claim(ctx: &ApiContext, headers: &HeaderMap) -> Option<WorkRow> {
    let secret = presented(headers).ok()?;
    if !secret.starts_with(ids::SESSIONS_TOKEN_PREFIX) {
        return None;
    }
    ctx.recent_claim(&ids::sha256(&secret), CLAIM_LOOKUP_REUSE)
}

/// Remembers the claim a sessions token was just authenticated as.
pub fn remember_claim(ctx: &ApiContext, headers: &HeaderMap, row: &WorkRow) {
    if let Ok(secret) = presented(headers) {
        ctx.remember_claim(ids::sha256(&secret), row.clone());
    }
}

/// Who may touch a Session, and as what.
pub enum SessionAccess {
    /// A Workspace key of the Session's workspace.
    Operator { key_id: String },
    /// The sessions token of this Session's Work; `digest` names the claim.
    Worker { digest: Vec<u8> },
}

fn session_not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("session {id} not found")).code(ErrorCode::SessionNotFound)
}

/// Resolves the caller against Session `id`: a Workspace key of its
/// workspace, or a live sessions token whose Work serves this Session;
/// Environment keys are refused.
pub async fn session_access(
    ctx: &ApiContext,
    conn: &mut PgConnection,
    headers: &HeaderMap,
    id: &str,
    what: &str,
) -> ApiResult<(SessionRow, SessionAccess)> {
    match authenticate(ctx, conn, headers).await? {
        Principal::Workspace(key) => {
            let session = sessions::find(&mut *conn, Some(&key.workspace_id), id)
                .await?
                .ok_or_else(|| session_not_found(id))?;
            Ok((session, SessionAccess::Operator { key_id: key.id }))
        }
        Principal::Token(row) => {
            worker_may_use(&row, id, what)?;
            let session = sessions::find(&mut *conn, None, id)
                .await?
                .ok_or_else(|| session_not_found(id))?;
            let digest = row.token_sha256.clone().unwrap_or_default();
            Ok((session, SessionAccess::Worker { digest }))
        }
        Principal::Environment(_) => Err(ApiError::forbidden(format!(
            "{what} is not permitted with an Environment key"
        ))),
    }
}

/// A sessions token may use its own Session while its lease lives.
pub fn worker_may_use(work: &WorkRow, session_id: &str, what: &str) -> ApiResult<()> {
    let now = time::now();
    work.lease()
        .reconcile(now)
        .admits_token(TokenUse::Session, now)
        .map_err(|r| ApiError::unauthenticated(r.message()))?;
    if work.session_id.as_deref() != Some(session_id) {
        return Err(ApiError::forbidden(format!(
            "{what}: this sessions token belongs to another Session"
        )));
    }
    Ok(())
}

/// Whether an open stream may go on: the Workspace key is not revoked, or
/// the sessions token's claim still admits it. A database hiccup is not
/// proof of invalidation; the next check decides.
pub async fn still_valid(ctx: &ApiContext, access: &SessionAccess, session_id: &str) -> bool {
    match access {
        SessionAccess::Operator { key_id } => keys::is_live(&ctx.db, key_id).await.unwrap_or(true),
        SessionAccess::Worker { digest } => {
            let now = time::now();
            match work::find_by_token(&ctx.db, digest).await {
                Ok(Some(row)) => {
                    row.session_id.as_deref() == Some(session_id)
                        && row
                            .lease()
                            .reconcile(now)
                            .admits_token(TokenUse::Session, now)
                            .is_ok()
                }
                Ok(None) => false,
                Err(_) => true,
            }
        }
    }
}
