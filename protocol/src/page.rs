use serde::{Deserialize, Serialize};

/// The SDK's `PageCursor`: follow `next_page` until it is null.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Page<T> {
    pub data: Vec<T>,
    pub next_page: Option<String>,
}
