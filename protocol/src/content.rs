//! Content blocks of Session events (wire contract §7.3): what a user
//! message, a tool result or an agent message carries.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One content block. Which kinds an event accepts is the api's check
/// (`user.message` takes no search results, `system.message` only text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Image {
        source: ImageSource,
    },
    Document {
        source: DocumentSource,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<String>,
    },
    SearchResult {
        source: String,
        title: String,
        content: Vec<TextBlock>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        citations: Option<Value>,
    },
    Redacted,
}

/// The kinds of [`ContentBlock`], for saying which an event accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Text,
    Image,
    Document,
    SearchResult,
    Redacted,
}

impl BlockKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockKind::Text => "text",
            BlockKind::Image => "image",
            BlockKind::Document => "document",
            BlockKind::SearchResult => "search_result",
            BlockKind::Redacted => "redacted",
        }
    }
}

impl ContentBlock {
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
    }

    pub fn kind(&self) -> BlockKind {
        match self {
            ContentBlock::Text { .. } => BlockKind::Text,
            ContentBlock::Image { .. } => BlockKind::Image,
            ContentBlock::Document { .. } => BlockKind::Document,
            ContentBlock::SearchResult { .. } => BlockKind::SearchResult,
            ContentBlock::Redacted => BlockKind::Redacted,
        }
    }

    /// The text of a text block.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentBlock::Text { text } => Some(text),
            _ => None,
        }
    }
}

/// A text-only block (inside search results).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextBlock {
    Text { text: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 { data: String, media_type: String },
    Url { url: String },
    File { file_id: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DocumentSource {
    Base64 {
        data: String,
        media_type: String,
    },
    Text {
        data: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
    },
    Url {
        url: String,
    },
    File {
        file_id: String,
    },
}
