//! Environments as other operations need them: found in the caller's
//! workspace, and deleted only when no Session runs in them.

use crate::error::{ApiError, ApiResult};
use crate::store::environments::{self, EnvironmentRow};
use crate::store::keys::KeyRow;
use mango_protocol::ErrorCode;
use sqlx::PgConnection;

pub fn not_found(env: &str) -> ApiError {
    ApiError::not_found(format!("environment {env} not found")).code(ErrorCode::EnvironmentNotFound)
}

/// The Environment `env` of the key's workspace.
pub async fn find_environment(
    conn: &mut PgConnection,
    key: &KeyRow,
    env: &str,
) -> ApiResult<EnvironmentRow> {
    environments::find(&mut *conn, &key.workspace_id, env)
        .await?
        .ok_or_else(|| not_found(env))
}

/// Deletes an Environment with its Work and Environment keys; one that
/// Sessions still belong to is 409 (delete or move them first).
pub async fn delete(conn: &mut PgConnection, workspace_id: &str, env: &str) -> ApiResult<()> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    if !environments::lock(&mut tx, workspace_id, env).await? {
        return Err(not_found(env));
    }
    let sessions = environments::session_count(&mut *tx, env).await?;
    if sessions > 0 {
        return Err(ApiError::conflict(format!(
            "environment {env} has {sessions} Session(s); delete them before the Environment"
        ))
        .code(ErrorCode::EnvironmentInUse)
        .final_answer());
    }
    environments::delete(&mut *tx, workspace_id, env).await?;
    tx.commit().await?;
    Ok(())
}
