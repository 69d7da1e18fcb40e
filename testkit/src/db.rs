//! Direct looks at the api's database: rows a Session left, row locks held
//! and waited for.

use crate::TestApp;

impl TestApp {
    /// Session `session` deleted in a transaction left open: it holds the
    /// Session's row (and its log's) until committed.
    pub async fn delete_session_uncommitted(
        &self,
        session: &str,
    ) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut deleting = self.db.begin().await.unwrap();
        assert!(
            mango_api::store::sessions::delete(&mut *deleting, "wrkspc_default", session)
                .await
                .unwrap()
        );
        deleting
    }

    /// Lets `racing`, a task that will wait for a row `holder` locks, through:
    /// waits until it is blocked, commits `holder`, and returns what `racing`
    /// returned (within 5 s; `what` names it in the failure).
    pub async fn commit_past<T>(
        &self,
        holder: sqlx::Transaction<'static, sqlx::Postgres>,
        racing: tokio::task::JoinHandle<T>,
        what: &str,
    ) -> T {
        self.until_a_lock_wait().await;
        holder.commit().await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), racing)
            .await
            .unwrap_or_else(|_| panic!("{what} finishes once the row is free"))
            .unwrap()
    }

    /// Until some statement of this database waits for a row lock.
    pub async fn until_a_lock_wait(&self) {
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&self.db)
                .await
                .unwrap();
                if waiting > 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a statement waits for a row lock");
    }

    /// Count of rows in `table` for `session` (`session_id` column).
    pub async fn count_for(&self, table: &str, session: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE session_id = $1"
        ))
        .bind(session)
        .fetch_one(&self.db)
        .await
        .unwrap()
    }

    /// (event rows, Work rows, outbox rows) of a Session.
    pub async fn session_counts(&self, session: &str) -> (i64, i64, i64) {
        (
            self.count_for("session_events", session).await,
            self.count_for("work", session).await,
            self.count_for("outbox", session).await,
        )
    }

    /// `(id, state)` of every Work row of a Session, oldest first.
    pub async fn session_work(&self, session: &str) -> Vec<(String, String)> {
        sqlx::query_as("SELECT id, state FROM work WHERE session_id = $1 ORDER BY created_at, id")
            .bind(session)
            .fetch_all(&self.db)
            .await
            .unwrap()
    }
}
